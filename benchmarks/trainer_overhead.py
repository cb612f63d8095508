"""Time the trainer's loop against a bare loop of the same model over the same batches, built
beforehand, and say where the difference goes.

    python benchmarks/trainer_overhead.py                 # the copy task, a tiny model, 1 thread
    python benchmarks/trainer_overhead.py --config multi30k-cpu --steps 60
    python benchmarks/trainer_overhead.py --json auto     # results/benchmarks/, by CPU kind

The trainer (`annotated.training.trainer.train`, in this process, no progress bar) runs `--steps`
steps of `--config` into a temporary folder, writing its one checkpoint at the end; its time is
the training time it records (from its first step to its last). The bare loop builds the same
run (`build_run`: model, loss, optimiser and schedule, the same weights), builds all its
micro-batches first (`task.micro_batch`), then calls `train_step` on each. Both set the same
seed per step. Rounds alternate between the two so that a drifting machine hits both alike; the
report gives medians and the ratio trainer / bare loop, with the time the bare loop's batches took
to build beside it (the trainer builds them as it goes, on a prefetching thread).

Speed goals live here, never in timed tests: the goal on the CPU (tiny model, one thread) is the
trainer within 1.10x of the bare loop.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from machine import describe_cpu, file_name, load  # noqa: E402

from annotated.provenance import provenance  # noqa: E402
from annotated.training.registry import build_config  # noqa: E402
from annotated.training.trainer import build_run, step_seed, train  # noqa: E402
from annotated.training_step import train_step  # noqa: E402

TINY = ["model.N=1", "model.d_model=32", "model.d_ff=64", "model.h=2"]


def settings(config: str, steps: int, extra: list[str]) -> list[str]:
    """The run both loops train: `steps` steps, one checkpoint at the end, fp32."""
    tiny = TINY if config == "copy" else []
    once = [f"max_steps={steps}", f"checkpoint_every={steps}", "precision=fp32"]
    return [*tiny, *once, *extra]


def bare_loop(cfg) -> tuple[float, float]:
    """(seconds of the steps, seconds to build their batches) for a bare loop of train_step."""
    run = build_run(cfg, 1, torch.device("cpu"))
    start = time.perf_counter()
    batches = [
        [run.task.micro_batch(step, j) for j in range(run.accum)] for step in range(cfg.max_steps)
    ]
    built = time.perf_counter() - start
    run.model.train()
    start = time.perf_counter()
    for step, micro in enumerate(batches):
        torch.manual_seed(step_seed(cfg, step))  # as the trainer does
        tokens = sum(b.ntokens for b in micro)
        train_step(run.model, micro, run.criterion, run.optimizer, run.scheduler,
                   total_tokens=tokens, precision=run.precision)  # fmt: skip
    return time.perf_counter() - start, built


def trainer_loop(cfg) -> tuple[float, float]:
    """(seconds of the trainer's steps, as it records them; seconds of the whole call, with
    building the run and writing its checkpoint)."""
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder, contextlib.redirect_stdout(io.StringIO()):
        result = train(cfg, Path(folder) / "run", progress=False)
    return result["training_seconds"], time.perf_counter() - start


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="copy")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--json", help="write the report here (auto: results/benchmarks/)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    busy_before = load()
    cfg = build_config(args.config, settings(args.config, args.steps, args.set))
    trainer, whole, bare, built = [], [], [], []
    for _ in range(args.rounds):
        seconds, building = bare_loop(cfg)
        bare.append(seconds)
        built.append(building)
        steps, call = trainer_loop(cfg)
        trainer.append(steps)
        whole.append(call)
    t, b, m = statistics.median(trainer), statistics.median(bare), statistics.median(built)
    w = statistics.median(whole)
    report = {
        **provenance(
            " ".join(["python benchmarks/trainer_overhead.py", *(argv or sys.argv[1:])]), "cpu"
        ),  # fmt: skip
        "cpu": describe_cpu(),
        "config": args.config,
        "settings": settings(args.config, args.steps, args.set),
        "steps": args.steps,
        "threads": args.threads,
        "rounds": {
            "trainer_s": trainer,
            "trainer_call_s": whole,
            "bare_loop_s": bare,
            "batch_building_s": built,
        },  # fmt: skip
        "trainer_s": t,
        "trainer_call_s": w,
        "bare_loop_s": b,
        "ratio": t / b,
        "batch_building_over_bare_loop": m / b,
        "load_before": busy_before,
        "load_after": load(),
    }
    print(f"{args.config}, {args.steps} steps, {args.threads} thread(s), median of {args.rounds}:")
    print(f"  bare loop of train_step  {b:7.2f} s")
    print(f"  the trainer              {t:7.2f} s   ({t / b:.2f}x the bare loop)")
    print(f"  the whole train() call   {w:7.2f} s   (with building the run and its checkpoint)")
    print(f"  building the batches     {m:7.2f} s   ({m / b:.2f}x; the bare loop's, beforehand)")
    if max(busy_before, report["load_after"]) > 0.15:
        print("  (other work kept the machine busy: the figures are noisy)")
    if args.json:
        what = f"trainer-overhead-{args.config}"
        out = Path(args.json)
        if args.json == "auto":
            out = Path(__file__).resolve().parent.parent / "results" / "benchmarks"
            out = out / file_name(report["cpu"], what)
        out.write_text(json.dumps(report, indent=1) + "\n")
        print(f"written to {out}")
    return report


if __name__ == "__main__":
    main()
