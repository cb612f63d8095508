"""The sweeps that chose chapter 11's Multi30k profiles. Each trial trains a profile with some
settings changed, then translates test2016 with beam 4 from the average of its kept checkpoints.

    python tools/sweep_multi30k.py --trials bf16,bf16-lr1          # CPU profile, two trials
    python tools/sweep_multi30k.py --config multi30k --steps 1200 --parallel 6 --trials A,B,...
    python tools/sweep_multi30k.py --list [--config multi30k]      # what each trial changes

`--config multi30k-cpu` (the default): the step budget of a trial is fixed before it trains: 20
steps are timed (after one untimed step; the first trials timed 5) and max_steps is the budget
divided by their median, rounded down to a multiple of 20. The timed batches are a sample, so a
trial can still overrun its budget: its record says so (`over_budget`), and `--steps N` repeats
it with N steps. The schedule does not depend on max_steps and training is seeded, so the repeat
is the same run, stopped earlier.

`--config multi30k` (the GPU profile): every trial trains `--steps` steps, and `--parallel N`
trains N trials at once on the one GPU, so their training times are not those of a trial alone
(each record says how many shared the device).

Each trial appends one line, with its command, commit, device and date, to the profile's
results/<folder>/trials.jsonl (multi30k-cpu-sweep or multi30k-gpu-sweep); the runs go to
runs/sweep/NAME (not committed).
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

from annotated.checkpoints import checkpoint_paths  # noqa: E402
from annotated.errors import ExpectedError  # noqa: E402
from annotated.evaluation.translation import load_model, score  # noqa: E402
from annotated.experiments.throughput import measure_throughput  # noqa: E402
from annotated.precision import fast_decoding  # noqa: E402
from annotated.provenance import provenance  # noqa: E402
from annotated.training.registry import build_config  # noqa: E402
from annotated.training.task import TASKS  # noqa: E402

# name -> the --set overrides applied to multi30k-cpu. Round 1 (float32 step times) ran
# `current` and `d256`; round 2 runs every trial in bfloat16, which the fast path made pay on
# this CPU, and keeps 20 checkpoints so that averaging windows can be compared too.
D256 = ["model.d_model=256", "model.d_ff=1024", "precision=bf16", "optim.warmup=200"]
BF16 = ["precision=bf16", "keep_last=20", "model.norm_first=true"]  # rounds 2-3: then pre-norm
TRIALS = {
    "current": [],
    "d256": D256,
    "d256-lr2": [*D256, "optim.lr_factor=1.4"],
    "d256-4k": [*D256, "batch.max_tokens=4000"],
    "d128-4k": ["batch.max_tokens=4000", "optim.warmup=200", "optim.lr_factor=1.0"],
    "d128-lr": ["optim.lr_factor=1.4", "optim.warmup=200"],
    "d384": [
        "model.d_model=384",
        "model.d_ff=1536",
        "model.h=6",
        "precision=bf16",
        "optim.warmup=300",
    ],
    "d256-drop2": [*D256, "model.dropout=0.2"],
    # round 2: bfloat16
    "bf16": BF16,
    "bf16-lr1": [*BF16, "optim.lr_factor=1.0", "optim.warmup=200"],
    "bf16-3k": [*BF16, "batch.max_tokens=3000"],
    "bf16-v4k": [*BF16, "data.vocab=4000"],
    "bf16-d192": [*BF16, "model.d_model=192", "model.d_ff=768", "optim.warmup=150"],
    "bf16-d256": [*BF16, "model.d_model=256", "model.d_ff=1024", "optim.warmup=200"],
    "bf16-N4": [*BF16, "model.N=4"],
    "bf16-N2": [*BF16, "model.N=2"],
    "bf16-drop0": [*BF16, "model.dropout=0.0"],
    "bf16-drop2": [*BF16, "model.dropout=0.2"],
    "bf16-ls0": [*BF16, "loss.label_smoothing=0.0"],
    # round 3: the best of round 2 together
    "bf16-N2-lr1": [*BF16, "model.N=2", "optim.lr_factor=1.0", "optim.warmup=200"],
    "bf16-N2-3k": [*BF16, "model.N=2", "batch.max_tokens=3000"],
    "bf16-N2-drop0": [*BF16, "model.N=2", "model.dropout=0.0"],
    # round 4: the chosen profile in the paper's post-norm form, with the pre-norm profile's
    # 200 warm-up steps (a peak learning rate of 6.3e-3), at half that rate, and with a warm-up
    # four times longer, which became the profile
    "post": ["optim.warmup=200"],
    "post-lr0.5": ["optim.warmup=200", "optim.lr_factor=0.5"],
    "post-w800": [],
}
# name -> the --set overrides applied to `multi30k`, the GPU profile (chapter 13). Its earlier
# recipe (the base model, 12,000-token batches, peak learning rate 1.4e-3 after 1,000 warm-up
# steps) collapsed with post-norm; round 1 lowers the peak, lengthens the warm-up, clips
# gradients, lowers dropout. Each trial names the model it trains, so that it still means what it
# meant when the profile changes.
BASE = ["model.N=6", "model.d_model=512", "model.d_ff=2048", "model.h=8"]  # the paper's base
EARLIER = [*BASE, "batch.max_tokens=12000", "optim.warmup=1000"]  # that recipe, beside today's
POST = [*EARLIER, "checkpoint_every=100"]  # short trials: average late checkpoints
CLIP_HALF = ["optim.lr_factor=0.5", "optim.max_grad_norm=1.0"]  # results/multi30k-postnorm
GPU_TRIALS = {
    "post-lr0.5": [*POST, "optim.lr_factor=0.5"],
    "post-lr0.35": [*POST, "optim.lr_factor=0.35"],
    "post-lr0.5-clip1": [*POST, "optim.lr_factor=0.5", "optim.max_grad_norm=1.0"],
    "post-lr1-clip1": [*POST, "optim.max_grad_norm=1.0"],
    "post-w4k": [*POST, "optim.warmup=4000"],
    "post-lr0.5-drop0.1": [*POST, "optim.lr_factor=0.5", "model.dropout=0.1"],
    "post-lr0.7-w2k": [*POST, "optim.lr_factor=0.7", "optim.warmup=2000"],
    # the first six all sat at the unigram level until step 500-750; dropout 0.1 left it
    # soonest: these combine it with clipping, and try a batch twice as large at a higher rate
    "post-lr0.5-clip1-drop0.1": [*POST, *CLIP_HALF, "model.dropout=0.1"],
    "post-lr0.5-clip1-drop0.2": [*POST, *CLIP_HALF, "model.dropout=0.2"],
    "post-lr0.7-clip1-24k": [
        *POST,
        "optim.lr_factor=0.7",
        "optim.max_grad_norm=1.0",
        "batch.max_tokens=24000",
    ],  # fmt: skip
    "pre": [*POST, "model.norm_first=true"],
    # round 2, for a run of at most ten minutes on one GPU (`--minutes`): the step is bound by
    # the host (about 11 steps a second alone), so the paper's 4,000 warm-up steps take six
    # minutes by themselves. The base model reaches the paper's peak rate in half the steps,
    # clipped; and two smaller post-norm models: three layers of width 256 (peak 2e-3), and
    # four of width 128 with a 256-wide feed-forward layer, the size of Revisit-MMT's text-only
    # model (Wu et al., 2021), at a peak of 3e-3.
    "base-12k-w2k-clip1": [
        *BASE,
        "batch.max_tokens=12000",
        "optim.lr_factor=0.7",
        "optim.warmup=2000",
        "optim.max_grad_norm=1.0",
    ],
    "N3-d256": [
        "model.N=3",
        "model.d_model=256",
        "model.d_ff=1024",
        "model.h=4",
        "optim.warmup=1000",
    ],  # which became the profile (these settings are its own)
    "N4-d128-ff256": [
        "model.N=4",
        "model.d_model=128",
        "model.d_ff=256",
        "model.h=4",
        "optim.lr_factor=1.5",
        "optim.warmup=2000",
    ],
}
PROFILE_TRIAL = {"multi30k": "N3-d256"}  # the trial whose settings became the profile's own
SWEEPS = {  # profile -> (its trials, the folder of its records)
    "multi30k-cpu": (TRIALS, "multi30k-cpu-sweep"),
    "multi30k": (GPU_TRIALS, "multi30k-gpu-sweep"),
}
AVERAGES = (1, 5, 10, 20)  # how many of the last checkpoints are averaged, where a run kept them
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def step_budget(overrides: list[str], seconds: float) -> tuple[int, float]:
    cfg = build_config("multi30k-cpu", overrides)
    timing = measure_throughput(cfg, steps=20, device="cpu")
    per_step = timing["seconds_per_step"]
    return max(20, int(seconds / per_step) // 20 * 20), per_step


def bleu_on_test2016(run: Path, last: int = 5, every_bleu: bool = False) -> dict:
    """BLEU on test2016, beam 4, alpha 0.6, of the average of the run's last `last` checkpoints
    (5, as the profiles keep): sacreBLEU, and with `every_bleu` every score of `evaluate`."""
    model, tokenizer, cfg = load_model(checkpoint_paths(run)[-last:], device=DEVICE)
    pairs = TASKS[cfg.task].test_sets(cfg)["test2016"]()
    with fast_decoding(model):
        scores = score(model, tokenizer, pairs)  # the paper's beam and alpha, its defaults
    del scores["translations"]
    if not every_bleu:  # what the CPU sweep's records hold
        scores = {k: scores[k] for k in ("sacrebleu", "decode_seconds")}
    return {**scores, "sentences": len(pairs)}


def train_command(
    config: str, name: str, steps: int, runs: Path, repeat: bool, minutes: float = 0.0
) -> list[str]:
    overrides = SWEEPS[config][0][name]
    out = runs / (f"{name}-{steps}steps" if repeat else name)  # a repeat: its own run
    budget = f"max_minutes={minutes}" if minutes else f"max_steps={steps}"
    sets = [a for item in [*overrides, budget] for a in ("--set", item)]
    return ["-m", "annotated.cli.train", "--config", config, *sets, "--out", str(out)]


def run_trial(name: str, seconds: float, runs: Path, steps: int = 0) -> dict:
    repeat, per_step = steps > 0, None
    if not repeat:
        steps, per_step = step_budget(TRIALS[name], seconds)
    cmd = train_command("multi30k-cpu", name, steps, runs, repeat)
    start = time.time()
    subprocess.run([sys.executable, *cmd, "--no-progress"], check=True, cwd=ROOT)
    wall = time.time() - start
    return record_trial("multi30k-cpu", name, cmd, steps, wall, seconds, per_step)


def run_parallel(
    config: str, names: list[str], steps: int, runs: Path, parallel: int, minutes: float = 0.0
) -> list:
    """Train the trials `parallel` at a time for `steps` steps each (or `minutes` of training
    each), then score them one by one: the records of the GPU sweep."""
    TASKS["multi30k"].tokenizer_for(build_config(config))  # trained once, before the trials
    records = []
    for i in range(0, len(names), parallel):
        group = names[i : i + parallel]
        cmds = {n: train_command(config, n, steps, runs, False, minutes) for n in group}
        start = time.time()
        procs = {
            n: subprocess.Popen([sys.executable, *c, "--no-progress"], cwd=ROOT)
            for n, c in cmds.items()
        }
        codes = {n: p.wait() for n, p in procs.items()}
        wall = time.time() - start
        for n in group:
            if codes[n]:  # the trainer said why; the other trials are still scored
                command = "python " + " ".join(cmds[n]).replace(str(ROOT) + os.sep, "")
                failed = {"trial": n, "overrides": SWEEPS[config][0][n], "returncode": codes[n]}
                records.append({**provenance(command, torch.device(DEVICE)), **failed})
                continue
            record = record_trial(config, n, cmds[n], steps, wall, None, None)
            if minutes:
                record["max_minutes"] = minutes
            records.append({**record, "trained_at_once": len(group)})
    return records


def record_trial(config, name, cmd, steps, wall, seconds, per_step) -> dict:
    overrides = SWEEPS[config][0][name]
    out = ROOT / cmd[cmd.index("--out") + 1]
    run_json = json.loads((out / "run.json").read_text())
    kept = len(checkpoint_paths(out))
    # the profile's average of 5; where the run kept more, the other windows of the same run
    windows = [k for k in AVERAGES if k <= kept] if kept > 5 else [5]
    scores = {k: bleu_on_test2016(out, k, every_bleu=config == "multi30k") for k in windows}
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").open()]
    record = {
        "trial": name,
        "overrides": overrides,
        "max_steps": steps,
        "steps": metrics[-1]["step"],  # as trained: a time budget may stop it before max_steps
        "measured_s_per_step": per_step,
        "training_seconds": metrics[-1]["elapsed_s"],
        "over_budget": bool(seconds) and metrics[-1]["elapsed_s"] > seconds * 1.05,
        "process_seconds": wall,
        "precision": run_json.get("precision"),
        "final_loss": metrics[-1]["loss"],
        "loss_every_250_steps": {m["step"]: m["loss"] for m in metrics if m["step"] % 250 == 0},
        "checkpoints_averaged": min(5, kept),
        "test2016": scores[5],
    }
    if kept > 5:
        record["test2016_by_average"] = {k: s["sacrebleu"] for k, s in scores.items()}
    command = "python " + " ".join(cmd).replace(str(ROOT) + os.sep, "")
    return {**provenance(command, torch.device(DEVICE)), **record}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--config", choices=sorted(SWEEPS), default="multi30k-cpu")
    ap.add_argument("--trials", default="", help="comma-separated trial names")
    ap.add_argument("--seconds", type=float, default=285.0, help="training budget of a trial")
    ap.add_argument("--runs", type=Path, default=ROOT / "runs" / "sweep")
    ap.add_argument("--list", action="store_true")
    ap.add_argument(
        "--steps",
        type=int,
        default=0,
        help="train this many steps instead of measuring the budget (to repeat a trial whose "
        "measured step time was too optimistic and overran --seconds); required by multi30k",
    )
    ap.add_argument("--parallel", type=int, default=1, help="multi30k: trials trained at once")
    ap.add_argument(
        "--minutes",
        type=float,
        default=0.0,
        help="multi30k: train each trial for this many minutes (max_minutes) instead of --steps",
    )
    args = ap.parse_args()
    trials, folder = SWEEPS[args.config]
    if args.list or not args.trials:
        for name, overrides in trials.items():
            print(f"{name:20} {' '.join(overrides) or '(chapter 11 as it is)'}")
        return 0
    names = args.trials.split(",")
    unknown = [n for n in names if n not in trials]
    if unknown or (args.config == "multi30k" and args.steps <= 0 and args.minutes <= 0):
        why = (
            f"unknown trial {unknown[0]!r}; --list shows them"
            if unknown
            else "give --steps N or --minutes M"
        )
        print(f"sweep_multi30k: {why}", file=sys.stderr)
        return 2
    out = ROOT / "results" / folder / "trials.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        if args.config == "multi30k":
            records = run_parallel(
                args.config, names, args.steps, args.runs, args.parallel, args.minutes
            )
        else:
            records = [run_trial(n, args.seconds, args.runs, args.steps) for n in names]
    except ExpectedError as e:  # no data, a bad override: the message says what to do
        print(f"sweep_multi30k: {e}", file=sys.stderr)
        return 2
    except subprocess.CalledProcessError as e:  # the trainer printed its own message
        print(f"sweep_multi30k: a training command exited with {e.returncode}", file=sys.stderr)
        return 2
    for record in records:
        with open(out, "a") as f:
            f.write(json.dumps(record) + "\n")
        if "returncode" in record:
            print(f"{record['trial']}: training exited with {record['returncode']}", flush=True)
            continue
        t = record["test2016"]
        lc = t.get("tokenized_lowercased_bleu")
        print(
            f"{record['trial']}: {record['steps']} steps in {record['training_seconds']:.0f} s,"
            f" test2016 sacreBLEU {t['sacrebleu']:.2f}"
            + (f", tokenized lowercased {lc:.2f}" if lc is not None else "")
            + f" {record.get('test2016_by_average', '')}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
