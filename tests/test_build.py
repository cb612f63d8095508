"""The book's build: chapters run several at a time, each after the chapters it reads, and a
failing chapter is reported by name without stopping the others (tools/run_notebooks.py)."""

import json
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

from run_notebooks import run_all  # noqa: E402


def notebook(path: Path, code: str, after: list[str] | None = None) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(code)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3"}
    if after:
        nb.metadata["book"] = {"after": after}
    nbformat.write(nb, path)
    return path


def test_a_chapter_starts_after_the_one_it_reads_and_failures_are_named(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    writer = "import time, pathlib\ntime.sleep(3)\npathlib.Path('mark').write_text('trained')"
    reader = "import pathlib\nprint(pathlib.Path('mark').read_text())"
    paths = [
        notebook(src / "b_reads.ipynb", reader, after=["a_writes"]),
        notebook(src / "a_writes.ipynb", writer),
        notebook(src / "c_fails.ipynb", "raise ValueError('on purpose')"),
    ]
    times = tmp_path / "seconds.json"
    results = run_all(paths, out, jobs=2, timeout=60, times=times)
    assert isinstance(results["a_writes.ipynb"], float)
    assert isinstance(results["b_reads.ipynb"], float)  # it found the mark: it ran after
    assert "on purpose" in results["c_fails.ipynb"]
    executed = nbformat.read(out / "b_reads.ipynb", as_version=4)
    assert executed.cells[0].outputs[0]["text"] == "trained\n"
    assert not (out / "c_fails.ipynb").exists()  # a failed chapter writes nothing
    assert set(json.loads(times.read_text())) == {"a_writes.ipynb", "b_reads.ipynb"}
    assert not list(src.glob("*.tmp")) and not list(out.glob("*.tmp"))


def test_ctrl_c_stops_the_build_within_seconds_and_the_next_build_passes(tmp_path):
    """Ctrl-C (SIGINT to the whole process group, as a terminal sends it) while two notebooks
    run: one line, exit 130 within seconds, no kernel left running, nothing half-written; then
    the same command builds everything."""
    import os
    import signal
    import subprocess
    import time

    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    pidfile = tmp_path / "kernel-pids"
    marker = (f"import os, time\nopen({str(pidfile)!r}, 'a').write(f'{{os.getpid()}}\\n')\n"
              f"time.sleep(0 if os.environ.get('QUICK') else 120)")  # fmt: skip
    for name in ("a", "b", "c"):
        notebook(src / f"{name}.ipynb", marker)
    command = [sys.executable, str(ROOT / "tools" / "run_notebooks.py"), "--jobs", "2"]
    command += ["--out", str(out), *(str(src / f"{n}.ipynb") for n in "abc")]
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,  # its own process group, as a terminal's foreground job has
        # and Ctrl-C heard, as from a terminal: a background job (`make test &`, CI) ignores
        # SIGINT, and its children would inherit that
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    deadline = time.time() + 120
    while (not pidfile.exists() or len(pidfile.read_text().split()) < 2) and time.time() < deadline:
        time.sleep(0.1)  # both kernels are in their long cell
    os.killpg(proc.pid, signal.SIGINT)
    start = time.time()
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
        raise AssertionError(f"still running 60 s after Ctrl-C; its stderr:\n{err}") from None
    assert time.time() - start < 15 and proc.returncode == 130, (proc.returncode, err)
    assert "interrupted: 0 of 3 notebooks had finished executing" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    time.sleep(2)  # each kernel notices within a second that its parent is gone
    for pid in map(int, pidfile.read_text().split()):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        os.kill(pid, signal.SIGKILL)
        raise AssertionError(f"kernel {pid} was still running")
    assert not out.exists() or not list(out.iterdir())  # nothing written, half or whole
    again = subprocess.run(command, capture_output=True, text=True, timeout=300,
                           env=dict(os.environ, QUICK="1"))  # fmt: skip
    assert again.returncode == 0, again.stderr[-2000:]
    assert sorted(p.name for p in out.iterdir()) == ["a.ipynb", "b.ipynb", "c.ipynb"]
