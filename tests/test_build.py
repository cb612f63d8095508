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
