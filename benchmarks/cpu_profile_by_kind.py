"""What chapter 11's CPU profile gives in five minutes of training on each kind of CPU: the steps it
fits, the precision the trainer's `auto` chose, and the test2016 score of its averaged last
checkpoints (beam 4, alpha 0.6).

    python benchmarks/cpu_profile_by_kind.py                       # all three kinds, ~20 minutes
    python benchmarks/cpu_profile_by_kind.py --kinds avx2 --minutes 1

Each kind runs the unchanged command line (`python -m annotated.cli.train --config multi30k-cpu
--set max_minutes=5`, then `annotated.cli.evaluate`) in a process of its own. A kind other than
this CPU's own is emulated by running an older CPU's kernels on this one (benchmarks/machine.py):
- native: whatever this CPU is (here, bf16 units);
- avx512: ATEN_CPU_CAPABILITY=avx512, ONEDNN_MAX_CPU_ISA=AVX512_CORE (AVX-512 without bf16);
- avx2: ATEN_CPU_CAPABILITY=avx2, ONEDNN_MAX_CPU_ISA=AVX2 (an ordinary laptop's instructions).
Emulation runs the older kernels at this CPU's clock and memory speed: it says which code runs
and how that code compares, not how fast a real older CPU would be. The summary goes to
results/cpu-profile-by-kind/summary.json, each run's own results beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from annotated.experiments.throughput import matmul_rate  # noqa: E402
from annotated.files import write_text_atomic  # noqa: E402
from annotated.provenance import provenance  # noqa: E402

KINDS = {
    "native": {},
    "avx512": {"ATEN_CPU_CAPABILITY": "avx512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE"},
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
}
DESCRIBE = "import sys, json; sys.path.insert(0, 'benchmarks'); import machine; " + (
    "print(json.dumps(machine.describe_cpu()))"
)


def run_kind(name: str, minutes: float, runs: Path, results: Path, limit: int = 0) -> dict:
    """Train, evaluate and describe the CPU under one kind's kernels; return the summary row.
    `limit`: score only the first sentences of each test set (0: all of them)."""
    env = {k: v for k, v in os.environ.items() if k not in ("ATEN_CPU_CAPABILITY",
                                                             "ONEDNN_MAX_CPU_ISA")}  # fmt: skip
    env.update(KINDS[name])
    # paths as seen from the repository root, where the commands run: no path of this machine
    # goes into their records
    out = Path(os.path.relpath(runs / name, ROOT))
    res = Path(os.path.relpath(results / name, ROOT))
    train = [sys.executable, "-m", "annotated.cli.train", "--config", "multi30k-cpu", "--set",
             f"max_minutes={minutes:g}", "--out", str(out), "--no-progress"]  # fmt: skip
    evaluate = [sys.executable, "-m", "annotated.cli.evaluate", "--run", str(out), "--results",
                str(res), *(["--limit", str(limit)] if limit else [])]  # fmt: skip
    rates = [matmul_rate("cpu") / 1e12]  # the host's speed before and after the training
    subprocess.run(train, env=env, cwd=ROOT, check=True)
    rates.append(matmul_rate("cpu") / 1e12)
    subprocess.run(evaluate, env=env, cwd=ROOT, check=True)
    cpu = json.loads(
        subprocess.run(
            [sys.executable, "-c", DESCRIBE],
            env=env,
            cwd=ROOT,
            check=True,
            capture_output=True,
            text=True,
        ).stdout  # fmt: skip
    )
    record = json.loads((ROOT / res / "results.json").read_text())
    test = record["evaluation"]["tests"]["test2016"]
    return {
        "kind": cpu["kind"],
        "environment": KINDS[name],
        "cpu": cpu,
        "precision": record["training"]["precision"],
        "steps": record["training"]["steps"],
        "training_seconds": record["training"]["seconds"],
        "test2016_sentences": limit or "all",
        "test2016_sacrebleu": test["sacrebleu"],
        "test2016_tokenized_lowercased_bleu": test["tokenized_lowercased_bleu"],
        "results": str(res),
        "matmul_tflops_before_after": rates,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--kinds", default="native,avx512,avx2", help="comma-separated: " +
                    ", ".join(KINDS))  # fmt: skip
    ap.add_argument("--minutes", type=float, default=5.0, help="training time of each run")
    ap.add_argument("--limit", type=int, default=0, help="score the first N test sentences only")
    ap.add_argument("--runs", type=Path, default=ROOT / "runs" / "cpu-profile-by-kind")
    ap.add_argument("--results", type=Path, default=ROOT / "results" / "cpu-profile-by-kind")
    args = ap.parse_args(argv)
    kinds = args.kinds.split(",")
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        print(f"cpu_profile_by_kind: unknown kind {', '.join(unknown)}; choose among "
              f"{', '.join(KINDS)}.", file=sys.stderr)  # fmt: skip
        return 2
    command = "python benchmarks/cpu_profile_by_kind.py " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    report = provenance(command.strip(), "cpu")
    report["minutes"] = args.minutes
    report["kinds"] = {}
    args.results.mkdir(parents=True, exist_ok=True)
    for name in kinds:
        row = run_kind(name, args.minutes, args.runs, args.results, args.limit)
        report["kinds"][name] = row
        print(f"{row['kind']}: {row['precision']}, {row['steps']:,} steps in {args.minutes:g} "
              f"minutes, test2016 {row['test2016_sacrebleu']:.2f} sacreBLEU")  # fmt: skip
        rates = [r for k in report["kinds"].values() for r in k["matmul_tflops_before_after"]]
        report["host_drift"] = (max(rates) - min(rates)) / min(rates) > 0.10
        write_text_atomic(args.results / "summary.json", json.dumps(report, indent=2) + "\n")
    if report["host_drift"]:
        print(f"HOST DRIFT: the float32 matmul rate ranged over {min(rates):.3f}-"
              f"{max(rates):.3f} TFLOP/s across the runs; the kinds' differences include the "
              f"machine's own")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
