"""Execute notebooks, several at a time, so that their stored outputs are fresh.

    python tools/run_notebooks.py                          # every chapter, in place
    python tools/run_notebooks.py notebooks/01_*.ipynb     # some of them
    python tools/run_notebooks.py --out _build/executed    # leave the sources as they are

Runs with ANNOTATED_BOOK=1, as the book build does, so that charts are stored in the form the
book renders offline. `--jobs N` runs N notebooks at once (default: one per core, at most
four), each kernel with its share of the cores as OMP_NUM_THREADS. The longest notebooks of
the last run start first (their times are kept in `_build/notebook-seconds.json`),
and a notebook whose metadata says `"book": {"after": ["09b_multi30k_results"]}` starts only
when that one has finished, because it reads what that one trained.
Each notebook is written to a temporary file and renamed, so an interrupted run never leaves a
half-written notebook behind; a notebook that fails is reported with its error and the others
still run. The exit status is 1 when any failed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from pathlib import Path

import nbformat
from glue_prose import fill
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent
TIMES = ROOT / "_build" / "notebook-seconds.json"
FIRST_GUESS = ROOT / "tools" / "notebook-seconds.json"  # the order of a first build


def run(path: Path, out: Path | None = None, timeout: int = 1800, threads: int = 0) -> float:
    """Execute `path` (in its own folder) and write it to `out` (default: in place)."""
    nb = nbformat.read(path, as_version=4)
    os.environ["ANNOTATED_BOOK"] = "1"
    if threads:
        os.environ["OMP_NUM_THREADS"] = str(threads)  # inherited by the kernel it starts
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
        if cell.cell_type == "code" and "remove-stderr" in cell.metadata.get("tags", []):
            # what the book hides (a profiler's timestamped log) is not stored either
            cell.outputs = [o for o in cell.outputs if o.get("name") != "stderr"]
    fill(nb, path.name)  # the prose's figures, from the outputs just made (tools/glue_prose.py)
    target = out or path
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".ipynb.tmp")
    nbformat.write(nb, tmp)
    tmp.replace(target)
    return elapsed


def _job(path: Path, out: Path | None, timeout: int, threads: int) -> tuple[str, float, str]:
    try:
        return path.name, run(path, out, timeout, threads), ""
    except Exception as e:  # reported with the notebook's name; the other notebooks go on
        lines = str(e).strip().splitlines()
        return path.name, 0.0, "\n".join([type(e).__name__, *lines[-12:]])  # never empty


def _after(path: Path) -> set[str]:
    """The notebooks this one reads the results of: its metadata's "book": {"after": [...]}."""
    meta = nbformat.read(path, as_version=4).metadata.get("book", {})
    return {f"{name}.ipynb" for name in meta.get("after", [])}


def run_all(
    paths: list[Path], out_dir: Path | None, jobs: int, timeout: int, times: Path = TIMES
) -> dict:
    """Execute `paths`, `jobs` at a time, longest first, each only after the notebooks it reads
    (`_after`) have finished. Returns {name: seconds, or the error}."""
    if not times.exists() and times == TIMES and FIRST_GUESS.exists():
        times.parent.mkdir(exist_ok=True)
        times.write_text(FIRST_GUESS.read_text())  # a fresh checkout: this repository's times
    known = json.loads(times.read_text()) if times.exists() else {}
    waiting = sorted(paths, key=lambda p: -float(known.get(p.name, 0)))
    after = {p.name: _after(p) & {q.name for q in paths} for p in paths}
    threads = max(1, (os.cpu_count() or 1) // jobs)
    results: dict[str, float | str] = {}
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        running: set = set()
        while waiting or running:
            ready = [p for p in waiting if after[p.name] <= set(results)]
            for p in ready[: jobs - len(running)]:
                waiting.remove(p)
                target = out_dir / p.name if out_dir else None
                running.add(pool.submit(_job, p, target, timeout, threads))
            if not running:  # what is left waits on a notebook that is not being run
                raise SystemExit(f"cannot order: {', '.join(p.name for p in waiting)}")
            done, running = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                name, seconds, error = future.result()
                results[name] = error or seconds
                print(f"{name}: {'FAILED' if error else f'{seconds:.1f} s'}", flush=True)
                if error:
                    print(error, file=sys.stderr, flush=True)
                else:  # kept at once: an interrupted run still orders the next one
                    known[name] = seconds
                    times.parent.mkdir(exist_ok=True)
                    times.write_text(json.dumps(known, indent=1, sort_keys=True))
    return results


def default_jobs() -> int:
    return max(1, min(4, os.cpu_count() or 1))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("notebooks", nargs="*", type=Path)
    parser.add_argument("--out", type=Path, help="write executed copies here, not in place")
    parser.add_argument("--jobs", type=int, default=default_jobs())
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per cell")
    args = parser.parse_args(argv)
    paths = args.notebooks or sorted((ROOT / "notebooks").glob("*.ipynb"))
    start = time.perf_counter()
    results = run_all([p.resolve() for p in paths], args.out, args.jobs, args.timeout)
    failed = [k for k, v in results.items() if isinstance(v, str)]
    print(f"{len(results)} notebooks in {time.perf_counter() - start:.0f} s, {args.jobs} at a time")
    if failed:
        print(f"failed: {', '.join(sorted(failed))}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
