"""Everything the book claims about GPUs, measured in one command on any CUDA machine:

    python benchmarks/gpu_suite.py [--json results/benchmarks/gpu-h100.json]
                                   [--parts tests,base,big,wmt14-base,wmt14-big] [--timeout S]

Parts, each run in its own process so that one failure does not hide the others:
- tests: the CUDA tests (tests/test_cuda.py) and the trainer's tests, which run on the GPU when
  there is one;
- multi30k: the GPU profile of chapter 11 trained (eight minutes at most) and scored as chapter
  13 scores it, into --multi30k-results (needs the Multi30k files, e.g. under ANNOTATED_DATA);
- base, big: the training-step benchmark at 25,000 target tokens per step in bf16, every fast-path
  stage against the reference and torch.nn.Transformer, with and without torch.compile; then beam-4
  decoding (cached and uncached), reported in sentences per second;
- wmt14-base, wmt14-big: the fast path of each configuration on batches whose lengths follow real
  WMT sentences: the configured step (25,000 target tokens in the trainer's micro-batches of at
  most the configuration's max_tokens padded tokens, gradients accumulated across them), with
  and without torch.compile and profiled;
  the same tokens as one micro-batch; 3,125 tokens (one of eight GPUs sharing 25,000); and the
  projected hours to 100k and 300k steps. A projection: it multiplies measured step times and
  leaves out all-reduce time, data loading and checkpoints.

On a machine without CUDA it says so and runs nothing. The benchmark parts need only torch; the
tests part needs pytest, pytest-xdist and the package's dependencies (requirements.txt), and
without them is reported as not run. The JSON file holds each part's command,
exit code, output tail and figures, with provenance (commit, device, date, torch version).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
from annotated.files import write_text_atomic
from annotated.provenance import provenance
from annotated.training.registry import table_settings

PARTS = ("tests", "multi30k", "base", "big", "wmt14-base", "wmt14-big")
TESTS = [
    "tests/test_cuda.py",
    "tests/test_train.py",
    "tests/test_fast_path.py",
    "tests/test_decoding.py",
    "tests/test_training.py",
]
STEPS = (100_000, 300_000)
FAST, COMPILED = "fast path (+ fused Adam)", "fast path + torch.compile"
ONLY_FAST = ("--only-fast", "--no-decode", "--no-data")


def run(cmd: list[str], timeout: float) -> dict:
    """Run one part; keep its exit code, duration and the end of its output."""
    start = time.time()
    try:
        r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        code, output = r.returncode, r.stdout + r.stderr
    except subprocess.TimeoutExpired as e:  # text=True: what it printed so far is a str, or None
        code, output = "timeout", (e.stdout or "") + (e.stderr or "")
    print(f"[{time.time() - start:6.0f} s] rc={code} {' '.join(cmd)}", flush=True)
    return {
        "command": " ".join(cmd),
        "returncode": code,
        "seconds": round(time.time() - start, 1),
        "output_tail": output[-4000:],
    }


def benchmark(
    preset: str, tokens: int, tmp: Path, *extra: str, name: str = "", timeout: float = 900
) -> dict:
    out = tmp / f"{preset}-{tokens}-{name or 'run'}.json"
    part = run(
        [
            sys.executable,
            "benchmarks/train_step.py",
            "--preset",
            preset,
            "--tokens",
            str(tokens),
            "--json",
            str(out),
            *extra,
        ],
        timeout,
    )
    if out.exists():
        part["report"] = json.loads(out.read_text())
    return part


def multi30k(tmp: Path, results: Path | None) -> dict:
    """Train the GPU profile `multi30k` (its own budget: eight minutes at most), then evaluate it
    (test2016 and test2017, beam 4, alpha 0.6, the last five checkpoints averaged)."""
    run_dir, results = tmp / "multi30k", results or tmp / "multi30k-results"
    train = [sys.executable, "-m", "annotated.cli.train", "--config", "multi30k"]
    part = {"train": run([*train, "--out", str(run_dir), "--no-progress"], 900)}
    if part["train"]["returncode"] == 0:
        evaluate = [sys.executable, "-m", "annotated.cli.evaluate", "--run", str(run_dir)]
        plot = ["--plot", str(results / "summary.png")]
        part["evaluate"] = run([*evaluate, "--results", str(results), *plot], 600)
        scores = results / "results.json"
        if scores.exists():
            part["scores"] = json.loads(scores.read_text())["evaluation"]["tests"]
    return part


def projection(configured: dict, compiled_run: dict, shard: dict) -> dict:
    """Hours to 100k and 300k steps from measured seconds per step: the configured step on one
    GPU (as configured, without compile, and with it), and one of eight GPUs' share."""

    def seconds(part, path=FAST):
        (training,) = part["report"]["training"].values()  # one precision on CUDA
        return training["results"][path]["median_s_per_step"]

    one, eight = seconds(configured), seconds(shard)
    compiled = seconds(compiled_run, COMPILED)
    return {
        "s_per_step_1_gpu_configured": one,
        "s_per_step_1_gpu_configured_compiled": compiled,
        "s_per_step_1_of_8_gpus_3125_tokens": eight,
        **{f"hours_{n // 1000}k_steps_1_gpu": n * one / 3600 for n in STEPS},
        **{f"hours_{n // 1000}k_steps_1_gpu_compiled": n * compiled / 3600 for n in STEPS},
        **{f"hours_{n // 1000}k_steps_8_gpus_no_allreduce": n * eight / 3600 for n in STEPS},
        "note": "projection: measured step times x steps; "
        "all-reduce, data loading and checkpoints left out",
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--json", type=Path, help="write the suite's report here")
    ap.add_argument(
        "--parts", default=",".join(PARTS), help=f"comma-separated subset of {','.join(PARTS)}"
    )
    ap.add_argument(
        "--timeout",
        type=float,
        default=900,
        help="seconds allowed to each benchmark run (lower it on a machine lent for minutes)",
    )
    ap.add_argument(
        "--multi30k-results",
        type=Path,
        help="multi30k: evaluate's results folder (scores, translations, metrics log, a plot)",
    )
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: the GPU suite has nothing to run here.")
        return 0
    parts = [p for p in args.parts.split(",") if p]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        print(
            f"error: unknown part(s) {', '.join(unknown)}; choose among {', '.join(PARTS)}",
            file=sys.stderr,
        )
        return 2
    command = "python benchmarks/gpu_suite.py " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    report = provenance(command.strip(), torch.device("cuda"))
    report["parts"] = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        needed = ("pytest", "xdist", "sacrebleu", "sacremoses")  # sacremoses: test_decoding.py
        missing = [m for m in needed if not importlib.util.find_spec(m)]
        if "tests" in parts and missing:
            print(f"tests: not run, {', '.join(missing)} missing (pip install -r requirements.txt)")
            report["parts"]["tests"] = {"returncode": "skipped", "missing": missing}
        elif "tests" in parts:
            report["parts"]["tests"] = run(
                [
                    sys.executable,
                    "-m",
                    "pytest",
                    "-q",
                    "-o",
                    "addopts=-ra",
                    "-p",
                    "no:cacheprovider",
                    "-n",
                    "4",
                    *TESTS,
                ],
                900,
            )
        if "multi30k" in parts:
            report["parts"]["multi30k"] = multi30k(tmp, args.multi30k_results)
            save(report, args.json)
        for preset in ("base", "big"):
            if preset in parts:
                report["parts"][preset] = benchmark(
                    preset, 25000, tmp, "--compile", "--rounds", "3", timeout=args.timeout
                )
                save(report, args.json)
        for preset in ("wmt14-base", "wmt14-big"):
            if preset not in parts:
                continue
            runs = report["parts"][preset] = {}
            limit = str(table_settings(preset)["batch.max_tokens"])  # the trainer's micro-batch
            configured = ("--max-tokens", limit, *ONLY_FAST, "--batches", "6")
            for name, extra, tokens in [  # the eager step first: compiling can outlast a limit
                ("configured", ("--profile", *configured), 25000),
                ("configured-compiled", ("--compile", *configured), 25000),
                ("25000", (*ONLY_FAST, "--batches", "6"), 25000),
                ("3125", (*ONLY_FAST, "--batches", "16"), 3125),
            ]:
                runs[name] = benchmark(preset, tokens, tmp, *extra, name=name, timeout=args.timeout)
                save(report, args.json)
            if all("report" in runs[n] for n in ("configured", "configured-compiled", "3125")):
                runs["projection"] = projection(
                    runs["configured"], runs["configured-compiled"], runs["3125"]
                )
    failed = [
        k
        for k, v in report["parts"].items()  # a wmt part holds one run per step shape
        if any(
            r.get("returncode") != 0
            for r in ([v] if "returncode" in v else [r for r in v.values() if "command" in r])
        )
    ]
    report["failed_parts"] = failed
    save(report, args.json)
    if args.json:
        print("wrote", args.json)
    return 1 if failed else 0


def save(report: dict, path: Path | None) -> None:
    """Write the report so far: a part that outlasts a machine's time limit keeps the others."""
    if path:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
