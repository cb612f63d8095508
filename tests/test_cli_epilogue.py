"""Appendix A3's epilogue: every command line ends through `run_command`, which turns each way
of stopping early into one paragraph on standard error and an exit code: 2 for an error the
reader can fix, 75 for a run that saved its step when asked to stop, 130 for Ctrl-C. A bug keeps
its traceback."""

import errno
from dataclasses import replace

import pytest
import torch
import torch.distributed as dist

import annotated
from annotated.cli import ablate, bleu, evaluate, export, prepare, translate
from annotated.cli import train as train_cli
from annotated.cli.epilogue import Epilogue, run_command
from annotated.errors import ConfigError, Preempted, TrainingError

from helpers import refused

END = Epilogue(
    interrupted="nothing was written; run the same command again",
    kept="the checkpoints in runs/x are intact",
    writes="into runs/x",
    folders="--out for the run",
    memory="use a smaller --beam",
)
GPU_FULL = "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 15 GiB"


def raising(error: BaseException):
    def body(*args, **kwargs):
        raise error

    return body


def ended(capsys, body, end: Epilogue = END) -> tuple[int, str]:
    """The exit code and the paragraph: one line on standard error, no traceback."""
    code = run_command(body, end)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return code, err.strip()


@pytest.mark.parametrize(
    "error, code, says",
    [
        (ConfigError("max_steps=0: it must be at least 1."), 2, "error: max_steps=0: it must"),
        (Preempted("stopped by SIGTERM at step 7, after saving it."), 75, "stopped: stopped by"),
        (KeyboardInterrupt(), 130, "interrupted: nothing was written; run the same command again."),
        (
            torch.OutOfMemoryError(GPU_FULL),
            2,
            "error: the GPU ran out of memory (CUDA out of memory. Tried to allocate 2.00 GiB). "
            "Use a smaller --beam, then run the same command again.",
        ),
        (RuntimeError("DefaultCPUAllocator: can't allocate memory"), 2, "this machine ran out"),
        (
            OSError(errno.ENOSPC, "No space left on device"),  # a write names no file
            2,
            "error: could not write into runs/x: No space left on device. The checkpoints in "
            "runs/x are intact; free some space, then run the same command again.",
        ),
        (
            PermissionError(errno.EACCES, "Permission denied", "runs/x/log"),
            2,
            "could not write runs/x/log: Permission denied. The checkpoints in runs/x are "
            "intact; make that folder writable, or choose another (--out for the run), then",
        ),
    ],
)
def test_each_way_of_stopping_early_has_its_code_and_one_paragraph(capsys, error, code, says):
    got, err = ended(capsys, raising(error))
    assert got == code and says in err, (got, err)


def test_a_file_where_a_folder_is_needed_is_named(capsys, tmp_path):
    """--out runs/x where runs is a file: the file is what the message names, not the rights."""
    (tmp_path / "runs").write_text("a file")
    for error in (
        NotADirectoryError(errno.ENOTDIR, "Not a directory", str(tmp_path / "runs" / "x")),
        FileExistsError(errno.EEXIST, "File exists", str(tmp_path / "runs")),
    ):
        got, err = ended(capsys, raising(error))
        assert (
            got == 2
            and f"{tmp_path / 'runs'} is a file, where a folder is needed. Move the "
            "file, or choose another folder (--out for the run), then run the same command "
            "again."
            in err
        ), err


def test_a_name_too_long_to_look_up_is_a_message(capsys):
    """--out with a 5,000-character name: the check for a file in its way raised the system's
    own OSError (a traceback, exit 1); now the name is too long, and the remedy is a shorter one."""
    long = "x" * 5000
    got, err = ended(capsys, raising(OSError(errno.ENAMETOOLONG, "File name too long", long)))
    assert got == 2 and "File name too long" in err and "choose a shorter name" in err, err
    assert "Traceback" not in err


def test_a_bug_keeps_its_traceback(capsys):
    for bug in (ZeroDivisionError("a bug"), RuntimeError("a bug"), ValueError("a bug")):
        with pytest.raises(type(bug), match="a bug"):
            run_command(raising(bug), END)
    lost = RuntimeError("[gloo] Connection closed by peer")  # a peer, but no process group
    with pytest.raises(RuntimeError, match="Connection closed"):
        run_command(raising(lost), replace(END, peers=True))
    assert capsys.readouterr().err == ""


def test_a_command_names_more_errors_as_the_readers_to_fix(capsys):
    long_line = ValueError("translate: line 3 has 700 tokens; this model translates at most 461")
    too_long = replace(END, expected=(ValueError,))
    assert ended(capsys, raising(long_line), too_long) == (2, f"error: {long_line}")
    exporting = replace(too_long, task="export to served/ct2")
    code, err = ended(capsys, raising(ValueError("int3 is not a valid type")), exporting)
    assert (code, err) == (2, "error: could not export to served/ct2: int3 is not a valid type")
    code, err = ended(capsys, raising(ConfigError("--to onnx x: x exists")), exporting)
    assert err == "error: --to onnx x: x exists"  # an expected error already says where


def test_ctrl_c_in_a_lower_layers_words_still_exits_130(capsys):
    """The trainer catches Ctrl-C to name the last checkpoint; the code stays Ctrl-C's."""

    def training():
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise TrainingError("interrupted at step 3; the last checkpoint is c3.pt.") from None

    sweep = replace(END, stopped="of the sweep, the rows already scored are kept")
    code, err = ended(capsys, training, sweep)
    assert code == 130, err
    assert err == (
        "stopped: interrupted at step 3; the last checkpoint is c3.pt. "
        "Of the sweep, the rows already scored are kept."
    )


def test_a_peer_that_died_is_reported_and_the_process_group_closed(tmp_path, capsys):
    store = f"file://{tmp_path / 'store'}"
    dist.init_process_group("gloo", init_method=store, rank=0, world_size=1)
    try:
        lost = RuntimeError("[../gloo/transport/tcp/pair.cc:534] Connection closed by peer\n...")
        code, err = ended(capsys, raising(lost), replace(END, peers=True, again="--resume"))
        closed = not dist.is_initialized()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    assert code == 2 and closed, err
    assert err.startswith("error: another process of this run stopped ([../gloo/"), err
    assert "The checkpoints in runs/x are intact; find the cause" in err and "..." not in err


@pytest.mark.parametrize("command", ["train", "translate", "evaluate", "bleu", "ablate",
                                     "prepare", "export"])  # fmt: skip
@pytest.mark.parametrize(
    "error, code, says",
    [
        (KeyboardInterrupt(), 130, "interrupted: "),
        (TrainingError("what went wrong, where, and what to do"), 2, "error: what went wrong"),
    ],
)
def test_every_command_ends_through_the_epilogue(
    command, error, code, says, tmp_path, monkeypatch, capsys
):
    """Each command's work stopped at its first call into a chapter's code."""
    pair = [tmp_path / "a.txt", tmp_path / "b.txt"]
    for path in pair:
        path.write_text("3 4 5\n")
    module, work, argv = {
        "train": (train_cli, "train", ["--config", "copy", "--out", tmp_path / "run"]),
        "translate": (translate, "read_model", ["--checkpoint", tmp_path / "c.pt"]),
        "evaluate": (evaluate, "evaluate_run", ["--run", tmp_path, "--device", "cpu"]),
        "bleu": (bleu, "score_translations", ["--hyp", pair[0], "--ref", pair[1]]),
        "ablate": (ablate, "run_variation", ["--runs", tmp_path / "r", "--results", tmp_path]),
        "prepare": (prepare, "prepare_parallel",
                    ["--src", pair[0], "--tgt", pair[1], "--out", tmp_path / "data"]),
        "export": (export, "load_model",
                   ["--checkpoint", tmp_path / "c.pt", "--to", "onnx", tmp_path / "served"]),
    }[command]  # fmt: skip
    monkeypatch.setattr(module, work, raising(error))
    assert module.main([str(a) for a in argv]) == code
    err = capsys.readouterr().err
    assert err.startswith(says) and err.count("\n") == 1 and "Traceback" not in err, err


def test_sigterm_ends_a_command_as_ctrl_c_does_with_its_temporary_files_removed(tmp_path):
    """`kill` (SIGTERM) during a command that does not save and stop itself (prepare, export,
    evaluate, translate): the temporary file of the write under way is removed, one paragraph
    says what was kept, and the exit code is 143 (128 + SIGTERM). Outside the command the
    handler is the one before it."""
    import signal
    import subprocess
    import sys

    program = f"""
import signal, sys, time
from pathlib import Path
from annotated.cli.epilogue import Epilogue, run_command
from annotated.files import atomic_path
before = signal.getsignal(signal.SIGTERM)
def body():
    with atomic_path(Path({str(tmp_path)!r}) / "out.txt") as tmp:
        tmp.write_text("half")
        print("writing", flush=True)
        time.sleep(60)
code = run_command(body, Epilogue(interrupted="nothing was written; run it again"))
assert signal.getsignal(signal.SIGTERM) is before
sys.exit(code)
"""
    proc = subprocess.Popen(
        [sys.executable, "-c", program], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline() == "writing\n"
    assert [p.name for p in tmp_path.iterdir()]  # the temporary file, mid-write
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 143, err
    assert err.strip() == "terminated (SIGTERM): nothing was written; run it again."
    assert list(tmp_path.iterdir()) == []  # neither the file nor its temporary copy


def test_every_command_says_its_version(capsys):
    """--version names the command and the package's version, and exits 0; `launch`, whose
    options are torchrun's, says it too."""
    from annotated.cli import launch

    version = annotated.__version__
    for module in (ablate, bleu, evaluate, export, prepare, translate, train_cli):
        with pytest.raises(SystemExit) as stop:
            module.main(["--version"])
        assert stop.value.code == 0
        name = module.__name__
        assert capsys.readouterr().out.strip() == f"python -m {name} {version}", name
    assert launch.main(["--version"]) == 0
    said = capsys.readouterr().out
    assert (
        said.startswith(f"python -m annotated.cli.launch {version} ") and torch.__version__ in said
    )


SIGNALS_AT_START = [("SIGINT", 130, "interrupted"), ("SIGTERM", 143, "terminated (SIGTERM)")]


@pytest.mark.parametrize("name, code, said", SIGNALS_AT_START)
def test_ctrl_c_while_a_command_imports_pytorch_ends_it_without_a_traceback(
    tmp_path, name, code, said
):
    """`python -m annotated.cli.NAME` spends its first second or two importing PyTorch, before
    run_command is there to catch Ctrl-C or `kill`: the command lines' package, imported first,
    makes it end quietly too. The signal comes while torch's library is being loaded."""
    import signal
    import subprocess
    import sys
    import time

    cmd = [sys.executable, "-m", "annotated.cli.train", "--config", "copy", "--out", str(tmp_path)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while "libtorch" not in open(f"/proc/{proc.pid}/maps").read() and time.time() < deadline:
        time.sleep(0.002)
    proc.send_signal(getattr(signal, name))
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code and "Traceback" not in err, err[-2000:]
    assert f"{said} as it started; nothing was done." in err or f"{said}:" in err, err
    assert not any(tmp_path.iterdir())  # nothing was written


def test_threads_default_to_the_free_cores_or_omp_num_threads(monkeypatch):
    """use_threads: --threads N sets N; without it, OMP_NUM_THREADS is left as the user set it,
    and otherwise the threads are the cores less the machine's load, at least one."""
    import argparse
    import os

    import torch

    from annotated.cli.epilogue import use_threads

    ap = argparse.ArgumentParser()
    before = torch.get_num_threads()
    try:
        assert use_threads(ap, 1) == 1
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        torch.set_num_threads(2)
        monkeypatch.setattr(os, "getloadavg", lambda: (5.0, 0.0, 0.0))
        assert use_threads(ap, None) == 1  # a busy machine: one thread
        torch.set_num_threads(2)
        monkeypatch.setattr(os, "getloadavg", lambda: (0.2, 0.0, 0.0))
        assert use_threads(ap, None) == 2  # an idle one: every core PyTorch would use
        monkeypatch.delattr(os, "getloadavg")  # Windows
        torch.set_num_threads(2)
        assert use_threads(ap, None) == 2
        monkeypatch.setenv("OMP_NUM_THREADS", "1")
        torch.set_num_threads(2)
        assert use_threads(ap, None) == 2  # the user's setting stands
        for wrong in (0, -1, 4 * (os.cpu_count() or 1) + 1, 100_000):  # 100,000: libgomp's
            with pytest.raises(SystemExit) as stop:  # out-of-memory abort, exit 1, before
                use_threads(ap, wrong)
            assert stop.value.code == 2
    finally:
        torch.set_num_threads(before)


def test_the_memory_message_works_where_the_system_does_not_say_how_much_there_is(monkeypatch):
    import os

    from annotated.errors import memory_bytes

    assert 0 < memory_bytes() < float("inf")
    monkeypatch.delattr(os, "sysconf")  # Windows
    assert memory_bytes() == float("inf")


def test_a_command_takes_ctrl_c_back_once_it_is_ready():
    """`cli.starting` holds Ctrl-C while a command imports PyTorch; `ready` gives it back to
    Python (KeyboardInterrupt) and leaves any other handler, one of the caller's, alone."""
    import signal

    from annotated.cli import starting

    before = signal.getsignal(signal.SIGINT)
    try:
        signal.signal(signal.SIGINT, starting._interrupted)  # as `python -m` starts a command
        starting.ready()
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # someone else's choice
        starting.ready()
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)


def test_the_cpu_processes_of_one_run_share_the_cores(monkeypatch):
    """torchrun's CPU processes on one machine each take at most their share of its cores,
    whatever OMP_NUM_THREADS they inherit: threads beyond the cores wait on each other, and a
    two-process run on two cores took four times as long with two threads each. --threads wins."""
    import argparse
    import os

    from annotated.cli.epilogue import use_threads

    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("OMP_NUM_THREADS", "8")
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(8)
        assert use_threads(argparse.ArgumentParser(), None) == 2
        assert use_threads(argparse.ArgumentParser(), 3) == 3
        monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")  # one process: the inherited choice
        torch.set_num_threads(5)
        assert use_threads(argparse.ArgumentParser(), None) == 5
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("name", ["../etc", "os path", ".relative", "a..b"])
def test_an_import_that_is_no_module_name_is_a_usage_error(name, tmp_path):
    """--import takes a module's name: a path or a relative name was a TypeError's traceback."""
    said = refused("--checkpoint", tmp_path / "x.pt", "--import", name, command="translate")
    assert f"--import {name}: not a module name" in said, said
