"""The trainer's command line: distributed equivalence, exact resume after SIGKILL, and bad
input."""

import importlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from annotated.checkpoints import checkpoint_paths
from annotated.training.registry import build_config

from helpers import (
    TINY,
    TORCHRUN_2,
    checkpoint_names,
    error_of,
    final_weights,
    killed_then_resumed,
    refused,
    run_trainer,
    sets,
    tiny_copy,
    tiny_refused,
)


def test_two_processes_equal_one_process_with_accumulation(tmp_path):
    common = TINY + sets("max_steps=6", "optim.warmup=3")
    # both on CPU (gloo), also on a machine with a GPU: the test is about the arithmetic of DDP
    run_trainer(
        "--config",
        "copy",
        "--out",
        str(tmp_path / "one"),
        *sets("batch.accum=2"),
        *common,
        CUDA_VISIBLE_DEVICES="",
    )
    torchrun = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        "-m",
    ]
    run_trainer(
        "--config",
        "copy",
        "--out",
        str(tmp_path / "two"),
        *common,
        launcher=torchrun,
        CUDA_VISIBLE_DEVICES="",
    )
    assert json.loads((tmp_path / "two" / "run.json").read_text())["world_size"] == 2
    one, two = final_weights(tmp_path / "one"), final_weights(tmp_path / "two")
    assert one.keys() == two.keys()
    for k in one:
        torch.testing.assert_close(one[k], two[k], rtol=1e-4, atol=1e-6, msg=k)
    # and the weights did move away from their initial values: the runs trained
    from annotated import make_model

    torch.manual_seed(0)
    initial = make_model(13, 13, N=1, d_model=16, d_ff=32, h=2).state_dict()
    moved = [
        k for k in one if one[k].is_floating_point() and not torch.allclose(one[k], initial[k])
    ]
    assert len(moved) > len(one) // 2, moved


def test_sigkill_then_resume_is_identical(tmp_path):
    args = [
        "--config",
        "copy",
        *TINY,
        *sets("max_steps=400", "checkpoint_every=20", "model.dropout=0.1", "keep_last=50"),
    ]
    straight, killed = killed_then_resumed(tmp_path, args, 400)
    for k in straight:
        assert torch.equal(straight[k], killed[k]), k


def test_unknown_config_key_and_type(tmp_path):
    out = ["--out", tmp_path]
    assert "unknown configuration 'wmt99'" in refused("--config", "wmt99", *out)
    msg = refused("--config", "copy", *sets("warmpu=10"), *out)
    assert "warmpu: unknown key" in msg and "warmup" in msg
    assert "model.h expects a value of type int" in refused(
        "--config", "copy", *sets("model.h=two"), *out
    )
    msg = refused("--config", "copy", *sets("precision=maybe"), *out)
    assert "precision: must be auto, fp32, bf16 or fp16" in msg
    assert not tmp_path.exists() or not any(tmp_path.iterdir())  # nothing was written


def test_a_configuration_is_model_optimisation_and_the_tasks_own_data():
    """Each part is its own dataclass; a key of another task's data, a part set as a whole, and
    a flat key of the older layout are refused with the key to use."""
    from dataclasses import asdict

    from annotated.errors import ConfigError
    from annotated.training.registry import config_from_record
    from annotated.training.tasks.wmt14 import Wmt14Data

    cfg = build_config("wmt14-base", ["data.pair=en-fr", "optim.warmup=8000"])
    assert isinstance(cfg.data, Wmt14Data) and cfg.data.pair == "en-fr"
    assert cfg.optim.warmup == 8000 and cfg.data.target_language() == "fr"
    for bad, says in [
        (["data.pair=en-fr"], "data.pair: unknown key"),  # Multi30k has no language pair
        (["data=sample"], "data is a group of settings; set one of data.vocab"),
        (["lr_factor=2"], "did you mean optim.lr_factor?"),
        (["data.vocab=10"], "data.vocab: must be at least 100"),
    ]:
        with pytest.raises(ConfigError, match=re.escape(says)):
            build_config("multi30k-cpu", bad)
    # what a checkpoint records comes back as the same configuration, in this layout or the
    # older flat one (every key at the top, the WMT14 scale under "data")
    assert config_from_record(json.loads(json.dumps(asdict(cfg)))) == cfg
    with pytest.raises(ConfigError, match="or name a model: base, big"):
        build_config("parallel", ["model=huge"])
    flat = {**asdict(cfg.optim), **asdict(cfg), "pair": "en-fr", "data": "sample", "vocab": 0}
    del flat["optim"]
    old = config_from_record(flat)
    assert old.data == Wmt14Data(pair="en-fr", scale="sample") and old.optim == cfg.optim


def test_resume_without_and_with_corrupt_checkpoint(tmp_path):
    out = tmp_path / "run"
    assert "no checkpoint in" in refused("--config", "copy", "--resume", "--out", out)
    tiny_copy(out, *sets("max_steps=4", "checkpoint_every=2"))
    newest = sorted((out / "checkpoints").glob("*.pt"))[-1]
    newest.write_bytes(newest.read_bytes()[:100])
    msg = tiny_refused(out, *sets("max_steps=6"), "--resume")
    assert "cannot be read" in msg and "ckpt_00000002.pt" in msg


def test_out_dir_of_another_run(tmp_path):
    out = tmp_path / "run"
    tiny_copy(out, *sets("max_steps=2"))
    assert "already holds checkpoints" in tiny_refused(out)
    msg = tiny_refused(out, *sets("model.d_model=32"), "--resume")
    assert "another run than the one asked for: its model.d_model is 16, not 32" in msg


def test_nan_loss_stops_without_overwriting_the_good_checkpoint(tmp_path):
    out = tmp_path / "run"
    tiny_copy(out, *sets("max_steps=2", "checkpoint_every=1"))
    good = sorted((out / "checkpoints").glob("*.pt"))
    before = {p.name: p.read_bytes() for p in good}
    r = tiny_copy(
        out,
        *sets("max_steps=50", "checkpoint_every=1", "optim.lr_factor=1e30"),
        "--resume",
        check=False,
    )
    msg = error_of(r)
    assert "the loss became" in msg and "Lower optim.lr_factor" in msg
    after = sorted((out / "checkpoints").glob("*.pt"))
    for (
        p
    ) in after:  # checkpoints written before the blow-up are finite; the good ones are untouched
        state = torch.load(p, weights_only=True)["model"]
        assert all(torch.isfinite(v).all() for v in state.values() if v.is_floating_point()), p.name
    for name, data in before.items():
        if (out / "checkpoints" / name).exists():
            assert (out / "checkpoints" / name).read_bytes() == data


def test_update_that_breaks_the_weights_is_never_checkpointed(tmp_path):
    """The loss of step 3 is finite (it is computed before the update), but a learning rate beyond
    float32's range makes an update inf: the checkpoint due then is refused, and the message names
    that step and the real last good checkpoint, the only one kept (keep_last=1) and a finite
    one."""
    out = tmp_path / "run"
    common = [*TINY, *sets("checkpoint_every=1", "keep_last=1"), "--out", str(out)]
    run_trainer("--config", "copy", *sets("max_steps=2"), *common)
    msg = error_of(
        run_trainer(
            "--config",
            "copy",
            *sets("max_steps=9", "optim.lr_factor=1e45"),
            "--resume",
            *common,
            check=False,
        )
    )
    diverged = int(re.search(r"diverged at step (\d+)", msg).group(1))
    named = Path(re.search(r"last good checkpoint is (\S+\.pt)", msg).group(1))
    kept = sorted((out / "checkpoints").glob("*"))
    assert kept == [named] and named.name == f"ckpt_{diverged - 1:08d}.pt", (msg, kept)
    state = torch.load(named, weights_only=True)["model"]
    assert all(torch.isfinite(v).all() for v in state.values() if v.is_floating_point())


@pytest.mark.parametrize("value", ["0", "-1"])
def test_max_steps_zero_or_negative_is_refused(tmp_path, value):
    msg = refused("--config", "copy", "--max-steps", value, "--out", tmp_path)
    assert "max_steps" in msg and "at least 1" in msg
    assert not (tmp_path / "checkpoints").exists()


@pytest.mark.parametrize(
    "setting,key",
    [
        ("optim.warmup=0", "warmup"),
        ("model.d_model=65", "model.d_model"),
        ("batch.accum=0", "accum"),
        ("log_every=0", "log_every"),
        ("model.dropout=2", "model.dropout"),
        ("optim.lr_factor=nan", "lr_factor"),
        ("optim.max_grad_norm=-1", "max_grad_norm"),
        ("optim.max_grad_norm=inf", "max_grad_norm"),
        ("optim.adam_beta2=1", "adam_beta2"),
        ("optim.adam_eps=0", "adam_eps"),
    ],
)
def test_unusable_values_are_refused_before_training(setting, key):
    from annotated.errors import ConfigError

    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        build_config("copy", [setting])


def endless_run(out, **popen):
    """A trainer started in the background with no end in sight, once it has written its first
    checkpoint: (the process, its arguments)."""
    args = ["--config", "copy", *TINY, *sets("max_steps=100000", "checkpoint_every=5")]
    args += ["--out", str(out)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "annotated.cli.train", "--no-progress", *args],
        env=dict(os.environ, OMP_NUM_THREADS="1"),
        # as from a terminal: a shell's background job (`make test &`) ignores Ctrl-C, and its
        # children would inherit that and never see the SIGINT these tests send
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        **popen,
    )
    deadline = time.time() + 120
    while not list((out / "checkpoints").glob("ckpt_*.pt")) and time.time() < deadline:
        time.sleep(0.05)
    return proc, args


def test_second_trainer_on_the_same_folder_is_refused_and_a_kill_frees_it(tmp_path):
    first, args = endless_run(
        tmp_path / "run", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        msg = refused(*args, "--resume")
        assert "in use by another trainer" in msg and f"pid {first.pid}" in msg
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    run_trainer(*[a if a != "max_steps=100000" else "max_steps=12" for a in args], "--resume")


def test_ctrl_c_stops_cleanly_and_says_how_to_resume(tmp_path):
    proc, _ = endless_run(
        tmp_path / "run", text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    proc.send_signal(signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()  # whatever happened, no trainer outlives the test
    assert proc.returncode == 130 and "Traceback" not in err, err  # 128 + SIGINT
    assert "interrupted at step" in err and "--resume" in err and "ckpt_" in err


def raising(error: BaseException):
    """A stand-in for the training step that raises `error`."""

    def step(*args, **kwargs):
        raise error

    return step


GPU_FULL = "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 15.77 GiB"
CPU_FULL = "DefaultCPUAllocator: can't allocate memory: you tried to allocate 2147483648 bytes"


@pytest.mark.parametrize(
    "refusal, where",
    [(torch.OutOfMemoryError(GPU_FULL), "the GPU's"), (RuntimeError(CPU_FULL), "this machine's")],
)
def test_a_micro_batch_too_large_for_memory_names_the_setting_that_fits(
    tmp_path, monkeypatch, capsys, refusal, where
):
    """PyTorch's out-of-memory error in a step becomes a message and exit code 2 (no traceback),
    nothing is written for the step, and the setting the message names lets the run resume and
    finish. Another error in the step stays a traceback: it is a bug."""
    trainer = importlib.import_module("annotated.training.trainer")
    train_cli = importlib.import_module("annotated.cli.train")
    out = tmp_path / "run"
    common = [*TINY, *sets("checkpoint_every=2", "batch.max_tokens=3000"), "--out", str(out)]
    args = ["--config", "copy", "--no-progress", *common]
    assert train_cli.main([*args, "--max-steps", "2"]) == 0
    before = {p.name: p.read_bytes() for p in checkpoint_paths(out)}
    real_step = trainer.train_step
    monkeypatch.setattr(trainer, "train_step", raising(refusal))
    capsys.readouterr()
    assert train_cli.main([*args, "--max-steps", "4", "--resume"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and f"ran out of {where} memory" in err, err
    assert "allocate 2" in err and "ckpt_00000002.pt" in err, err
    assert "up to 3,000 padded tokens" in err, err
    setting = re.search(r"--set (batch\.max_tokens=\d+)", err).group(1)
    assert setting == "batch.max_tokens=1500", err
    assert {p.name: p.read_bytes() for p in checkpoint_paths(out)} == before

    for bug in (ZeroDivisionError("a bug"), RuntimeError("a bug")):
        monkeypatch.setattr(trainer, "train_step", raising(bug))
        with pytest.raises(type(bug), match="a bug"):
            train_cli.main([*args, "--max-steps", "4", "--resume"])

    monkeypatch.setattr(trainer, "train_step", real_step)
    assert train_cli.main([*args, "--max-steps", "4", "--resume", "--set", setting]) == 0
    assert [p.name for p in checkpoint_paths(out)][-1] == "ckpt_00000004.pt"


def test_a_run_ended_before_its_first_checkpoint_is_not_told_to_resume(tmp_path):
    from annotated.training.resuming import ended_early

    for e in (KeyboardInterrupt(), torch.OutOfMemoryError(GPU_FULL)):
        message = str(ended_early(tmp_path / "run", 3, 4096, e))
        assert "no checkpoint was written yet" in message and "--resume" not in message, message
    assert "--set batch.max_tokens=2048" in message, message


def test_failed_checkpoint_write_leaves_no_tmp_and_keeps_the_last_good_one(tmp_path, monkeypatch):
    trainer = importlib.import_module("annotated.training.trainer")
    out = tmp_path / "run"
    cfg = build_config(
        "copy",
        [
            "model.N=1",
            "model.d_model=16",
            "model.d_ff=32",
            "model.h=2",
            "max_steps=4",
            "checkpoint_every=2",
        ],
    )
    trainer.train(cfg, out, progress=False)
    before = {p.name: p.read_bytes() for p in checkpoint_paths(out)}

    def full_disk(obj, f, *a, **k):
        Path(f).write_bytes(b"partial")
        raise RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 512 vs 448")

    monkeypatch.setattr(trainer.torch, "save", full_disk)
    cfg.max_steps = 6
    with pytest.raises(
        trainer.TrainingError, match="could not write checkpoint .*ckpt_00000006.pt"
    ):
        trainer.train(cfg, out, resume=True, progress=False)
    assert not list((out / "checkpoints").glob("*.tmp"))
    assert {p.name: p.read_bytes() for p in checkpoint_paths(out)} == before


def test_resume_keeps_the_earlier_segment_and_logs_the_rate_each_step_used(tmp_path):
    from annotated.schedule import rate

    first = build_config("copy").optim.lr_factor  # the configuration's own factor
    out = tmp_path / "run"
    tiny_copy(out, *sets("max_steps=2"))
    tiny_copy(out, *sets("max_steps=4", f"optim.lr_factor={first / 2}"), "--resume")
    run = json.loads((out / "run.json").read_text())
    assert run["config"]["optim"]["lr_factor"] == first / 2 and run["from_step"] == 2
    assert [h["config"]["optim"]["lr_factor"] for h in run["history"]] == [first]
    assert run["history"][0]["until_step"] == 2
    logged = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert logged[0]["step"] == 1 and logged[0]["lr"] == pytest.approx(rate(1, 16, first, 100))
    # the halved lr_factor applies from the first resumed step
    assert logged[2]["step"] == 3 and logged[2]["lr"] == pytest.approx(rate(3, 16, first / 2, 100))


def test_files_that_are_not_checkpoints_or_json_get_messages(tmp_path):
    out = tmp_path / "run"
    tiny_copy(out, *sets("max_steps=2"))
    resume = ["--config", "copy", *TINY, *sets("max_steps=3"), "--resume", "--out", str(out)]
    (out / "run.json").write_text("")
    msg = refused(*resume)
    assert "run.json cannot be read as JSON" in msg
    (out / "run.json").unlink()
    newest = sorted((out / "checkpoints").glob("*.pt"))[-1]
    torch.save({"weights": torch.zeros(2)}, newest)
    msg = refused(*resume)
    assert "not a checkpoint of this trainer" in msg


def test_a_refused_start_releases_the_folder_for_the_same_process(tmp_path):
    """In a notebook the traceback keeps the failed call's frame alive: the lock must not live in
    it."""
    trainer = importlib.import_module("annotated.training.trainer")
    cfg = build_config(
        "copy", ["model.N=1", "model.d_model=16", "model.d_ff=32", "model.h=2", "max_steps=2"]
    )
    trainer.train(cfg, tmp_path, progress=False)
    with pytest.raises(trainer.TrainingError, match="already holds checkpoints") as failed:
        trainer.train(cfg, tmp_path, progress=False)
    cfg.max_steps = 3
    assert (
        failed.value is not None
        and trainer.train(cfg, tmp_path, resume=True, progress=False)["steps"] == 3
    )


def test_resume_with_another_tokenizer_is_refused(tmp_path):
    out = tmp_path / "run"
    tiny_copy(out, *sets("max_steps=2"))
    newest = sorted((out / "checkpoints").glob("*.pt"))[-1]
    state = torch.load(newest, weights_only=True)
    assert state["tokenizer"] == "ids-13"  # the copy task's ids, 13 symbols
    state["tokenizer"] = "0123456789abcdef"  # as if its tokenizer had been replaced
    torch.save(state, newest)
    msg = tiny_refused(out, *sets("max_steps=4"), "--resume")
    assert "trained with tokenizer 0123456789abcdef" in msg and "ids-13" in msg
    assert len(list((out / "checkpoints").glob("*.pt"))) == 1  # nothing was trained on


def test_train_cli_draws_the_run_when_asked(tmp_path, capsys):
    from annotated.cli.train import main

    png, out = tmp_path / "run.png", tmp_path / "run"
    assert (
        main(
            [
                "--config",
                "copy",
                "--out",
                str(out),
                "--max-steps",
                "40",
                "--no-progress",
                "--plot",
                str(png),
            ]
        )
        == 0
    )
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"wrote {png}" in capsys.readouterr().out


def test_a_time_limit_stops_the_run_checkpointed_and_counts_across_resumes(tmp_path):
    out = tmp_path / "run"
    limit = sets("max_steps=100000", "checkpoint_every=0", "max_minutes=0.02")  # 1.2 s
    r = tiny_copy(out, *limit)
    assert "(time limit: 0.02 min)" in r.stdout
    last = sorted((out / "checkpoints").glob("ckpt_*.pt"))[-1]
    state = torch.load(last, weights_only=True)
    assert 1 <= state["step"] < 100000 and state["seconds"] >= 1.2  # the stop step is kept
    logged = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert logged[-1] == state["step"]  # and logged
    # resumed with the same limit: the time is spent already, nothing more is trained
    tiny_copy(out, *limit, "--resume")
    assert sorted((out / "checkpoints").glob("ckpt_*.pt"))[-1] == last
    # a longer limit continues from there, counting the time already trained
    tiny_copy(out, *sets("max_steps=100000", "checkpoint_every=0", "max_minutes=0.04"), "--resume")
    again = torch.load(sorted((out / "checkpoints").glob("ckpt_*.pt"))[-1], weights_only=True)
    assert again["step"] > state["step"] and 2.4 <= again["seconds"] < 2.4 + 60


def test_every_process_stops_at_the_same_step_under_a_time_limit(tmp_path):
    out = tmp_path / "ddp"
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    launcher += ["--nproc_per_node", "2", "-m"]
    args = sets("max_steps=100000", "checkpoint_every=0", "max_minutes=0.02")
    r = run_trainer(
        "--config",
        "copy",
        *TINY,
        *args,
        "--out",
        str(out),
        launcher=launcher,
        CUDA_VISIBLE_DEVICES="",
    )
    assert "(time limit: 0.02 min)" in r.stdout  # both left the loop: the run ended normally
    assert len(list((out / "checkpoints").glob("ckpt_*.pt"))) == 1


def test_a_resumed_run_logs_each_step_once(tmp_path):
    out = tmp_path / "run"
    tiny_copy(out, *sets("max_steps=6", "checkpoint_every=4"))
    (out / "checkpoints" / "ckpt_00000006.pt").unlink()  # as if killed after step 6's log line
    tiny_copy(out, *sets("max_steps=8", "checkpoint_every=4"), "--resume")
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, 9))


def kept_steps(cfg, seconds_per_step: float, monkeypatch) -> list[int]:
    """The steps whose checkpoints a run keeps at its end when every step takes
    `seconds_per_step`: the training loop's rule (progress.checkpoint_due, then the last
    `keep_last`), on a simulated clock."""
    import annotated.training.progress as progress

    clock = [0.0]
    monkeypatch.setattr(progress.time, "time", lambda: clock[0])
    kept: list[int] = []
    last = 0.0
    for step in range(1, cfg.max_steps + 1):
        clock[0] += seconds_per_step
        if progress.checkpoint_due(cfg, step, last):
            kept, last = [*kept, step][-cfg.keep_last :], clock[0]
    return kept


def test_the_averaged_window_is_the_papers_where_a_base_step_takes_under_0_43_s(monkeypatch):
    """Chapter 25's statement: wmt14-base keeps checkpoints 1,400 steps apart (the last gap
    600), unless 10 minutes pass between two of them; then the window is shorter, and
    checkpoint_minutes=0 restores it."""
    cfg = build_config("wmt14-base")
    assert (cfg.checkpoint_every, cfg.checkpoint_minutes, cfg.keep_last) == (1400, 10, 5)
    paper = [95_200, 96_600, 98_000, 99_400, 100_000]
    assert kept_steps(cfg, 0.42, monkeypatch) == paper  # 1,400 steps in 588 s
    slow = kept_steps(cfg, 0.44, monkeypatch)  # 1,400 steps in 616 s: a time checkpoint first
    assert slow[-1] == 100_000 and slow[-1] - slow[0] < paper[-1] - paper[0]
    assert any(step % 1400 for step in slow[:-1])
    exact = build_config("wmt14-base", ["checkpoint_minutes=0"])
    assert kept_steps(exact, 0.44, monkeypatch) == paper


def test_only_the_trainers_checkpoints_count_and_each_must_be_this_runs(tmp_path):
    """A hand-made ckpt_best.pt is neither resumed from nor pruned; a renamed checkpoint, and a
    checkpoint of another run under a numbered name, are refused before anything is loaded."""
    out, folder = tmp_path / "run", tmp_path / "run" / "checkpoints"
    tiny_copy(out, *sets("max_steps=4", "checkpoint_every=1"))
    best = folder / "ckpt_best.pt"
    best.write_bytes((folder / "ckpt_00000002.pt").read_bytes())
    r = tiny_copy(out, *sets("max_steps=6", "checkpoint_every=1", "keep_last=2"), "--resume")
    assert "ckpt_best.pt: not checkpoints of this trainer, left alone" in r.stderr
    assert json.loads((out / "run.json").read_text())["from_step"] == 4  # not best's step 2
    assert best.exists() and [p.name for p in sorted(folder.glob("ckpt_0*.pt"))] == [
        "ckpt_00000005.pt",
        "ckpt_00000006.pt",
    ]
    renamed = folder / "ckpt_00000099.pt"
    renamed.write_bytes((folder / "ckpt_00000006.pt").read_bytes())
    msg = tiny_refused(out, *sets("max_steps=100"), "--resume")
    assert "is named for step 99 but holds step 6" in msg and "Move it out of" in msg
    renamed.unlink()
    other = tmp_path / "other"
    tiny_copy(other, *sets("max_steps=7", "seed=1"))
    (folder / "ckpt_00000007.pt").write_bytes((other / "checkpoints/ckpt_00000007.pt").read_bytes())
    msg = tiny_refused(out, *sets("max_steps=8"), "--resume")
    assert "ckpt_00000007.pt was written by another run than the one resumed" in msg
    assert "its seed is 1, not 0" in msg
    assert (folder / "ckpt_00000005.pt").exists()  # nothing of the run was pruned for it


def test_sigterm_while_a_run_prepares_its_data_stops_it_at_once(tmp_path):
    """Before the first step there is nothing to save: a SIGTERM while the task prepares its
    data (tests/tiny_tasks/slow_start.py, a minute) ends the run within seconds with 143, and
    the folder it had just made is gone."""
    config, out = tmp_path / "slow.json", tmp_path / "run"
    model = {"N": 1, "d_model": 16, "d_ff": 32, "h": 2}
    config.write_text(json.dumps({"task": "tiny_tasks.slow_start", "model": model,
                                  "precision": "fp32", "max_steps": 5}))  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).parent), OMP_NUM_THREADS="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "annotated.cli.train", "--no-progress", "--config", str(config),
         "--out", str(out)], env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        deadline = time.time() + 60
        while not (out / "trainer.lock").exists() and proc.poll() is None:
            assert time.time() < deadline, "the run never started"
            time.sleep(0.05)
        time.sleep(0.5)  # inside the task's preparation
        signalled = time.time()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert time.time() - signalled < 15 and proc.returncode == 143, (proc.returncode, err)
    assert "terminated (SIGTERM)" in err and "Traceback" not in err, err
    assert not out.exists()


def test_sigterm_saves_the_step_it_finished_and_the_run_resumes_exactly(tmp_path):
    """What SLURM and Kubernetes send before a kill: the trainer finishes its step, saves it,
    says how to continue and exits with its own code (75); the resumed run equals one that was
    never stopped, and nothing after the last checkpoint interval is lost."""
    out = tmp_path / "stopped"
    # no checkpoint but the last (checkpoint_every=0): the one the stop saves is the only one
    args = ["--config", "copy", *TINY, *sets("max_steps=100000", "checkpoint_every=0")]
    args += [*sets("log_every=1"), "--out", str(out)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "annotated.cli.train", "--no-progress", *args],
        env=dict(os.environ, OMP_NUM_THREADS="1"), text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    log, deadline = out / "metrics.jsonl", time.time() + 120
    while (not log.exists() or log.read_text().count("\n") < 3) and time.time() < deadline:
        time.sleep(0.05)  # three steps logged, then the signal: on any machine, at any speed
    proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 75 and "Traceback" not in err, (proc.returncode, err)
    step = int(re.search(r"stopped by SIGTERM at step (\d+), after saving", err).group(1))
    assert step >= 3 and "--resume" in err
    assert checkpoint_names(out) == [f"ckpt_{step:08d}.pt"]  # saved by the stop itself
    more = [*args[: args.index("--out")], *sets(f"max_steps={step + 3}")]
    run_trainer(*more, "--out", str(out), "--resume")
    run_trainer(*more, "--out", str(tmp_path / "straight"))
    a, b = final_weights(tmp_path / "straight"), final_weights(out)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_sigterm_to_torchrun_stops_both_processes_at_one_saved_step(tmp_path):
    """SIGTERM to torchrun reaches both processes; they agree on the step, the first saves it,
    and the two-process run resumed from it equals one that was never stopped."""
    out = tmp_path / "stopped"
    args = ["--config", "copy", *TINY, *sets("max_steps=100000", "checkpoint_every=5")]
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    cmd = [*TORCHRUN_2, "annotated.cli.train", "--no-progress", *args, "--out", str(out)]
    proc = subprocess.Popen(cmd, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while not checkpoint_names(out) and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=240)
    finally:
        proc.kill()
    steps = {int(s) for s in re.findall(r"stopped by SIGTERM at step (\d+)", err)}
    assert len(steps) == 1 and err.count("stopped by SIGTERM") == 2, err[-3000:]
    # the launcher ends with the trainers' code, 75 (stopped and saved), without a traceback
    assert proc.returncode == 75 and "Traceback" not in err, (proc.returncode, err[-3000:])
    (step,) = steps
    assert checkpoint_names(out)[-1] == f"ckpt_{step:08d}.pt"
    more = [*args, *sets(f"max_steps={step + 2}")]
    run_trainer(*more, "--out", str(out), "--resume", launcher=TORCHRUN_2, CUDA_VISIBLE_DEVICES="")
    run_trainer(*more, "--out", str(tmp_path / "straight"), launcher=TORCHRUN_2,
                CUDA_VISIBLE_DEVICES="")  # fmt: skip
    a, b = final_weights(tmp_path / "straight"), final_weights(out)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_named_model_replaces_the_architecture_and_keeps_the_datas_length():
    """`--set model=base|big` is the paper's model (Table 3), in the order the overrides come."""
    from dataclasses import replace

    from annotated.model import TRANSFORMER_BASE, TRANSFORMER_BIG

    cpu = build_config("parallel", ["model.norm_first=true"])
    base = build_config("parallel", ["model.norm_first=true", "model=base"])  # replaced whole
    assert base.model == replace(TRANSFORMER_BASE, max_len=cpu.model.max_len)
    assert not base.model.norm_first and cpu.model.norm_first and base.optim == cpu.optim
    big = build_config("wmt14-base", ["model.N=2", "model=big", "model.dropout=0.2"])
    assert big.model == replace(TRANSFORMER_BIG, max_len=1024, dropout=0.2)  # N=2 replaced
    assert build_config("wmt14-big").model == build_config("wmt14-base", ["model=big"]).model


def test_the_launcher_ends_with_the_trainers_exit_code(tmp_path):
    """torchrun exits 1 with a traceback of its own whatever its processes said; the book's
    launcher (appendix A4) exits with their code: 2 for a mistake in the command line."""
    cmd = [*TORCHRUN_2, "annotated.cli.train", "--config", "copy", *sets("no_such_key=1")]
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    r = subprocess.run(
        [*cmd, "--out", str(tmp_path / "run")], env=env, capture_output=True, text=True, timeout=240
    )
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert "unknown key" in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]


def test_resuming_a_run_past_its_max_steps_trains_nothing_and_says_so(tmp_path):
    out = tmp_path / "run"
    tiny_copy(out, "--max-steps", "6", *sets("checkpoint_every=3"))
    r = tiny_copy(out, "--max-steps", "4", *sets("checkpoint_every=3"), "--resume")
    assert "done: step 6/4 (it had passed max_steps before: nothing was trained)" in r.stdout
    assert "(last: ckpt_00000006.pt)" in r.stdout, r.stdout


def test_a_run_that_fails_as_it_starts_leaves_no_folder_behind(tmp_path):
    """The folder a failed start made (only the trainer's lock inside) is removed again; a
    folder that was there before is left as it was."""
    a_file = tmp_path / "not-a-folder"
    a_file.write_text("notes")
    args = ["--config", "parallel", *sets(f"data.path={a_file}"), "--max-steps", "2"]
    r = run_trainer(*args, "--out", str(tmp_path / "run"), check=False)
    assert r.returncode == 2 and "is a file; give the folder that prepare wrote" in r.stderr
    assert not (tmp_path / "run").exists()
    (tmp_path / "mine").mkdir()
    run_trainer(*args, "--out", str(tmp_path / "mine"), check=False)
    assert (tmp_path / "mine").is_dir()


@pytest.mark.parametrize(
    "flags, said",
    [
        (["--nproc_per_node", "0"], "--nproc_per_node 0"),
        (["--nproc_per_node", "-1"], "--nproc_per_node -1"),
        (["--nproc_per_node", "abc"], "--nproc_per_node abc"),
        (["--nproc_per_node", "100000"], "start at most"),  # before: 100,000 trainers started
        (["--nnodes", "0"], "--nnodes 0"),
        (["--nnodes", "3:2"], "--nnodes 3:2"),
        (["--max_restarts", "-1"], "max_restarts must be >= 0"),  # torchrun's own refusals
        (["--monitor-interval", "-5"], "a value out of its range"),
        (["--nnodes", "2", "--rdzv_endpoint", "::::"], "port number of the rendezvous endpoint"),
    ],
)
def test_the_launcher_checks_its_own_numbers_before_torchrun_sees_them(tmp_path, flags, said):
    cmd = [sys.executable, "-m", "annotated.cli.launch", *flags, "-m", "annotated.cli.train",
           "--config", "copy", "--out", str(tmp_path / "run")]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and said in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "run").exists()


def test_a_trainer_whose_lock_file_is_deleted_stops_before_its_next_checkpoint(tmp_path):
    """trainer.lock deleted while a trainer runs no longer keeps a second trainer out: the
    first notices at its next checkpoint and stops with a message, writing nothing more."""
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "annotated.cli.train", "--no-progress", "--config", "copy",
           *TINY, *sets("max_steps=100000", "checkpoint_every=5"), "--out", str(out)]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, OMP_NUM_THREADS="1"))  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not list((out / "checkpoints").glob("ckpt_*.pt")):  # the first checkpoint
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        written = set((out / "checkpoints").glob("ckpt_*.pt"))
        (out / "trainer.lock").unlink()
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 2 and "trainer.lock was deleted or replaced" in err, err[-2000:]
    later = set((out / "checkpoints").glob("ckpt_*.pt")) - written
    assert len(later) <= 1  # at most the checkpoint being written as the lock was deleted
