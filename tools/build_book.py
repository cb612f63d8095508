"""Build the book: execute every chapter, then render the executed copies.

    python tools/build_book.py [--jobs N]      # what `make book` runs
    python tools/build_book.py --force         # execute every chapter (`make book FORCE=1`)
    python tools/build_book.py --record results/book-build/NAME.json   # all, and keep the times

1. `run_notebooks.run_all` executes the chapters of `_toc.yml`, several at a time, into
   `_build/source/notebooks/`: the sources in `notebooks/` are never written to, so a build
   stopped half-way leaves them as they were. A chapter whose inputs (its cells, the package
   code it uses, the results it reads: `tools/build_cache.py`) are those of its executed copy
   is not executed again.
2. `_build/source/` gets the rest of the book's source (the table of contents, `book/`, and
   `_config.yml` with execution off), and Jupyter Book renders it into `_build/html/`, with
   warnings as errors.

The time of each part goes to `_build/build-seconds.json` and is printed at the end; with
`--record FILE` it is also written to FILE with its provenance (command, commit, device, date,
the machine's load when the build started) and each chapter's execution time.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import build_cache
import yaml
from run_notebooks import Interrupted, default_jobs, exit_now, run_all

ROOT = Path(__file__).resolve().parent.parent
STAGE = ROOT / "_build" / "source"


def chapters() -> list[Path]:
    """The notebooks of the table of contents, in its order."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = [c["file"] for part in toc["parts"] for c in part["chapters"]]
    return [ROOT / f"{f}.ipynb" for f in files if (ROOT / f"{f}.ipynb").exists()]


def stage() -> None:
    """Everything Jupyter Book reads besides the executed notebooks, under STAGE."""
    STAGE.mkdir(parents=True, exist_ok=True)
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    config["execute"]["execute_notebooks"] = "off"  # executed already, by run_all
    (STAGE / "_config.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    shutil.copy(ROOT / "_toc.yml", STAGE / "_toc.yml")
    link = STAGE / "book"
    if not link.is_symlink():
        shutil.rmtree(link, ignore_errors=True)
        link.symlink_to(os.path.relpath(ROOT / "book", STAGE))


def render() -> int:
    jb = shutil.which("jupyter-book", path=str(Path(sys.executable).parent)) or "jupyter-book"
    command = [jb, "build", str(STAGE), "--path-output", str(ROOT)]
    command += ["--warningiserror", "--keep-going", "--quiet"]
    return subprocess.run(command, cwd=ROOT).returncode


def record(path: Path, times: dict, results: dict) -> None:
    from annotated.files import write_text_atomic
    from annotated.provenance import provenance

    command = " ".join(["python tools/build_book.py", *sys.argv[1:]])
    chapters = {k: round(v, 1) for k, v in sorted(results.items()) if isinstance(v, float)}
    from timed import cpu

    out = provenance(command, "cpu") | {"cpu": cpu(), "cpus": os.cpu_count()} | times
    out |= {"chapters": chapters}
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(out, indent=1) + "\n")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=default_jobs())
    parser.add_argument("--record", type=Path, help="also write the times here, with provenance")
    parser.add_argument(
        "--force",
        action="store_true",
        help="execute every chapter, even those whose inputs are unchanged since the last build",
    )
    args = parser.parse_args(argv)
    try:
        return build(args)
    except Interrupted as e:
        print(f"{e} The book was not rendered.", file=sys.stderr)
        exit_now(130)
    except KeyboardInterrupt:
        print("interrupted while rendering: _build/html is incomplete. Run the same command "
              "again.", file=sys.stderr)  # fmt: skip
    return 130


def keep_keys(results: dict, keys: dict) -> None:
    for name, value in results.items():
        if not isinstance(value, str):  # executed without an error
            build_cache.keep(name, keys[name])


def build(args) -> int:
    load = os.getloadavg()[0]
    start = time.perf_counter()
    stage()
    paths = chapters()
    redo, keys = build_cache.stale(paths, STAGE / "notebooks")
    redo = paths if args.force or args.record else redo  # a record times every chapter
    for p in redo:
        build_cache.forget(p.name)  # until it has executed again
    if len(redo) < len(paths):
        print(f"reusing {len(paths) - len(redo)} chapters whose inputs are unchanged "
              f"(--force executes them too)", flush=True)  # fmt: skip
    try:
        results = run_all(redo, STAGE / "notebooks", args.jobs, timeout=1800) if redo else {}
    except Interrupted as e:
        keep_keys(e.results, keys)  # the chapters that finished need not execute again
        raise
    keep_keys(results, keys)
    failed = sorted(k for k, v in results.items() if isinstance(v, str))
    executed = time.perf_counter() - start
    if failed:
        print(f"not built: {', '.join(failed)} failed (above)", file=sys.stderr)
        return 1
    code = render()
    total = time.perf_counter() - start
    times = {"execute_s": round(executed, 1), "render_s": round(total - executed, 1)}
    times |= {"total_s": round(total, 1), "jobs": args.jobs, "cpus": os.cpu_count()}
    times |= {"reused": len(paths) - len(redo)}
    (ROOT / "_build" / "build-seconds.json").write_text(json.dumps(times, indent=1))
    if args.record:
        record(args.record, times | {"load_at_start": load}, results)
    print(
        f"executed {len(results)} chapters in {executed:.0f} s ({args.jobs} at a time; "
        f"{len(paths) - len(redo)} reused), rendered in {total - executed:.0f} s: "
        f"{total:.0f} s in all"
    )
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
