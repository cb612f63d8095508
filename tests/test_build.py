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


def test_a_chapter_is_executed_again_only_when_an_input_changed(tmp_path, monkeypatch):
    """tools/build_cache.py: a chapter's key follows its cells (not their outputs), the package
    modules it imports or runs and what they import, the results it reads, and the key of the
    chapter it reads the runs of; a module it does not use changes nothing."""
    import shutil

    import build_cache

    shutil.copytree(ROOT / "annotated", tmp_path / "annotated")
    monkeypatch.setattr(build_cache, "ROOT", tmp_path)
    monkeypatch.setattr(build_cache, "PACKAGE", tmp_path / "annotated")
    results = tmp_path / "results" / "x.json"
    results.parent.mkdir()
    results.write_text("{}")
    monkeypatch.setattr(build_cache, "tracked", lambda: frozenset({results}))
    decoding = notebook(tmp_path / "a.ipynb", "from annotated.decoding import greedy_decode")
    cli = notebook(tmp_path / "b.ipynb", "run(['python', '-m', 'annotated.cli.bleu'])")
    reads = notebook(tmp_path / "c.ipynb", "open('../results/x.json')", after=["a"])
    paths = [decoding, cli, reads]
    before = build_cache.keys_in_order(paths)
    assert len(set(before.values())) == 3

    def changed_after(edit) -> set[str]:
        build_cache.imports_of_module.cache_clear()
        edit()
        now = build_cache.keys_in_order(paths)
        return {name for name in now if now[name] != before[name]}

    def append(path: Path, text: str):
        return lambda: path.write_text(path.read_text() + text)

    # multihead.py: imported by decoding.py, so chapter a, and c, which reads a's runs
    assert changed_after(append(tmp_path / "annotated" / "multihead.py", "\n# x\n")) == {
        "a.ipynb", "c.ipynb"
    }  # fmt: skip
    before = build_cache.keys_in_order(paths)
    assert changed_after(append(tmp_path / "annotated" / "cli" / "bleu.py", "\n# y\n")) == {
        "b.ipynb"
    }
    before = build_cache.keys_in_order(paths)
    assert changed_after(append(results, " ")) == {"c.ipynb"}
    # the build's own time records: an input only of a chapter that names their folder
    record = tmp_path / "results" / "book-build" / "xeon.json"
    record.parent.mkdir()
    record.write_text("{}")
    monkeypatch.setattr(build_cache, "tracked", lambda: frozenset({results, record}))
    times = notebook(tmp_path / "d.ipynb", "# reads results/book-build/\nopen('../results')")
    paths.append(times)
    before = build_cache.keys_in_order(paths)
    assert changed_after(append(record, " ")) == {"d.ipynb"}
    before = build_cache.keys_in_order(paths)
    nb = nbformat.read(cli, as_version=4)
    nb.cells[0].outputs = [nbformat.v4.new_output("stream", text="an output")]
    assert changed_after(lambda: nbformat.write(nb, cli)) == set()  # outputs are not inputs
    nb.cells[0].source += "  # edited"
    assert changed_after(lambda: nbformat.write(nb, cli)) == {"b.ipynb"}


def test_the_build_reuses_chapters_whose_key_it_kept(tmp_path, monkeypatch):
    import build_cache

    monkeypatch.setattr(build_cache, "KEYS", tmp_path / "keys")
    out = tmp_path / "out"
    out.mkdir()
    a = notebook(tmp_path / "a.ipynb", "x = 1")
    b = notebook(tmp_path / "b.ipynb", "y = 2")
    redo, keys = build_cache.stale([a, b], out)
    assert redo == [a, b]
    for p in (a, b):
        (out / p.name).write_text("executed")
        build_cache.keep(p.name, keys[p.name])
    assert build_cache.stale([a, b], out)[0] == []
    (out / "b.ipynb").unlink()  # an executed copy lost: executed again
    assert build_cache.stale([a, b], out)[0] == [b]
    build_cache.forget("a.ipynb")
    assert build_cache.stale([a, b], out)[0] == [a, b]


def test_only_a_full_passing_run_of_the_suite_keeps_its_times():
    """The root conftest keeps the suite's time and slowest tests after `make test` (every test
    path, nothing selected), not after a run of some tests."""
    import importlib.util
    from types import SimpleNamespace

    import pytest

    spec = importlib.util.spec_from_file_location("root_conftest", ROOT / "conftest.py")
    root_conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(root_conftest)
    _full_run = root_conftest._full_run

    def config(source, keyword="", markexpr="", deselect=None):
        option = SimpleNamespace(keyword=keyword, markexpr=markexpr, deselect=deselect)
        return SimpleNamespace(
            args_source=source, ArgsSource=pytest.Config.ArgsSource, option=option
        )

    paths, args = pytest.Config.ArgsSource.TESTPATHS, pytest.Config.ArgsSource.ARGS
    assert _full_run(config(paths))
    assert not _full_run(config(args))  # pytest tests/test_x.py
    assert not _full_run(config(paths, keyword="cache"))  # pytest -k cache
    assert not _full_run(config(paths, markexpr="not slow"))
    assert not _full_run(config(paths, deselect=["notebooks/x.ipynb"]))


RECORDED_TIMES = {  # the README's row -> its records (Intel Xeon, AMD EPYC), the seconds field
    "`make install`": (("book-build/install-intel-r-xeon-r-processor.json",
                        "book-build/install-amd-epyc.json"), "wall_s"),
    "`make book`, every chapter executed": (("book-build/intel-r-xeon-r-processor.json",
                                             "book-build/amd-epyc.json"), "total_s"),
    "`make book` again, after one chapter changed": (
        ("book-build/rebuild-intel-r-xeon-r-processor.json", "book-build/rebuild-amd-epyc.json"),
        "wall_s",
    ),
    "`make test`": (("test-runs/make-test-intel-r-xeon-r-processor.json",
                     "test-runs/make-test-amd-epyc.json"), "wall_s"),
}  # fmt: skip


def test_the_readmes_times_are_those_of_its_records():
    """Each time in the README's table is its record's, in minutes to one decimal, one column
    per kind of CPU."""
    import re

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for row, (names, field) in RECORDED_TIMES.items():
        said = re.search(rf"^\| {re.escape(row)} \| ([\d.]+) \| ([\d.]+) \|$", readme, re.M)
        assert said, f"the README has no row {row!r} with a time per CPU"
        for column, name in enumerate(names, start=1):
            record = json.loads((ROOT / "results" / name).read_text())
            assert float(said[column]) == round(record[field] / 60, 1), (row, name)
            assert record["commit"] and (record.get("status", 0) == 0 or record.get("note")), name


def test_make_tests_notebook_kernels_run_on_another_cpus_kernels(tmp_path):
    """With ANNOTATED_NOTEBOOK_CPU=other, as `make test` sets it, a notebook's kernel starts
    under tools/other_cpu.py's settings and two threads (conftest.py); without it, under the
    machine's own kernels. A cell's failed assertion fails its nbval item."""
    import os
    import subprocess
    from xml.etree import ElementTree

    import torch
    from other_cpu import settings

    ignored = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "PYTEST_ADDOPTS")
    env = {k: v for k, v in os.environ.items() if k not in ignored} | {"OMP_NUM_THREADS": "1"}

    def nbval(mode: str, *expected: tuple[str, str]) -> list[bool]:
        """Whether each notebook, asserting one of `expected`, passes under `mode`."""
        books = []
        for i, found in enumerate(expected):
            code = "import os, torch\nfound = torch.backends.cpu.get_cpu_capability()\n"
            code += f"assert (found, os.environ.get('OMP_NUM_THREADS')) == {found!r}, found"
            books.append(notebook(tmp_path / f"{mode or 'own'}-{i}.ipynb", code))
        command = [sys.executable, "-m", "pytest", "-c", str(ROOT / "pyproject.toml")]
        report = tmp_path / f"{mode or 'own'}.xml"
        command += ["-p", "conftest", "-q", f"--junitxml={report}", *map(str, books)]
        run = dict(env, ANNOTATED_NOTEBOOK_CPU=mode)
        result = subprocess.run(command, cwd=ROOT, env=run, capture_output=True, text=True)
        assert result.returncode in (0, 1), result.stdout[-3000:] + result.stderr[-3000:]
        cases = ElementTree.parse(report).iter("testcase")  # in the order the notebooks ran
        return [case.find("failure") is None for case in cases]

    other = settings()["ATEN_CPU_CAPABILITY"].upper()
    # the second notebook's check fails, as it should: a failed assertion fails its item
    assert nbval("other", (other, "2"), ("?", "2")) == [True, False]
    assert nbval("", (torch.backends.cpu.get_cpu_capability(), "1")) == [True]
