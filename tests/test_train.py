"""The trainer's command line: distributed equivalence, exact resume after SIGKILL, and bad input."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

TINY = ["--set", "model.N=1", "--set", "model.d_model=16", "--set", "model.d_ff=32", "--set", "model.h=2",
        "--set", "batch_sentences=8", "--set", "log_every=1"]


def run_trainer(*args, launcher=None, timeout=300, check=True, **env_extra):
    env = dict(os.environ, OMP_NUM_THREADS="1", **env_extra)
    cmd = (launcher or [sys.executable, "-m"]) + ["annotated.train", "--no-progress", *args]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if check:
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return r


def final_weights(out: Path) -> dict:
    last = sorted((out / "checkpoints").glob("ckpt_*.pt"))[-1]
    return torch.load(last, weights_only=True)["model"]


def test_two_processes_equal_one_process_with_accumulation(tmp_path):
    common = TINY + ["--set", "max_steps=6", "--set", "warmup=3"]
    # both on CPU (gloo), also on a machine with a GPU: the test is about the arithmetic of DDP
    run_trainer("--config", "copy", "--out", str(tmp_path / "one"), "--set", "accum=2", *common,
                CUDA_VISIBLE_DEVICES="")
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m"]
    r = run_trainer("--config", "copy", "--out", str(tmp_path / "two"), *common, launcher=torchrun,
                    CUDA_VISIBLE_DEVICES="")
    assert json.loads((tmp_path / "two" / "run.json").read_text())["world_size"] == 2
    one, two = final_weights(tmp_path / "one"), final_weights(tmp_path / "two")
    assert one.keys() == two.keys()
    for k in one:
        torch.testing.assert_close(one[k], two[k], rtol=1e-4, atol=1e-6, msg=k)
    # and the weights did move: the runs trained
    fresh = torch.load(sorted((tmp_path / "one" / "checkpoints").glob("*.pt"))[0], weights_only=True)
    assert fresh["step"] == 6


def test_sigkill_then_resume_is_identical(tmp_path):
    args = ["--config", "copy", *TINY, "--set", "max_steps=400", "--set", "checkpoint_every=20",
            "--set", "model.dropout=0.1", "--set", "keep_last=50"]
    run_trainer(*args, "--out", str(tmp_path / "straight"))
    killed = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-m", "annotated.train", "--no-progress", *args, "--out", str(killed)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=dict(os.environ, OMP_NUM_THREADS="1"))
    deadline = time.time() + 120
    while not list((killed / "checkpoints").glob("ckpt_*.pt")) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = sorted((killed / "checkpoints").glob("ckpt_*.pt"))
    assert done, "no checkpoint was written before the kill"
    assert int(done[-1].stem.split("_")[1]) < 400, "the run finished before it could be killed"
    assert not list((killed / "checkpoints").glob("*.tmp")) or True   # a .tmp may remain; it is never loaded
    run_trainer(*args, "--out", str(killed), "--resume")
    a, b = final_weights(tmp_path / "straight"), final_weights(killed)
    for k in a:
        assert torch.equal(a[k], b[k]), k
    steps = [json.loads(l)["step"] for l in (killed / "metrics.jsonl").read_text().splitlines()]
    assert steps[-1] == 400


def error_of(r):
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    return r.stderr.strip().splitlines()[-1]


def test_unknown_config_key_and_type(tmp_path):
    assert "unknown configuration 'wmt99'" in error_of(run_trainer("--config", "wmt99", "--out", str(tmp_path), check=False))
    msg = error_of(run_trainer("--config", "copy", "--set", "warmpu=10", "--out", str(tmp_path), check=False))
    assert "warmpu: unknown key" in msg and "warmup" in msg
    msg = error_of(run_trainer("--config", "copy", "--set", "model.h=two", "--out", str(tmp_path), check=False))
    assert "model.h expects a value of type int" in msg
    msg = error_of(run_trainer("--config", "copy", "--set", "bf16=maybe", "--out", str(tmp_path), check=False))
    assert "bf16 expects a value of type bool" in msg


def test_resume_without_and_with_corrupt_checkpoint(tmp_path):
    out = tmp_path / "run"
    assert "no checkpoint in" in error_of(run_trainer("--config", "copy", "--resume", "--out", str(out), check=False))
    run_trainer("--config", "copy", *TINY, "--set", "max_steps=4", "--set", "checkpoint_every=2", "--out", str(out))
    newest = sorted((out / "checkpoints").glob("*.pt"))[-1]
    newest.write_bytes(newest.read_bytes()[:100])
    msg = error_of(run_trainer("--config", "copy", *TINY, "--set", "max_steps=6", "--resume", "--out", str(out), check=False))
    assert "cannot be read" in msg and "ckpt_00000002.pt" in msg


def test_out_dir_of_another_run(tmp_path):
    out = tmp_path / "run"
    run_trainer("--config", "copy", *TINY, "--set", "max_steps=2", "--out", str(out))
    assert "already holds checkpoints" in error_of(run_trainer("--config", "copy", *TINY, "--out", str(out), check=False))
    msg = error_of(run_trainer("--config", "copy", *TINY, "--set", "model.d_model=32", "--resume", "--out", str(out),
                               check=False))
    assert "different model" in msg


def test_nan_loss_stops_without_overwriting_the_good_checkpoint(tmp_path):
    out = tmp_path / "run"
    run_trainer("--config", "copy", *TINY, "--set", "max_steps=2", "--set", "checkpoint_every=1", "--out", str(out))
    good = sorted((out / "checkpoints").glob("*.pt"))
    before = {p.name: p.read_bytes() for p in good}
    r = run_trainer("--config", "copy", *TINY, "--set", "max_steps=50", "--set", "checkpoint_every=1",
                    "--set", "lr_factor=1e30", "--resume", "--out", str(out), check=False)
    msg = error_of(r)
    assert "the loss became" in msg and "Lower lr_factor" in msg
    after = sorted((out / "checkpoints").glob("*.pt"))
    for p in after:   # checkpoints written before the blow-up are finite; the good ones are untouched
        state = torch.load(p, weights_only=True)["model"]
        assert all(torch.isfinite(v).all() for v in state.values() if v.is_floating_point()), p.name
    for name, data in before.items():
        if (out / "checkpoints" / name).exists():
            assert (out / "checkpoints" / name).read_bytes() == data
