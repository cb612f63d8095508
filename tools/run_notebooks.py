"""Execute notebooks, several at a time, so that their stored outputs are fresh.

    python tools/run_notebooks.py                          # every chapter, in place
    python tools/run_notebooks.py notebooks/01_*.ipynb     # some of them
    python tools/run_notebooks.py --out _build/executed    # leave the sources as they are

Runs with ANNOTATED_BOOK=1, as the book build does, so that charts are stored in the form the
book renders offline. `--jobs N` runs N notebooks at once (default: one per core, at most
four), each kernel with its share of the cores as OMP_NUM_THREADS. The longest notebooks of
the last run start first (their times are kept in `_build/notebook-seconds.json`),
and a notebook whose metadata says `"book": {"after": ["13_multi30k_results"]}` starts only
when that one has finished, because it reads what that one trained.
Each notebook is written to a temporary file and renamed, so an interrupted run never leaves a
half-written notebook behind; a notebook that fails is reported with its error and the others
still run. The exit status is 1 when any failed. Ctrl-C stops every notebook within seconds
(exit status 130), and keeps only the notebooks that had finished. The kernels' own stderr
(their logs, not the cells' output) goes to `_build/kernels.log`.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
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
KERNEL_LOG = ROOT / "_build" / "kernels.log"


def run(path: Path, out: Path | None = None, timeout: int = 1800, threads: int = 0) -> float:
    """Execute `path` (in its own folder) and write it to `out` (default: in place)."""
    nb = nbformat.read(path, as_version=4)
    os.environ["ANNOTATED_BOOK"] = "1"
    if threads:
        os.environ["OMP_NUM_THREADS"] = str(threads)  # inherited by the kernel it starts
    start = time.perf_counter()
    KERNEL_LOG.parent.mkdir(parents=True, exist_ok=True)
    with open(KERNEL_LOG, "a") as log:  # the kernels' own stderr: their logs, not cell output
        NotebookClient(
            nb,
            timeout=timeout,
            kernel_name="python3",
            resources={"metadata": {"path": str(path.parent)}},
            shutdown_kernel="immediate",  # at the end, or at Ctrl-C: no wait on a busy kernel
        ).execute(stderr=log)
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
    KERNEL_LOG.unlink(missing_ok=True)  # this run's kernels' logs only
    waiting = sorted(paths, key=lambda p: -float(known.get(p.name, 0)))
    after = {p.name: _after(p) & {q.name for q in paths} for p in paths}
    threads = max(1, (os.cpu_count() or 1) // jobs)
    results: dict[str, float | str] = {}
    pool = ProcessPoolExecutor(max_workers=jobs, initializer=_leave_ctrl_c_to_the_main_process)
    running: dict = {}  # future -> where its notebook is written
    try:
        while waiting or running:
            ready = [p for p in waiting if after[p.name] <= set(results)]
            for p in ready[: jobs - len(running)]:
                waiting.remove(p)
                target = out_dir / p.name if out_dir else None
                running[pool.submit(_job, p, target, timeout, threads)] = target or p
            if not running:  # what is left waits on a notebook that is not being run
                raise SystemExit(f"cannot order: {', '.join(p.name for p in waiting)}")
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                running.pop(future)
                name, seconds, error = future.result()
                results[name] = error or seconds
                print(f"{name}: {'FAILED' if error else f'{seconds:.1f} s'}", flush=True)
                if error:
                    print(error, file=sys.stderr, flush=True)
                else:  # kept at once: an interrupted run still orders the next one
                    known[name] = seconds
                    times.parent.mkdir(exist_ok=True)
                    times.write_text(json.dumps(known, indent=1, sort_keys=True))
    except KeyboardInterrupt:  # Ctrl-C: stop every notebook now, not when each has finished
        _stop(pool, running.values())
        raise Interrupted(results, len(paths)) from None
    pool.shutdown()
    return results


class Interrupted(Exception):
    """Ctrl-C during `run_all`: what had finished, of how many."""

    def __init__(self, results: dict, total: int):
        self.results = results
        done = sum(not isinstance(v, str) for v in results.values())
        super().__init__(
            f"interrupted: {done} of {total} notebooks had finished executing; the others "
            f"were stopped and nothing half-written was kept. Run the same command again."
        )


def exit_now(code: int) -> None:
    """End at once after Ctrl-C: the process pool's exit handler could otherwise wait on a queue
    that a worker ended mid-write will never read again."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _leave_ctrl_c_to_the_main_process() -> None:
    """A terminal sends Ctrl-C to every process of its foreground group: the workers and their
    kernels leave that group, so that only the main process hears it, and stops them."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _unwind)  # `_stop`'s: nbclient shuts its kernel down on the way
    os.setsid()


def _unwind(signum, frame) -> None:
    raise KeyboardInterrupt


def _stop(pool: ProcessPoolExecutor, targets) -> None:
    """End the workers at once (each unwinds through nbclient, which shuts its kernel down; one
    still at it after ten seconds is killed), then remove what one stopped mid-write left."""
    workers = list(getattr(pool, "_processes", {}).values())
    for worker in workers:
        worker.terminate()
    pool.shutdown(wait=False, cancel_futures=True)
    for worker in workers:
        worker.join(timeout=10)
        if worker.is_alive():  # still shutting its kernel down: end it now
            worker.kill()
            worker.join()
    for target in targets:
        Path(target).with_suffix(".ipynb.tmp").unlink(missing_ok=True)


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
    try:
        results = run_all([p.resolve() for p in paths], args.out, args.jobs, args.timeout)
    except Interrupted as e:
        print(e, file=sys.stderr)
        exit_now(130)
    failed = [k for k, v in results.items() if isinstance(v, str)]
    print(f"{len(results)} notebooks in {time.perf_counter() - start:.0f} s, {args.jobs} at a time")
    if failed:
        print(f"failed: {', '.join(sorted(failed))}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
