"""The command lines around a run, each fault reproduced: output that cannot be written, memory
that runs out, a checkpoint that would run code, paths and devices that cannot work, a trainer
still running in the folder being evaluated, a results folder written half-way."""

import contextlib
import errno
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from annotated.cli import train as train_cli
from annotated.cli import translate as translate_cli
from annotated.errors import TrainingError
from annotated.evaluation import runs
from annotated.files import lock_out_dir
from annotated.training.progress import Progress

from helpers import TINY, error_of, refused, run_here, run_trainer, sets, tiny_copy, tiny_refused


@pytest.fixture(scope="module")
def copy_run(tmp_path_factory) -> Path:
    """A finished copy-task run with four checkpoints (steps 1 to 4)."""
    out = tmp_path_factory.mktemp("copy") / "run"
    tiny_copy(out, *sets("max_steps=4", "checkpoint_every=1"))
    return out


def command(module: str, *args, stdin: str = "", stdout=subprocess.PIPE):
    return subprocess.run(
        [sys.executable, "-m", f"annotated.cli.{module}", *map(str, args)],
        input=stdin, stdout=stdout, stderr=subprocess.PIPE, text=True, timeout=120,
    )  # fmt: skip


def test_translations_that_cannot_be_written_are_an_error(copy_run):
    ckpt = copy_run / "checkpoints/ckpt_00000004.pt"
    with open("/dev/full", "w") as full:  # every write fails: "No space left on device"
        r = command("translate", "--checkpoint", ckpt, stdin="3 4 5\n" * 2000, stdout=full)
    assert r.returncode == 2 and "could not write the translations" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and "Exception ignored" not in r.stderr


@pytest.mark.skipif(sys.platform == "win32", reason="RLIMIT_FSIZE is POSIX")
def test_a_disk_that_fills_part_way_through_is_an_error_not_a_short_file(copy_run, tmp_path):
    """`translate > file` where the file can only grow to 4 KiB (a file-size limit stands for
    a filling disk: the first writes succeed, a later one fails): an error, exit 2, never exit 0
    with part of the translations."""
    import resource

    ckpt = copy_run / "checkpoints/ckpt_00000004.pt"
    limit = 4_096  # the 6,000 lines come out as at least 6,000 bytes

    def small_files():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    out = tmp_path / "translations.txt"
    with open(out, "w") as target:
        r = subprocess.run(
            [sys.executable, "-m", "annotated.cli.translate", "--checkpoint", str(ckpt)],
            input="3 4 5 6 7 8 9\n" * 6_000, stdout=target, stderr=subprocess.PIPE, text=True,
            timeout=300, preexec_fn=small_files,
        )  # fmt: skip
    assert 0 < out.stat().st_size <= limit  # part of it was written: the disk filled mid-way
    assert r.returncode == 2 and "could not write the translations" in r.stderr, r.stderr[-2000:]
    assert "Traceback" not in r.stderr and "Exception ignored" not in r.stderr


@pytest.mark.parametrize("closed, name", [("<&-", "input"), (">&-", "output")])
def test_a_closed_standard_stream_is_a_message(copy_run, closed, name):
    ckpt = copy_run / "checkpoints/ckpt_00000004.pt"
    shell = f"{sys.executable} -m annotated.cli.translate --checkpoint {ckpt} {closed}"
    r = subprocess.run(["bash", "-c", shell], input="3 4\n", capture_output=True, text=True)
    assert r.returncode == 2 and f"standard {name} is closed" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_a_beam_search_out_of_memory_says_what_to_lower(copy_run, monkeypatch, capsys, tmp_path):
    def no_memory(*args, **kwargs):
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1")

    monkeypatch.setattr(translate_cli, "translate", no_memory)
    (tmp_path / "lines").write_text("3 4 5\n")
    monkeypatch.setattr(sys, "stdin", open(tmp_path / "lines"))
    ckpt = str(copy_run / "checkpoints/ckpt_00000004.pt")
    assert translate_cli.main(["--checkpoint", ckpt, "--beam", "64"]) == 2
    err = capsys.readouterr().err
    assert "this machine ran out of memory (DefaultCPUAllocator" in err, err
    assert "with beam 64: use a smaller --batch-size or --beam" in err, err


def test_a_model_larger_than_the_machine_is_named_as_a_setting_not_a_busy_machine(
    copy_run, tmp_path
):
    """A size no machine like this one holds, from the command line or a crafted checkpoint:
    the message blames the setting, not other programs using the memory."""
    r = run_trainer("--config", "copy", *TINY, *sets("model.d_ff=100000000000"),
                    "--out", str(tmp_path / "huge"), check=False)  # fmt: skip
    message = error_of(r)
    assert "the weights alone need" in message and "d_ff" in message, message
    assert "--set KEY=VALUE for one of them" in message  # not model.N's alone: d_ff is the one
    state = torch.load(copy_run / "checkpoints/ckpt_00000004.pt", weights_only=True)
    state["config"]["model"]["max_len"] = 10**11
    crafted = tmp_path / "crafted/checkpoints/ckpt_00000004.pt"
    crafted.parent.mkdir(parents=True)
    torch.save(state, crafted)
    r = command("translate", "--checkpoint", crafted, stdin="3 4\n")
    message = error_of(r)
    assert "more than this machine has in all" in message and "checkpoint" in message, message


def test_a_checkpoint_that_would_run_code_is_refused_and_never_run(tmp_path):
    marker = tmp_path / "was-run"

    class Payload:
        def __reduce__(self):
            return (Path.touch, (marker,))

    evil = tmp_path / "run/checkpoints/ckpt_00000001.pt"
    evil.parent.mkdir(parents=True)
    torch.save({"model": Payload()}, evil)
    r = command("translate", "--checkpoint", evil, stdin="3 4\n")
    message = error_of(r)
    assert "would run code when loaded" in message and "not loaded" in message, message
    assert "weights_only" not in message and "False" not in message
    assert not marker.exists()


def test_evaluate_checks_its_device_and_paths_before_decoding(copy_run, tmp_path):
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    for args, says in [
        (["--device", "tpu9"], "--device tpu9: not a device name"),
        (["--device", f"cuda:{torch.cuda.device_count()}"], "this machine has no such device"),
        (["--results", blocked / "results"], "--results"),
        (["--plot", blocked / "run.png"], "--plot"),
        (["--results", ""], "not an empty string"),
    ]:
        said = refused("--run", copy_run, *args, command="evaluate")  # before the run loads
        assert says in said, (args, said)


def test_evaluate_never_writes_its_results_over_a_run_or_other_files(copy_run, tmp_path):
    """--results is replaced as a whole, so a typo must not name a run's folder (this run's,
    one holding it, or another's), a file, or a folder of other files: each is refused before
    decoding, with every file left as it was."""
    other = tmp_path / "other-run"
    (other / "checkpoints").mkdir(parents=True)
    (other / "run.json").write_text("{}")
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    (mixed / "thesis.tex").write_text("mine")
    theirs = tmp_path / "their-results"  # another run's scores
    theirs.mkdir()
    command_of = {"provenance": {"training_command": "python -m annotated.cli.train --out b"}}
    (theirs / "results.json").write_text(json.dumps(command_of))
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    run_files = {p: p.stat().st_mtime_ns for p in copy_run.rglob("*") if p.is_file()}
    for results, says in [
        (copy_run, "holds the run"),
        (copy_run.parent, "holds the run"),
        (".", "holds the run"),
        (other, "is a training run's folder (it has run.json)"),
        (a_file, "is a file"),
        (mixed, "holds other files and no results.json"),
        (theirs, "holds the results of another run (trained with `python -m annotated"),
    ]:
        with contextlib.chdir(copy_run if results == "." else Path.cwd()):
            said = refused("--run", copy_run, "--results", results, command="evaluate")
        assert says in said, (results, said)
    assert before == {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert run_files == {p: p.stat().st_mtime_ns for p in copy_run.rglob("*") if p.is_file()}
    r = run_here("evaluate", "--run", copy_run, "--plot", tmp_path, "--tensorboard", a_file)
    assert r.returncode == 2 and "--plot" in r.stderr and "is a folder" in r.stderr
    r = run_here("train", "--config", "copy", "--out", tmp_path / "new-run", "--plot", tmp_path)
    assert r.returncode == 2 and "--plot" in r.stderr and "is a folder" in r.stderr
    assert not (tmp_path / "new-run").exists()  # refused before anything trained


def test_evaluate_beside_a_live_trainer_lists_again_when_a_checkpoint_is_pruned(
    copy_run, monkeypatch, capsys
):
    real, calls = runs.load_model, []

    def pruned_under_us(paths, device):
        calls.append([p.name for p in paths])
        if len(calls) == 1:
            paths[0].rename(paths[0].with_name("kept-aside.pt"))  # as the trainer's pruning
        return real(paths, device)

    monkeypatch.setattr(runs, "load_model", pruned_under_us)
    held = lock_out_dir(copy_run)
    try:
        with pytest.raises(TrainingError, match="has no test sets"):  # loaded; copy has none
            runs.evaluate_run(copy_run, last=2)
    finally:
        held.close()
        (copy_run / "checkpoints/kept-aside.pt").rename(copy_run / "checkpoints/ckpt_00000003.pt")
    assert calls == [
        ["ckpt_00000003.pt", "ckpt_00000004.pt"],
        ["ckpt_00000002.pt", "ckpt_00000004.pt"],
    ]
    assert "a trainer is still running" in capsys.readouterr().err


def test_results_are_replaced_as_a_whole_or_not_at_all(copy_run, tmp_path, monkeypatch):
    out = tmp_path / "results"
    row = {"source": "3 4", "reference": "3 4", "hypothesis": "3 4"}
    report = {"checkpoints": ["ckpt_00000004.pt"], "beam_size": 4, "alpha": 0.6, "tests": {}}
    runs.write_results(out, copy_run, {**report, "translations": {"dev": [row]}})
    (out / "summary.png").write_bytes(b"a picture drawn into the folder")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    real, written = Path.write_text, []

    def disk_fills(self, text, **kwargs):
        written.append(self.name)
        if len(written) == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, text, **kwargs)

    monkeypatch.setattr(Path, "write_text", disk_fills)
    changed = {**report, "translations": {"dev": [{**row, "hypothesis": "4 3"}]}}
    with pytest.raises(TrainingError, match="left as it was"):
        runs.write_results(out, copy_run, changed)
    monkeypatch.undo()
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    runs.write_results(out, copy_run, changed)
    assert (out / "dev.hyp").read_text() == "4 3\n" and (out / "summary.png").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results"]  # no temporary left


def test_train_refuses_an_empty_out_and_names_a_full_disk(tmp_path, monkeypatch, capsys):
    assert "--out must name a folder" in refused("--config", "copy", *TINY, "--out", "")

    def full(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")  # no file name, as a write gives

    monkeypatch.setattr(Progress, "update", full)
    out = tmp_path / "run"
    code = train_cli.main(["--config", "copy", *TINY, "--no-progress", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and "None" not in err and f"into {out}" in err and "--resume" in err, err


def test_a_resume_without_run_json_still_refuses_another_model(tmp_path):
    out = tmp_path / "run"
    tiny_copy(out, *sets("max_steps=2"))
    (out / "run.json").unlink()
    message = tiny_refused(out, *sets("max_steps=4", "model.d_ff=64"), "--resume")
    assert "written by another run" in message and "model" in message, message


def test_checkpoints_of_an_older_or_newer_format_get_messages(copy_run, tmp_path):
    state = torch.load(copy_run / "checkpoints/ckpt_00000004.pt", weights_only=True)
    older = {k: v for k, v in state.items() if k != "config"}
    newer = {**state, "config": {**state["config"], "model": {**state["config"]["model"]}}}
    newer["config"]["model"]["rotary"] = True  # a model setting this version does not have
    for record, says in [(older, "no config"), (newer, "another version wrote it")]:
        path = tmp_path / f"{says.replace(' ', '-')}.pt"
        torch.save(record, path)
        message = error_of(command("translate", "--checkpoint", path, stdin="3 4\n"))
        assert says in message, message


def test_a_checkpoint_with_a_retired_model_setting_reads_at_its_old_default(copy_run, tmp_path):
    """Records written while the model had attn_dropout and ffn_dropout carry both at 0.0:
    such a checkpoint translates as it did; one trained with either switched on is refused."""
    path = copy_run / "checkpoints/ckpt_00000004.pt"
    state = torch.load(path, weights_only=True)
    expected = command("translate", "--checkpoint", path, stdin="3 4 5\n")
    for value, ok in [(0.0, True), (0.1, False)]:
        model = {**state["config"]["model"], "attn_dropout": value, "ffn_dropout": 0.0}
        earlier = tmp_path / f"earlier-{value}.pt"
        torch.save({**state, "config": {**state["config"], "model": model}}, earlier)
        done = command("translate", "--checkpoint", earlier, stdin="3 4 5\n")
        if ok:
            assert done.returncode == 0 and done.stdout == expected.stdout, done.stderr
        else:
            assert "(attn_dropout=0.1)" in error_of(done) and "since removed" in error_of(done)


def test_a_cache_that_cannot_be_written_names_the_folder_and_the_variable(tmp_path):
    """A read-only home directory with a cold cache, as a file in the cache's way makes it
    for any user, root included: the tokenizer cannot be stored."""
    blocked = tmp_path / "home-file"
    blocked.write_text("not a folder")
    r = run_trainer(
        "--config", "multi30k-cpu", *sets("max_steps=1", "data.vocab=500"),
        "--out", str(tmp_path / "run"), check=False, XDG_CACHE_HOME=str(blocked / "cache"),
    )  # fmt: skip
    message = error_of(r)
    assert "home-file" in message and "XDG_CACHE_HOME" in message, message
    assert "Traceback" not in r.stderr
