"""Time a whole command and keep the time with its provenance: how long the install, the book's
build or the tests take on this machine, for the README's table of times.

    python tools/timed.py --record results/book-build/install-xeon.json -- make install
    python tools/timed.py --record results/test-runs/xeon.json -- make test
    python tools/timed.py --record FILE --took 212 --load 0.1 -- make install  # timed elsewhere

`--took` records a command that already ran (the install, timed by the shell before this
script's own Python environment existed) instead of running it.

The record holds the command, commit, date, the CPU (its model and kind, benchmarks/machine.py),
the machine's load when the command started, its exit status and its wall time in seconds. A
command that fails is recorded too, with its status, and this script exits with that status.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def cpu() -> dict:
    """This machine's CPU as the benchmarks describe it (model, instruction sets, kind)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from machine import describe_cpu

    return describe_cpu()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--record", type=Path, required=True, help="the JSON file to write")
    parser.add_argument("--took", type=float, help="record SECONDS for a command that already ran")
    parser.add_argument("--load", type=float, help="with --took: the load when it started")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to time after --")
    load = os.getloadavg()[0] if args.load is None else args.load
    start = time.perf_counter()
    try:
        status = 0 if args.took is not None else subprocess.run(command, cwd=ROOT).returncode
    except KeyboardInterrupt:
        print("interrupted: nothing was recorded", file=sys.stderr)
        return 130
    seconds = time.perf_counter() - start if args.took is None else args.took
    sys.path.insert(0, str(ROOT))
    from annotated.files import write_text_atomic
    from annotated.provenance import provenance

    record = provenance(" ".join(command), "cpu") | {"cpu": cpu(), "cpus": os.cpu_count()}
    record |= {"load_at_start": round(load, 2), "status": status, "wall_s": round(seconds, 1)}
    args.record.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(args.record, json.dumps(record, indent=1) + "\n")
    print(f"{' '.join(command)}: {seconds:.0f} s (exit {status}), kept in {args.record}")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
