"""Faults of a cluster's life, each reproduced: a second job on a folder in use, a resume under
another number of processes, links planted in the run folder, a run's clock across resumes,
a partly broken state and a disk too short for the next checkpoint."""

import contextlib
import dataclasses
import json
import os
import random
import resource
import signal
import subprocess
import time
from collections import namedtuple
from pathlib import Path

import pytest
import torch

from annotated.errors import ConfigError, DataError, TrainingError
from annotated.files import lock_out_dir
from annotated.training import saving
from annotated.training.config import apply_overrides
from annotated.training.registry import CONFIGS, build_config
from annotated.training.resuming import all_finite
from annotated.training.run_folder import check_run_folder
from annotated.training.saving import save_checkpoint
from annotated.training.trainer import train

from helpers import (
    TINY,
    TORCHRUN_2,
    checkpoint_names,
    final_weights,
    run_trainer,
    sets,
    tiny_copy,
    tiny_refused,
)

NO_DROPOUT = sets("model.dropout=0")


def test_a_second_job_on_a_folder_in_use_changes_nothing_there(tmp_path):
    """Every process of a refused job stops before it touches the folder: the first job's
    checkpoint in the making (a temporary file) survives."""
    out = tmp_path / "run"
    held = lock_out_dir(out)  # the first job
    writing = out / "checkpoints" / ".ckpt_00000005.pt.123-0123abcd.tmp"
    writing.parent.mkdir()
    writing.write_bytes(b"half of a checkpoint")
    try:
        r = run_trainer(
            "--config", "copy", *TINY, *sets("max_steps=2"), "--out", str(out),
            launcher=TORCHRUN_2, check=False, CUDA_VISIBLE_DEVICES="",
        )  # fmt: skip
    finally:
        held.close()
    assert r.returncode != 0 and "in use by another trainer" in r.stderr, r.stderr[-2000:]
    assert r.stderr.count("in use by another trainer") == 2  # each process was told, and said so
    assert writing.read_bytes() == b"half of a checkpoint"


def test_only_the_folders_owner_removes_what_a_killed_run_left(tmp_path):
    left = tmp_path / "checkpoints" / ".ckpt_00000005.pt.123-0123abcd.tmp"
    left.parent.mkdir()
    left.write_bytes(b"from a killed run")
    cfg = build_config("copy")
    assert check_run_folder(tmp_path, cfg, resume=False, owner=False) is None
    assert left.exists()  # a process without the lock touches nothing
    assert check_run_folder(tmp_path, cfg, resume=False, owner=True) is None
    assert not left.exists()


def test_a_resume_under_another_number_of_processes_keeps_the_batch(tmp_path):
    """Two processes, then one: the step keeps its two micro-batches (one process takes both),
    so the run continues as the two-process run would have, up to rounding."""
    args = ["--config", "copy", *TINY, *NO_DROPOUT, *sets("checkpoint_every=3")]
    env = dict(launcher=TORCHRUN_2, CUDA_VISIBLE_DEVICES="")
    run_trainer(*args, *sets("max_steps=3"), "--out", str(tmp_path / "moved"), **env)
    r = run_trainer(*args, *sets("max_steps=8"), "--out", str(tmp_path / "moved"), "--resume")
    assert "trained with 2 processes and resumes with 1" in r.stderr, r.stderr[-2000:]
    run_trainer(*args, *sets("max_steps=8"), "--out", str(tmp_path / "straight"), **env)
    a, b = final_weights(tmp_path / "straight"), final_weights(tmp_path / "moved")
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-5
    # the saved step holds two micro-batches again, as the run's record says
    state = torch.load(tmp_path / "moved/checkpoints/ckpt_00000008.pt", weights_only=True)
    assert state["data"]["micro_batches_per_step"] == 2 and state["world_size"] == 1


def test_a_resume_that_cannot_keep_the_batch_is_refused(tmp_path):
    out = tmp_path / "run"
    tiny_copy(out, *sets("max_steps=2", "batch.accum=3"))
    r = run_trainer(
        "--config", "copy", *TINY, *sets("max_steps=4", "batch.accum=3"), "--out", str(out),
        "--resume", launcher=TORCHRUN_2, check=False, CUDA_VISIBLE_DEVICES="",
    )  # fmt: skip
    assert r.returncode != 0 and "3 micro-batches per step, which 2 processes" in r.stderr
    assert checkpoint_names(out) == ["ckpt_00000002.pt"]


def test_links_planted_in_the_run_folder_are_refused_and_their_targets_kept(tmp_path):
    precious = tmp_path / "precious.txt"
    for name in ("trainer.lock", "metrics.jsonl"):
        precious.write_text("someone else's file\n")
        out = tmp_path / name.replace(".", "_")
        out.mkdir()
        (out / name).symlink_to(precious)
        message = tiny_refused(out, *sets("max_steps=2"))
        assert "is a symbolic link" in message and "Remove the link" in message, message
        assert precious.read_text() == "someone else's file\n"
        assert not (out / "checkpoints").exists() or not checkpoint_names(out)


def test_a_checkpoints_link_is_refused_before_anything_is_deleted_or_written_there(tmp_path):
    """checkpoints/ planted as a link (someone who can write the run folder): the trainer
    neither deletes the target's *.tmp files nor writes or prunes checkpoints there."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "theirs.tmp").write_text("someone's download in progress\n")
    for resume in ((), ("--resume",)):
        out = tmp_path / f"run{len(resume)}"
        out.mkdir()
        (out / "checkpoints").symlink_to(elsewhere, target_is_directory=True)
        message = tiny_refused(out, *sets("max_steps=2"), *resume)
        assert "checkpoints is a symbolic link" in message and "Remove the link" in message
        assert sorted(p.name for p in elsewhere.iterdir()) == ["theirs.tmp"]


def test_a_checkpoint_file_planted_as_a_link_is_refused(tmp_path):
    out = tmp_path / "run"
    tiny_copy(out, *sets("max_steps=2", "checkpoint_every=2"))
    outside = tmp_path / "outside.pt"
    (out / "checkpoints" / "ckpt_00000002.pt").rename(outside)
    (out / "checkpoints" / "ckpt_00000002.pt").symlink_to(outside)
    message = tiny_refused(out, *sets("max_steps=4"), "--resume")
    assert "ckpt_00000002.pt is a symbolic link" in message, message
    assert outside.exists() and (out / "checkpoints" / "ckpt_00000002.pt").is_symlink()


def test_a_metrics_line_that_is_json_but_no_record_is_a_message(tmp_path):
    from annotated.training.run_folder import read_metrics

    out = tmp_path / "run"
    tiny_copy(out, *sets("max_steps=2", "checkpoint_every=2"))
    log = out / "metrics.jsonl"
    good = log.read_text()
    not_records = [
        '{"note": "hello"}',
        "[1, 2]",
        '{"step": "3", "loss": 1.0, "elapsed_s": 1.0}',
        '{"step": 2.5, "loss": 1.0, "elapsed_s": 1.0}',
        '{"step": 2, "loss": null}',
    ]
    for line in not_records:
        log.write_text(good + line + "\n")
        with pytest.raises(TrainingError, match="line 3 is JSON but not a line of this trainer"):
            read_metrics(log)
    message = tiny_refused(out, *sets("max_steps=3"), "--resume")
    assert "line 3 is JSON but not a line of this trainer's log" in message, message
    assert log.read_text() == good + '{"step": 2, "loss": null}\n'  # left for the user to repair


def test_the_logged_time_counts_every_session_of_a_resumed_run(tmp_path):
    out = tmp_path / "run"
    tiny_copy(out, *sets("max_steps=6", "checkpoint_every=6"))
    first = torch.load(out / "checkpoints/ckpt_00000006.pt", weights_only=True)["seconds"]
    tiny_copy(out, *sets("max_steps=9", "checkpoint_every=6"), "--resume")
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    times = [line["elapsed_s"] for line in lines]
    assert [line["step"] for line in lines] == list(range(1, 10))
    assert times == sorted(times) and times[6] >= first, times
    last = torch.load(out / "checkpoints/ckpt_00000009.pt", weights_only=True)["seconds"]
    assert abs(times[-1] - last) < 1.0  # the log and the checkpoint agree on the run's time


def test_a_single_bad_number_in_one_tensor_is_never_checkpointed():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    assert all_finite(model)
    for value in (float("nan"), float("inf"), float("-inf")):
        for parameter in model.parameters():
            with torch.no_grad():
                saved = parameter.view(-1)[1].item()
                parameter.view(-1)[1] = value  # one number of one tensor
            assert not all_finite(model), (value, parameter.shape)
            with torch.no_grad():
                parameter.view(-1)[1] = saved


def test_a_short_disk_prunes_the_oldest_checkpoints_and_never_the_newest(tmp_path, monkeypatch):
    """With no room for the next checkpoint, the ones that its save would prune anyway go
    first, oldest first; the newest stays, and the message names it."""
    state = {"step": 0, "weights": torch.zeros(1000)}
    for step in (10, 20, 30, 40):
        save_checkpoint(tmp_path, {**state, "step": step}, keep_last=5)
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(saving.shutil, "disk_usage", lambda path: usage(1, 1, 0))
    monkeypatch.setattr(saving, "atomic_path", _full_disk)
    with pytest.raises(TrainingError, match="the last checkpoint, ckpt_00000040.pt, is intact"):
        save_checkpoint(tmp_path, {**state, "step": 50}, keep_last=2)
    assert checkpoint_names(tmp_path) == ["ckpt_00000040.pt"]
    monkeypatch.undo()
    save_checkpoint(tmp_path, {**state, "step": 50}, keep_last=2)
    assert checkpoint_names(tmp_path) == ["ckpt_00000040.pt", "ckpt_00000050.pt"]
    assert [p.name for p in (tmp_path / "checkpoints").iterdir() if p.suffix == ".tmp"] == []


def test_a_first_checkpoint_that_cannot_be_written_says_there_is_none(tmp_path, monkeypatch):
    monkeypatch.setattr(saving, "atomic_path", _full_disk)
    with pytest.raises(TrainingError, match="no checkpoint of this run exists yet"):
        save_checkpoint(tmp_path, {"step": 5}, keep_last=2)


def _full_disk(path):
    raise OSError(28, "No space left on device")


def test_a_checkpoint_folder_that_refuses_writes_is_not_called_a_full_disk(tmp_path, monkeypatch):
    """torch.save says only "cannot be opened": a folder that refuses new files is what the
    command line reports (its epilogue words an OSError), not a full disk."""
    monkeypatch.setattr(torch, "save", _cannot_open)
    denied = PermissionError(13, "Permission denied", str(tmp_path / "checkpoints"))
    monkeypatch.setattr(saving.tempfile, "TemporaryFile", lambda **kw: _raise(denied))
    with pytest.raises(PermissionError) as refused:
        save_checkpoint(tmp_path, {"step": 5}, keep_last=2)
    assert refused.value.filename == str(tmp_path / "checkpoints")
    monkeypatch.undo()
    monkeypatch.setattr(torch, "save", _cannot_open)  # a folder that takes files: the disk
    with pytest.raises(TrainingError, match="the disk is probably full"):
        save_checkpoint(tmp_path, {"step": 5}, keep_last=2)


def _cannot_open(state, path):
    raise RuntimeError(f"File {path} cannot be opened.")


def _raise(error):
    raise error


def _leaves(cfg, prefix=""):
    """(key, value) for every setting of a configuration, nested keys with their dots."""
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            yield from _leaves(value, f"{prefix}{f.name}.")
        else:
            yield prefix + f.name, value


def test_every_key_of_every_configuration_refuses_a_value_out_of_its_range(tmp_path):
    """A negative whole number, a float that is not a number, an unknown word: each is refused
    before anything starts, with a message that names the key, for every key of every named
    configuration (a key added without its rule fails here)."""
    checked = 0
    for name in CONFIGS:
        for key, value in _leaves(build_config(name)):
            if isinstance(value, bool) or key in ("task", "init", "data.path"):  # see below
                continue
            bad = {int: "-1", float: "nan", str: "nonsense"}[type(value)]
            with pytest.raises(ConfigError) as refused:
                apply_overrides(build_config(name), [f"{key}={bad}"])
            assert key in str(refused.value), (name, key, str(refused.value))
            checked += 1
    assert checked > 30 * len(CONFIGS) // 2
    # a file named by `init` is looked for when training starts, before anything is built: a
    # record that names one stays readable on a machine where the file is gone
    with pytest.raises(ConfigError, match="init: must name a checkpoint"):
        train(build_config("copy", ["init=nonsense"]), tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()
    # so is the folder named by `data.path`: a checkpoint's record stays readable without it
    with pytest.raises(DataError, match="nonsense holds no prepared.json"):
        train(build_config("parallel", ["data.path=nonsense"]), tmp_path / "run", progress=False)


def _logged_steps(out: Path) -> list[int]:
    path = out / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line)["step"] for line in path.read_text().splitlines() if line.strip()]


def _fault(kind: str, cmd: list[str], out: Path, rng: random.Random) -> int:
    """Run `cmd` (a two-process torchrun) and hit it with `kind` at a random point of its
    training: SIGTERM to torchrun, SIGKILL to every process, or a disk that fills up (the
    file-size limit, at a random size). Returns its exit code."""
    limit = rng.randrange(1_000, 60_000)

    def small_disk():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails: EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    started = time.time()
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True, preexec_fn=small_disk if kind == "disk" else None,
    )  # fmt: skip
    try:
        if kind != "disk":
            record, deadline = out / "run.json", started + 120  # written as training starts
            while proc.poll() is None and not (
                record.exists() and record.stat().st_mtime >= started
            ):
                assert time.time() < deadline, "the run never started"
                time.sleep(0.02)
            time.sleep(rng.uniform(0.0, 0.4))  # somewhere in the steps, saves included
            with contextlib.suppress(ProcessLookupError):  # unless the run has ended already
                if kind == "sigterm":
                    proc.send_signal(signal.SIGTERM)
                else:
                    os.killpg(proc.pid, signal.SIGKILL)
        said, err = proc.communicate(timeout=240)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # nothing of it outlives the test
    if kind == "sigterm":  # stopped with its step saved, before its steps began (nothing to
        # save), or finished before the signal came
        ended = ("stopped by SIGTERM", "terminated (SIGTERM)")
        assert any(e in err for e in ended) or "done:" in said, err[-2000:]
    return proc.returncode


def test_faults_at_random_points_of_a_two_process_run_lose_nothing(tmp_path):
    """SIGTERM, SIGKILL and a full disk, at random points of a two-process run, one after
    another, each followed by --resume: every checkpoint left is whole and this run's, and the
    run finishes equal to one that was never disturbed. FAULT_SEED repeats a sequence."""
    seed = int(os.environ.get("FAULT_SEED", random.randrange(1_000_000)))
    rng = random.Random(seed)
    out, straight = tmp_path / "faulty", tmp_path / "straight"
    args = ["--config", "copy", *TINY, *sets("max_steps=300", "checkpoint_every=7")]
    codes = []
    kinds = [*rng.sample(["sigterm", "sigkill", "disk"], 3), rng.choice(["sigterm", "sigkill"])]
    for kind in kinds:  # each fault once in a random order, then one more signal
        resume = ["--resume"] if checkpoint_names(out) else []
        cmd = [*TORCHRUN_2, "annotated.cli.train", "--no-progress", *args, "--out", str(out)]
        codes.append((kind, _fault(kind, cmd + resume, out, rng)))
        for name in checkpoint_names(out):  # whole, and named for the step it holds
            state = torch.load(out / "checkpoints" / name, weights_only=True)
            assert name == f"ckpt_{state['step']:08d}.pt", (seed, codes)
    resume = ["--resume"] if checkpoint_names(out) else []
    run_trainer(*args, "--out", str(out), *resume, launcher=TORCHRUN_2, CUDA_VISIBLE_DEVICES="")
    run_trainer(*args, "--out", str(straight), launcher=TORCHRUN_2, CUDA_VISIBLE_DEVICES="")
    a, b = final_weights(straight), final_weights(out)
    assert all(torch.equal(a[k], b[k]) for k in a), (seed, codes)
    assert _logged_steps(out) == list(range(1, 301)), (seed, codes)
    assert not [p for p in (out / "checkpoints").iterdir() if p.suffix == ".tmp"], (seed, codes)
    # through the launcher: done, an error said (the full disk), stopped and saved, stopped
    # before a save (SIGTERM while starting), or the launcher itself killed
    assert {code for _, code in codes} <= {0, 2, 75, 143, -9}, (seed, codes)
    print(f"FAULT_SEED={seed}: {codes}")  # shown with pytest -s


def test_when_one_process_dies_the_other_says_how_to_continue(tmp_path):
    """SIGKILL to one trainer of two (the kernel's out-of-memory killer, a failed machine): the
    survivor reports it in words, not with the communication library's traceback."""
    out = tmp_path / "run"
    cmd = [*TORCHRUN_2, "annotated.cli.train", "--no-progress", "--config", "copy", *TINY]
    cmd += [*sets("max_steps=100000", "checkpoint_every=5"), "--out", str(out)]
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    proc = subprocess.Popen(cmd, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 120
        while not checkpoint_names(out) and time.time() < deadline:
            time.sleep(0.05)
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        os.kill(int(children[-1]), signal.SIGKILL)  # the second trainer
        _, err = proc.communicate(timeout=240)
    finally:
        proc.kill()
    # the launcher names the process that could not speak, and exits as a SIGKILL does
    assert "process 1 of the run was killed by signal 9" in err, err[-3000:]
    survivor = [line for line in err.splitlines() if "another process of this run stopped" in line]
    # the survivor says it too, unless torchrun killed it first: when a process fails, torchrun
    # gives the others a fixed 30 s, which a survivor on a loaded machine can overrun
    killed = "Unable to shutdown process" in err
    assert (survivor and "--resume" in survivor[0]) or killed, err[-3000:]
    assert proc.returncode == 128 + 9 and "ChildFailedError" not in err, proc.returncode
    assert "[rank0]: RuntimeError" not in err and "[rank0]: Traceback" not in err, err[-3000:]
