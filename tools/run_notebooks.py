"""Execute notebooks in place so that their stored outputs are fresh (nbval compares against them).

    python tools/run_notebooks.py                      # every notebook, in order
    python tools/run_notebooks.py notebooks/01_*.ipynb # some of them

Runs with ANNOTATED_BOOK=1, as the book build does, so that charts are stored in the form
the book renders offline. Each notebook is written to a temporary file and renamed, so an
interrupted run never leaves a half-written notebook behind.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent


def run(path: Path, timeout: int = 1200) -> float:
    nb = nbformat.read(path, as_version=4)
    os.environ["ANNOTATED_BOOK"] = "1"
    start = time.perf_counter()
    NotebookClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
    ).execute()
    elapsed = time.perf_counter() - start
    for cell in nb.cells:  # keep diffs quiet: no per-run metadata
        cell.metadata.pop("execution", None)
    tmp = path.with_suffix(".ipynb.tmp")
    nbformat.write(nb, tmp)
    tmp.replace(path)
    return elapsed


def main(argv: list[str]) -> int:
    paths = [Path(a) for a in argv] or sorted((ROOT / "notebooks").glob("[0-9][0-9]*_*.ipynb"))
    for p in paths:
        print(f"{p.name}: {run(p):.1f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
