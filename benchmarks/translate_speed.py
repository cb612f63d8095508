"""Sentences per second of `translate` on a real test set: a trained run's averaged checkpoints
translate the first sentences of its task's first test set, at beams 1 and 4 (alpha 0.6).

    python benchmarks/translate_speed.py --run runs/multi30k-cpu --json results/benchmarks/x.json

It uses only the package's stable reader API (load_model, translate), so the same file measures
an older commit of the package too: copy it into that checkout and run it there.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from annotated.evaluation.translation import load_model, translate
from annotated.files import write_text_atomic
from annotated.training.checkpoints import checkpoint_paths
from annotated.training.provenance import provenance
from annotated.training.registry import TASKS


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--run", type=Path, required=True, help="a training run's --out folder")
    ap.add_argument("--sentences", type=int, default=1000)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    model, tokenizer, cfg = load_model(checkpoint_paths(args.run))
    test, load = next(iter(TASKS[cfg.task].test_sets(cfg).items()))
    sources = [s for s, _ in load()][: args.sentences]
    command = "python benchmarks/translate_speed.py " + " ".join(argv or sys.argv[1:])
    report = provenance(command, torch.device("cpu"))
    report.update(
        test_set=test, sentences=len(sources), checkpoints=len(checkpoint_paths(args.run))
    )
    for beam in (1, 4):
        start = time.perf_counter()
        out = translate(model, tokenizer, sources, beam_size=beam, alpha=0.6)
        seconds = time.perf_counter() - start
        words = sum(len(line.split()) for line in out)
        report[f"beam {beam}"] = {"seconds": seconds, "sentences_per_s": len(sources) / seconds}
        print(f"beam {beam}: {len(sources)} sentences in {seconds:.1f} s "
              f"({len(sources) / seconds:.1f} sentences/s, {words} words out)")  # fmt: skip
    if args.json:
        write_text_atomic(args.json, json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
