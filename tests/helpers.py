"""Helpers that several test files share."""

import contextlib
import http.server
import importlib
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
import warnings
from contextlib import contextmanager
from pathlib import Path
from unittest import mock

import torch
from torch import nn

from annotated.batching import PAD, Batch
from annotated.multihead import MultiHeadedAttention

ROOT = Path(__file__).resolve().parent.parent


def padded_batch(vocab: int = 31, seed: int = 0) -> Batch:
    """A random batch of 4 sentences with ragged source and target lengths (one target of a
    single token), so that every padding mask matters."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(3, vocab, (4, 9), generator=g)
    tgt = torch.randint(3, vocab, (4, 8), generator=g)
    src[1, 5:] = PAD
    src[3, 2:] = PAD
    tgt[2, 4:] = PAD
    tgt[3, 1:] = PAD
    return Batch(src, tgt, PAD)


@torch.no_grad()
def copy_attention_into(theirs: nn.MultiheadAttention, ours: MultiHeadedAttention) -> None:
    """Our four projections into torch's layout: Q, K and V stacked in in_proj, then out_proj."""
    theirs.in_proj_weight.copy_(torch.cat([ours.w_q.weight, ours.w_k.weight, ours.w_v.weight]))
    theirs.in_proj_bias.copy_(torch.cat([ours.w_q.bias, ours.w_k.bias, ours.w_v.bias]))
    theirs.out_proj.weight.copy_(ours.w_o.weight)
    theirs.out_proj.bias.copy_(ours.w_o.bias)


class _Handler(http.server.BaseHTTPRequestHandler):
    """Serves `root`; honours `Range: bytes=N-` unless `ranges` is False; cuts the connection
    after `cut` bytes of the next response when `cut` is set. Records each request."""

    root: Path
    ranges = True
    cut: int | None = None
    log: list

    def do_GET(self):
        path = self.root / self.path.lstrip("/")
        if not path.is_file():
            self.send_error(404)
            return
        body = path.read_bytes()
        rng = self.headers.get("Range")
        self.log.append((self.path, rng))
        if rng and self.ranges:
            start = int(rng.removeprefix("bytes=").split("-")[0])
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
            body = body[start:]
        else:
            self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if type(self).cut is not None:  # a dropped connection: part of the body, then nothing
            body, type(self).cut = body[: type(self).cut], None
            self.close_connection = True
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@contextmanager
def serve(folder: Path):
    """An HTTP server for `folder` on 127.0.0.1: yields (base URL, handler class)."""
    handler = type("Handler", (_Handler,), {"root": folder, "log": []})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", handler
    finally:
        httpd.shutdown()
        httpd.server_close()


def toc_files() -> list[str]:
    """The book's pages, in the order of _toc.yml (paths without their suffix)."""
    import yaml  # here, not above: the GPU suite runs these helpers with only torch installed

    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = [toc["root"]]
    for part in toc["parts"]:
        files += [c["file"] for c in part["chapters"]]
    return files


# The trainer through its command line (tests/test_train.py, tests/test_faults.py)
def sets(*overrides: str) -> list[str]:
    """Command-line arguments that apply `key=value` overrides: --set A --set B ..."""
    return [arg for item in overrides for arg in ("--set", item)]


TINY = sets("model.N=1", "model.d_model=16", "model.d_ff=32", "model.h=2", "data.batch_sentences=8")
TINY += sets("log_every=1")


def run_trainer(*args, launcher=None, timeout=300, check=True, cwd=None, **env_extra):
    """`python -m annotated.cli.train --no-progress ARGS` with one thread: in this process when
    nothing calls for another (a launcher, a folder or variables of its own), as a subprocess
    otherwise. Returns its returncode, stdout and stderr."""
    if launcher or cwd or env_extra:
        env = dict(os.environ, OMP_NUM_THREADS="1", **env_extra)
        if cwd:  # the package from this checkout, wherever the command runs
            env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
        cmd = (launcher or [sys.executable, "-m"]) + ["annotated.cli.train", "--no-progress", *args]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)
    else:
        r = run_here("train", "--no-progress", *args)
    if check:
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return r


_SIGNALS = (signal.SIGINT, signal.SIGTERM)  # what a command's process may take over


def run_here(command: str, *args) -> subprocess.CompletedProcess:
    """`python -m annotated.cli.COMMAND ARGS` run in this process with one thread, as a
    subprocess would run it but without the seconds a new process spends importing PyTorch:
    its exit code, standard output and standard error (warnings included, as Python prints
    them). What a process of its own changes (threads, signal handlers) is put back."""
    main = importlib.import_module(f"annotated.cli.{command}").main
    out, err = io.StringIO(), io.StringIO()
    threads, handlers = torch.get_num_threads(), {s: signal.getsignal(s) for s in _SIGNALS}
    printed = lambda m, c, f, n, file=None, line=None: err.write(  # noqa: E731
        warnings.formatwarning(m, c, f, n, line)
    )
    torch.set_num_threads(1)
    try:  # one thread, as run_trainer's subprocesses have it
        with mock.patch.dict(os.environ, OMP_NUM_THREADS="1"), warnings.catch_warnings():
            warnings.simplefilter("default")
            warnings.showwarning = printed
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
                try:
                    code = main([str(a) for a in args])
                except SystemExit as e:  # argparse's own refusals
                    code = e.code if isinstance(e.code, int) else 2
    finally:
        torch.set_num_threads(threads)
        for s, handler in handlers.items():
            signal.signal(s, handler)
    return subprocess.CompletedProcess(
        [command, *map(str, args)], code, out.getvalue(), err.getvalue()
    )


def refused(*args, command: str = "train") -> str:
    """The one-paragraph message with which `python -m annotated.cli.COMMAND ARGS` refuses its
    arguments before it does anything (exit 2), run in this process: a subprocess would spend
    seconds importing PyTorch for a check that takes milliseconds."""
    first = ["--no-progress"] if command == "train" else []
    r = run_here(command, *first, *args)
    last = r.stderr.strip().splitlines()[-1]
    assert r.returncode == 2 and "error:" in last, (r.returncode, r.stderr[-2000:])  # one paragraph
    return last


def tiny_copy(out: Path, *args: str, check: bool = True):
    """The copy configuration at its smallest (TINY), trained into `out`."""
    return run_trainer("--config", "copy", *TINY, *args, "--out", str(out), check=check)


def tiny_refused(out: Path, *args: str) -> str:
    """`refused` for the copy configuration at its smallest (TINY) in `out`."""
    return refused("--config", "copy", *TINY, *args, "--out", out)


def final_weights(out: Path) -> dict:
    last = sorted((out / "checkpoints").glob("ckpt_*.pt"))[-1]
    return torch.load(last, weights_only=True)["model"]


def error_of(r):
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    return r.stderr.strip().splitlines()[-1]


def checkpoint_names(out: Path) -> list[str]:
    return [p.name for p in sorted((out / "checkpoints").glob("ckpt_*.pt"))]


# torchrun as the book launches it (appendix A4): its options, and the trainers' exit code
TORCHRUN_2 = [sys.executable, "-m", "annotated.cli.launch", "--standalone", "--nproc_per_node"]
TORCHRUN_2 += ["2", "-m"]


def killed_then_resumed(tmp_path: Path, args: list[str], steps: int) -> tuple[dict, dict]:
    """Train `args` (a trainer command line without --out) for `steps` steps straight through,
    and again killed with SIGKILL after its first checkpoint, then resumed: both final weights.
    Checks that the kill came mid-run, that its partial file was cleared and that the log ends
    at `steps`."""
    run_trainer(*args, "--out", str(tmp_path / "straight"))
    killed = tmp_path / "killed"
    proc = subprocess.Popen(
        [sys.executable, "-m", "annotated.cli.train", "--no-progress", *args, "--out", str(killed)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    deadline = time.time() + 120
    while (
        not list((killed / "checkpoints").glob("ckpt_*.pt"))
        and time.time() < deadline
        and proc.poll() is None
    ):
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = sorted((killed / "checkpoints").glob("ckpt_*.pt"))
    assert done, "no checkpoint was written before the kill"
    assert int(done[-1].stem.split("_")[1]) < steps, "the run finished before it could be killed"
    run_trainer(*args, "--out", str(killed), "--resume")
    assert not list((killed / "checkpoints").glob("*.tmp"))  # a killed run's partial file
    logged = [
        json.loads(line)["step"] for line in (killed / "metrics.jsonl").read_text().splitlines()
    ]
    assert logged[-1] == steps
    return final_weights(tmp_path / "straight"), final_weights(killed)
