"""Guards that no other test would notice losing: each test here fails if one line of the code it
names is changed the way a plausible slip would change it (the cases are written out, never read
from the code under test)."""

import os
import signal
import subprocess
import sys

import pytest

from annotated.checkpoints import checkpoint_paths
from annotated.errors import Terminated
from annotated.files import atomic_path, lock_holder, lock_out_dir
from annotated.training.distributed import StopRequests


def test_the_data_reaches_the_disk_before_the_name_points_at_it(tmp_path, monkeypatch):
    """atomic_path: fsync of the temporary file, then the rename, then fsync of the folder."""
    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(src, dst):
        events.append(("replace", str(src)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    target = tmp_path / "out.txt"
    with atomic_path(target) as tmp:
        tmp.write_text("whole\n")
    tmp_name = str(tmp)
    assert events == [("fsync", tmp_name), ("replace", tmp_name), ("fsync", str(tmp_path))]
    assert target.read_text() == "whole\n"


def test_a_write_nested_inside_another_of_the_same_path_gets_its_own_temporary(tmp_path):
    target = tmp_path / "record.json"
    with atomic_path(target) as outer:
        with atomic_path(target) as inner:
            assert inner != outer and inner.parent == outer.parent == tmp_path
            inner.write_text("inner\n")
        outer.write_text("outer\n")
    assert target.read_text() == "outer\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["record.json"]


def test_a_pid_left_in_the_lock_file_is_no_trainer(tmp_path):
    """lock_holder asks the lock, not the text: a finished run leaves "pid N" behind."""
    (tmp_path / "trainer.lock").write_text(f"pid {os.getpid()}")  # even a live pid
    assert lock_holder(tmp_path) is None
    held = lock_out_dir(tmp_path / "live")
    try:
        child = [sys.executable, "-c", "from pathlib import Path; from annotated.files import "
                 f"lock_holder; print(lock_holder(Path({str(tmp_path / 'live')!r})))"]  # fmt: skip
        seen = subprocess.run(child, capture_output=True, text=True, check=True).stdout.strip()
        assert seen == f"pid {os.getpid()}"
    finally:
        held.close()
    assert lock_holder(tmp_path / "live") is None


def test_stop_requests_note_sigterm_and_sigusr1_then_give_the_handlers_back():
    def mine(signum, frame):
        pass

    before = {s: signal.signal(s, mine) for s in (signal.SIGTERM, signal.SIGUSR1)}
    try:
        with StopRequests() as stop:
            os.kill(os.getpid(), signal.SIGUSR1)  # SLURM's --signal, ahead of the time limit
            with pytest.raises(Terminated):  # nothing trained yet: stop at once
                os.kill(os.getpid(), signal.SIGTERM)
            stop.saving = True  # the steps have begun: note it, save a step, then stop
            os.kill(os.getpid(), signal.SIGTERM)
        assert stop.received == ["SIGUSR1", "SIGTERM"]
        assert signal.getsignal(signal.SIGTERM) is mine
        assert signal.getsignal(signal.SIGUSR1) is mine
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


@pytest.mark.parametrize(
    "name", ["ckpt_5.pt", "ckpt_000000099.pt", "ckpt_0000001.pt", "ckpt_00000009.pt.tmp",
             "ckpt_best.pt", "ckpt_-0000001.pt", "ckpt_0000000a.pt"],
)  # fmt: skip
def test_only_the_trainers_eight_digit_names_are_checkpoints(tmp_path, name):
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    for kept in ("ckpt_00000002.pt", "ckpt_00000010.pt", name):
        (folder / kept).write_bytes(b"")
    assert [p.name for p in checkpoint_paths(tmp_path)] == ["ckpt_00000002.pt", "ckpt_00000010.pt"]


def test_the_papers_bleu_replaces_unicode_punctuation_in_the_hypotheses_only():
    """get_ende_bleu.sh normalises the system's output and not the reference: a hypothesis equal
    to its reference scores 100 without typographic quotes and below 100 with them."""
    from annotated.bleu_scores import tokenized_bleu

    plain = ["Er sagte , dass das Haus sehr alt und schön ist und dass es bleibt ."]
    quoted = ["Er sagte „ das Haus ist sehr alt und schön “ und dass es so bleiben wird ."]
    assert tokenized_bleu(plain, plain)[0] == pytest.approx(100.0)
    assert tokenized_bleu(quoted, quoted)[0] < 90.0


@pytest.mark.parametrize(
    "brk", ["\r", "\v", "\f", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"]
)
def test_every_character_a_reader_takes_for_a_line_break_becomes_a_space(brk):
    from annotated.data.cleaning import one_line

    assert one_line(f"ein{brk}Haus") == "ein Haus"
    assert len(f"ein{brk}Haus".splitlines()) == 2  # why: Python's own readers split there


def test_cleaning_keeps_both_sides_on_one_line_each(tmp_path):
    """A line break inside the target (German) side, as inside the source: the cleaned files
    stay line-aligned and the break becomes a space on either side."""
    from annotated.data.cleaning import _clean_one

    pairs = [("a house", "ein\u2028Haus"), ("two\u2029dogs", "zwei Hunde"), ("a cat", "eine Katze")]
    raw = (tmp_path / "raw.en", tmp_path / "raw.de")
    for k, path in enumerate(raw):
        path.write_bytes("".join(p[k] + "\n" for p in pairs).encode("utf-8"))
    out = (tmp_path / "clean.en", tmp_path / "clean.de")
    _clean_one(raw, out, set(), "test")
    en = out[0].read_text(encoding="utf-8").split("\n")
    de = out[1].read_text(encoding="utf-8").split("\n")
    assert en[:-1] == ["a house", "two dogs", "a cat"]
    assert de[:-1] == ["ein Haus", "zwei Hunde", "eine Katze"]


@pytest.mark.parametrize("line", ["a\tb\tc", "a\t\tb", "\ta\tb"])
def test_a_tsv_line_with_more_than_one_tab_is_refused(tmp_path, line):
    from annotated.data.parallel_corpus import split_tsv
    from annotated.errors import DataError

    (tmp_path / "p.tsv").write_text(f"x\ty\n{line}\n")
    with pytest.raises(DataError, match="line 2: 2 tabs"):
        split_tsv(tmp_path / "p.tsv", tmp_path / "split", ("en", "de"))


def test_the_sampler_keeps_pairs_exactly_max_len_long_and_drops_longer_ones():
    from annotated.batching import BucketSampler

    lengths = [(5, 5), (10, 3), (3, 10), (11, 2), (2, 11)]
    sampler = BucketSampler(lengths, 100, 100, max_len=10)
    kept = sorted(int(i) for b in sampler.batches(0) for i in b)
    assert kept == [0, 1, 2] and sampler.skipped == 2


def test_the_samplers_batches_come_in_a_new_random_order_each_epoch():
    """Not shortest first, and not the same order twice: the batches are shuffled per epoch."""
    from annotated.batching import BucketSampler

    lengths = [(n, n) for n in range(1, 65)]  # 64 lengths, 16 tokens a batch: many batches
    sampler = BucketSampler(lengths, 16, 64, seed=0)
    orders = [[int(b[0]) for b in sampler.batches(epoch)] for epoch in range(3)]
    assert all(order != sorted(order) for order in orders)  # not shortest first
    assert orders[0] != orders[1] != orders[2]
    assert [sorted(o) for o in orders] == [sorted(orders[0])] * 3  # the same batches' firsts


def _agree(rank: int, world: int, init: str, signalled: list[int], answers) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    stop = StopRequests()
    if rank in signalled:
        stop.received.append("SIGTERM")
    answers[rank] = stop.agreed(world, "cpu")
    dist.destroy_process_group()


@pytest.mark.parametrize("signalled", [[1], []])
def test_one_signalled_process_stops_them_all(tmp_path, signalled):
    """SLURM may signal one task of a job: every process must agree to stop at the same step,
    whichever of them was asked, and none when none was."""
    import torch.multiprocessing as mp

    answers = mp.Manager().dict()
    init = f"file://{tmp_path / 'rendezvous'}"
    mp.spawn(_agree, args=(2, init, signalled, answers), nprocs=2, join=True)
    assert dict(answers) == {0: bool(signalled), 1: bool(signalled)}


def test_a_changed_accumulation_is_honoured_when_the_processes_are_as_before(tmp_path, capsys):
    """batch.accum changed on --resume with the same number of processes: the new value holds.
    With another number of processes, the checkpoint's micro-batches per step are kept."""
    from annotated.training.resuming import resumed_micro_batches

    path = tmp_path / "run" / "checkpoints" / "ckpt_00000004.pt"
    saved = {"data": {"micro_batches_per_step": 2}, "world_size": 1}
    assert resumed_micro_batches(saved, path, 3, rank=0, world=1) == 3  # the user's new accum
    assert capsys.readouterr().err == ""
    saved = {"data": {"micro_batches_per_step": 4}, "world_size": 1}
    assert resumed_micro_batches(saved, path, 2, rank=0, world=2) == 4  # 2 processes x 2
    assert "each now takes 2 micro-batches a step" in capsys.readouterr().err


@pytest.mark.parametrize(
    "src, tgt, rule",
    [
        ("a b", "c d e f", None),  # twice as many words: kept
        ("a b", "c d e f g", "ratio over 2"),  # more than twice
        ("a b c d e", "f g", "ratio over 2"),  # either side
        ("a " * 250, "b " * 200, None),  # 250 words: kept
        ("a " * 251, "b " * 200, "over 250 words"),
        ("", "b", "empty side"),
    ],
)
def test_the_cleaning_rules_at_their_edges(src, tgt, rule):
    from annotated.data.cleaning import rejection

    assert rejection(src.strip(), tgt.strip()) == rule
