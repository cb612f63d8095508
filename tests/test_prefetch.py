"""The background data path (chapter 21): batches built ahead in a thread, in order, with errors
handed to the training loop and the waiting time counted."""

import json
import threading
import time

import pytest
import torch

from annotated.batching import make_batch
from annotated.errors import ExpectedError
from annotated.training.prefetch import Prefetcher
from annotated.training.registry import build_config
from annotated.training.trainer import train


def make(step):
    g = torch.Generator().manual_seed(step)
    return [
        make_batch(
            [torch.randint(3, 20, (4 + j,), generator=g).tolist() for _ in range(3)],
            [torch.randint(3, 20, (5 + j,), generator=g).tolist() for _ in range(3)],
        )
        for j in range(2)
    ]


def test_batches_come_in_order_and_equal_the_synchronous_ones():
    prefetch = Prefetcher(make, 3, 9, "cpu", background=True)
    try:
        for step in range(3, 9):
            got, want = prefetch.get(step), make(step)
            assert len(got) == len(want) == 2
            for a, b in zip(got, want):
                assert torch.equal(a.src, b.src) and torch.equal(a.tgt, b.tgt)
                assert torch.equal(a.tgt_mask, b.tgt_mask) and a.ntokens == b.ntokens
    finally:
        prefetch.close()
    assert prefetch.waited >= 0
    assert not prefetch._thread.is_alive()


def test_a_step_sent_ahead_is_the_next_one_asked_for():
    """The thread is made to be ahead before every `get`, so the step already sent to the
    device is used every time: no step skipped, none given twice."""
    prefetch = Prefetcher(make, 0, 8, "cpu", background=True, depth=2)
    try:
        for step in range(8):
            need = 2 if step == 0 else int(step < 7)  # this step (at first) and the next one
            deadline = time.time() + 30
            while prefetch._queue.qsize() < need and time.time() < deadline:
                time.sleep(0.01)  # the thread is ahead before `get` is called
            got, want = prefetch.get(step), make(step)
            assert all(torch.equal(a.src, b.src) for a, b in zip(got, want)), step
            if step < 7:
                assert prefetch._ahead is not None and prefetch._ahead[0] == step + 1
    finally:
        prefetch.close()


def test_the_loop_waits_only_when_the_thread_is_slower():
    def slow(step):
        time.sleep(0.05)
        return make(step)

    prefetch = Prefetcher(slow, 0, 6, "cpu", depth=2, background=True)
    for step in range(6):
        prefetch.get(step)  # nothing to compute between steps: the loop waits for every build
    prefetch.close()
    assert 0.2 < prefetch.waited < 2.0

    prefetch = Prefetcher(slow, 0, 4, "cpu", depth=4, background=True)
    time.sleep(0.5)  # a long step: the thread builds everything meanwhile
    for step in range(4):
        prefetch.get(step)
    prefetch.close()
    assert prefetch.waited < 0.04


def test_an_error_in_the_thread_is_raised_by_get_with_its_message():
    def broken(step):
        if step == 2:
            raise ExpectedError("the data file is corrupt: rebuild it")
        return make(step)

    prefetch = Prefetcher(broken, 0, 5, "cpu", background=True)
    prefetch.get(0)
    prefetch.get(1)
    with pytest.raises(ExpectedError, match="corrupt: rebuild it"):
        prefetch.get(2)
    prefetch.close()


def test_close_stops_a_thread_blocked_on_a_full_queue():
    prefetch = Prefetcher(make, 0, 1000, "cpu", depth=1, background=True)
    time.sleep(0.2)  # the queue is full and the thread waits to put the next step
    start = time.perf_counter()
    prefetch.close()
    assert time.perf_counter() - start < 2.0
    assert not prefetch._thread.is_alive()
    assert "batches" not in [t.name for t in threading.enumerate()]


def test_on_a_cpu_the_batches_are_built_in_the_loop_by_default():
    calls = []

    def counted(step):
        calls.append(step)
        return make(step)

    prefetch = Prefetcher(counted, 0, 3, "cpu")
    assert not prefetch.background and not prefetch._thread.is_alive()
    time.sleep(0.1)
    assert calls == []  # nothing is built ahead
    for step in range(3):
        (got, _) = prefetch.get(step)
        assert torch.equal(got.src, make(step)[0].src)
    assert calls == [0, 1, 2] and prefetch.waited > 0
    prefetch.close()
    with pytest.raises(ExpectedError, match="corrupt"):
        Prefetcher(lambda step: (_ for _ in ()).throw(ExpectedError("corrupt")), 0, 1, "cpu").get(0)


def test_the_trainer_logs_the_fraction_of_time_spent_waiting_for_data(tmp_path):
    cfg = build_config("copy", ["max_steps=6", "log_every=2", "checkpoint_every=6"])
    summary = train(cfg, tmp_path, progress=False)
    lines = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert [r["step"] for r in lines] == [2, 4, 6]
    assert all(0.0 <= r["data_wait"] < 1.0 for r in lines)
    assert 0.0 <= summary["data_wait_s"] < summary["seconds"]
    assert "batches" not in [t.name for t in threading.enumerate()]  # the thread has ended


def test_the_pinning_thread_pins_every_tensor_of_every_batch(monkeypatch):
    """On a GPU the thread pins each batch (Batch.pin_memory) before the copy; a CPU build of
    torch cannot pin, so pinning is replaced by a marked copy, and the thread's own code path
    (pin=True, as on CUDA) runs unchanged."""
    pinned = []

    def fake_pin(t):
        out = t.clone()
        pinned.append(out)
        return out

    monkeypatch.setattr(torch.Tensor, "pin_memory", fake_pin)
    prefetch = Prefetcher(make, 0, 2, "cpu", background=False)
    prefetch._work(make, 0, 2, True)  # the thread's body, as it runs on CUDA
    for step in range(2):
        got, want = prefetch._queue.get_nowait(), make(step)
        assert got[0] == step
        for a, b in zip(got[1], want):
            for name in ("src", "src_mask", "tgt", "tgt_y", "tgt_mask"):
                assert any(getattr(a, name) is t for t in pinned), name
                assert torch.equal(getattr(a, name), getattr(b, name))
            assert a.ntokens == b.ntokens
