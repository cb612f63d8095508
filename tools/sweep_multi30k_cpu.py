"""The sweep that chose the multi30k-cpu profile: each trial trains chapter 9's CPU configuration
with some settings changed, for as many steps as fit in a training budget (5 minutes by default)
on this machine, then translates test2016 with beam 4 from the average of its kept checkpoints.

    python tools/sweep_multi30k_cpu.py --trials bf16,bf16-lr1             # run two trials
    python tools/sweep_multi30k_cpu.py --list                             # what each trial changes

The step budget of a trial is fixed before it trains: 20 steps are timed (after one untimed step;
the first trials timed 5) and max_steps is the budget divided by their median, rounded down to a
multiple of 20. The timed batches are a sample, so a trial can still overrun its budget: its
record says so (`over_budget`), and `--steps N` repeats it with N steps. The schedule does not
depend on max_steps and training is seeded, so the repeat is the same run, stopped earlier.
Each trial appends one line, with its command, commit, device and date, to
results/multi30k-cpu-sweep/trials.jsonl; the runs go to runs/sweep/NAME (not committed).
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
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from annotated.bleu import sacrebleu_score  # noqa: E402
from annotated.checkpoints import checkpoint_paths  # noqa: E402
from annotated.config import apply_overrides  # noqa: E402
from annotated.errors import ExpectedError  # noqa: E402
from annotated.provenance import provenance  # noqa: E402
from annotated.registry import TASKS, build_config  # noqa: E402
from annotated.throughput import measure_throughput  # noqa: E402
from annotated.translation import load_model, translate  # noqa: E402

# name -> the --set overrides applied to multi30k-cpu. Round 1 (float32 step times) ran
# `current` and `d256`; round 2 runs every trial in bfloat16, which the fast path made pay on
# this CPU, and keeps 20 checkpoints so that averaging windows can be compared too.
D256 = ["model.d_model=256", "model.d_ff=1024", "precision=bf16", "warmup=200"]
BF16 = ["precision=bf16", "keep_last=20"]
TRIALS = {
    "current": [],
    "d256": D256,
    "d256-lr2": [*D256, "lr_factor=1.4"],
    "d256-4k": [*D256, "max_tokens=4000"],
    "d128-4k": ["max_tokens=4000", "warmup=200", "lr_factor=1.0"],
    "d128-lr": ["lr_factor=1.4", "warmup=200"],
    "d384": ["model.d_model=384", "model.d_ff=1536", "model.h=6", "precision=bf16", "warmup=300"],
    "d256-drop2": [*D256, "model.dropout=0.2"],
    # round 2: bfloat16
    "bf16": BF16,
    "bf16-lr1": [*BF16, "lr_factor=1.0", "warmup=200"],
    "bf16-3k": [*BF16, "max_tokens=3000"],
    "bf16-v4k": [*BF16, "vocab=4000"],
    "bf16-d192": [*BF16, "model.d_model=192", "model.d_ff=768", "warmup=150"],
    "bf16-d256": [*BF16, "model.d_model=256", "model.d_ff=1024", "warmup=200"],
    "bf16-N4": [*BF16, "model.N=4"],
    "bf16-N2": [*BF16, "model.N=2"],
    "bf16-drop0": [*BF16, "model.dropout=0.0"],
    "bf16-drop2": [*BF16, "model.dropout=0.2"],
    "bf16-ls0": [*BF16, "label_smoothing=0.0"],
    # round 3: the best of round 2 together
    "bf16-N2-lr1": [*BF16, "model.N=2", "lr_factor=1.0", "warmup=200"],
    "bf16-N2-3k": [*BF16, "model.N=2", "max_tokens=3000"],
    "bf16-N2-drop0": [*BF16, "model.N=2", "model.dropout=0.0"],
}
AVERAGES = (1, 5, 10, 20)  # how many of the last checkpoints are averaged, where a run kept them
OUT = ROOT / "results" / "multi30k-cpu-sweep" / "trials.jsonl"


def step_budget(overrides: list[str], seconds: float) -> tuple[int, float]:
    cfg = apply_overrides(build_config("multi30k-cpu"), overrides)
    timing = measure_throughput(cfg, steps=20, device="cpu")
    per_step = timing["seconds_per_step"]
    return max(20, int(seconds / per_step) // 20 * 20), per_step


def bleu_on_test2016(run: Path, last: int = 5) -> dict:
    """sacreBLEU on test2016, beam 4, alpha 0.6, of the average of the run's last `last`
    checkpoints (5, as the profile keeps)."""
    model, tokenizer, cfg = load_model(checkpoint_paths(run)[-last:])
    pairs = TASKS[cfg.task].test_sets["test2016"](cfg)
    start = time.time()
    hyps = translate(model, tokenizer, [s for s, _ in pairs], beam_size=4, alpha=0.6)
    seconds = time.time() - start
    score = sacrebleu_score(hyps, [r for _, r in pairs])[0]
    return {"sacrebleu": score, "decode_seconds": seconds, "sentences": len(pairs)}


def run_trial(name: str, seconds: float, runs: Path, steps: int = 0) -> dict:
    overrides = TRIALS[name]
    repeat, per_step = steps > 0, None
    if not repeat:
        steps, per_step = step_budget(overrides, seconds)
    out = runs / (f"{name}-{steps}steps" if repeat else name)  # a repeat: its own run
    sets = [a for item in [*overrides, f"max_steps={steps}"] for a in ("--set", item)]
    cmd = ["-m", "annotated.cli.train", "--config", "multi30k-cpu", *sets, "--out", str(out)]
    start = time.time()
    subprocess.run([sys.executable, *cmd, "--no-progress"], check=True, cwd=ROOT)
    wall = time.time() - start
    run_json = json.loads((out / "run.json").read_text())
    kept = len(checkpoint_paths(out))
    # the profile's average of 5; where the run kept more, the other windows of the same run
    windows = [k for k in AVERAGES if k <= kept] if kept > 5 else [5]
    scores = {k: bleu_on_test2016(out, k) for k in windows}
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").open()]
    record = {
        "trial": name,
        "overrides": overrides,
        "max_steps": steps,
        "measured_s_per_step": per_step,
        "training_seconds": metrics[-1]["elapsed_s"],
        "over_budget": metrics[-1]["elapsed_s"] > seconds * 1.05,
        "process_seconds": wall,
        "precision": run_json.get("precision"),
        "final_loss": metrics[-1]["loss"],
        "checkpoints_averaged": min(5, kept),
        "test2016": scores[5],
    }
    if kept > 5:
        record["test2016_by_average"] = {k: s["sacrebleu"] for k, s in scores.items()}
    command = "python " + " ".join(cmd).replace(str(ROOT) + os.sep, "")
    return {**provenance(command, torch.device("cpu")), **record}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--trials", default="", help="comma-separated trial names")
    ap.add_argument("--seconds", type=float, default=285.0, help="training budget of a trial")
    ap.add_argument("--runs", type=Path, default=ROOT / "runs" / "sweep")
    ap.add_argument("--list", action="store_true")
    ap.add_argument(
        "--steps",
        type=int,
        default=0,
        help="train this many steps instead of measuring the budget (to repeat a trial whose "
        "measured step time was too optimistic and overran --seconds)",
    )
    args = ap.parse_args()
    if args.list or not args.trials:
        for name, overrides in TRIALS.items():
            print(f"{name:12} {' '.join(overrides) or '(chapter 9 as it is)'}")
        return 0
    for name in args.trials.split(","):
        if name not in TRIALS:
            print(f"unknown trial {name!r}; --list shows them", file=sys.stderr)
            return 2
        try:
            record = run_trial(name, args.seconds, args.runs, args.steps)
        except ExpectedError as e:  # no data, a bad override: the message says what to do
            print(f"trial {name}: {e}", file=sys.stderr)
            return 2
        except subprocess.CalledProcessError as e:  # the trainer printed its own message
            print(f"trial {name}: the training command exited with {e.returncode}", file=sys.stderr)
            return 2
        with open(OUT, "a") as f:
            f.write(json.dumps(record) + "\n")
        t = record["test2016"]
        print(
            f"{name}: {record['max_steps']} steps in {record['training_seconds']:.0f} s, "
            f"test2016 sacreBLEU {t['sacrebleu']:.2f} {record.get('test2016_by_average', '')}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
