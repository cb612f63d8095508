"""Time one training step (forward, loss, backward, Adam) of three implementations on the same batches.

    python benchmarks/train_step.py                  # the Multi30k CPU configuration
    python benchmarks/train_step.py --quick          # a few seconds, for CI
    python benchmarks/train_step.py --json out.json  # also write the figures, with provenance

1. reference: the book's annotated path (explicit masked softmax, separate Q/K/V projections,
   KL-divergence label smoothing over the full vocabulary);
2. fast: the same modules and parameters with `fast_attention=True` (fused
   scaled_dot_product_attention) and the closed-form label-smoothing loss;
3. torch: `torch.nn.Transformer` (post-norm, no final LayerNorm) with embeddings, positional
   encoding and a tied generator of the same sizes, loss `F.cross_entropy(label_smoothing=0.1)`.

All three run in one process, interleaved round by round, on identical batches; the report
gives medians and the ratios to the reference. Speed goals live here, never in timed tests.
"""
from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from annotated import make_model, subsequent_mask  # noqa: E402
from annotated.embeddings import Embeddings, PositionalEncoding  # noqa: E402
from annotated.training import PAD, Batch, LabelSmoothing, make_optimizer  # noqa: E402


class TorchTransformer(nn.Module):
    """nn.Transformer with the book's embeddings and a tied output projection."""

    def __init__(self, vocab, N, d_model, d_ff, h, dropout):
        super().__init__()
        self.embed = nn.Sequential(Embeddings(d_model, vocab), PositionalEncoding(d_model, dropout))
        self.core = nn.Transformer(d_model, h, N, N, d_ff, dropout, batch_first=True, layer_norm_eps=1e-6)
        self.core.encoder.norm, self.core.decoder.norm = None, None
        self.out = nn.Linear(d_model, vocab)
        self.out.weight = self.embed[0].lut.weight

    def forward(self, b: Batch):
        n = b.tgt.size(1)
        y = self.core(self.embed(b.src), self.embed(b.tgt), tgt_mask=~subsequent_mask(n)[0],
                      src_key_padding_mask=b.src == PAD, tgt_key_padding_mask=b.tgt == PAD,
                      memory_key_padding_mask=b.src == PAD)
        return self.out(y)


def random_batches(n, vocab, tokens, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        length = int(torch.randint(8, 20, (1,), generator=g))
        rows = max(1, tokens // length)
        lens = torch.randint(length // 2, length + 1, (rows,), generator=g)
        src = torch.randint(3, vocab, (rows, length), generator=g)
        tgt = torch.randint(3, vocab, (rows, length + 1), generator=g)
        for i, m in enumerate(lens.tolist()):
            src[i, m:] = PAD
            tgt[i, m + 1:] = PAD
        out.append(Batch(src, tgt, PAD))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="tiny model and few steps (seconds)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", type=Path, help="write the figures here")
    args = ap.parse_args(argv)
    if args.quick:
        vocab, N, d, d_ff, h, tokens, rounds = 500, 1, 64, 128, 4, 400, 2
    else:   # the Multi30k CPU configuration (chapter 9)
        vocab, N, d, d_ff, h, tokens, rounds = 8000, 3, 256, 1024, 4, 2000, args.rounds
    torch.manual_seed(0)
    ref = make_model(vocab, vocab, N=N, d_model=d, d_ff=d_ff, h=h, dropout=0.1)
    fast = make_model(vocab, vocab, N=N, d_model=d, d_ff=d_ff, h=h, dropout=0.1, fast_attention=True)
    fast.load_state_dict(ref.state_dict())
    tor = TorchTransformer(vocab, N, d, d_ff, h, 0.1)
    crit_ref, crit_fast = LabelSmoothing(vocab, PAD, 0.1), LabelSmoothing(vocab, PAD, 0.1, fast=True)

    def step_book(model, crit, opt):
        def run(b):
            logp = model.generator(model(b.src, b.tgt, b.src_mask, b.tgt_mask))
            (crit(logp.reshape(-1, vocab), b.tgt_y.reshape(-1)) / b.ntokens).backward()
            opt.step(); opt.zero_grad(set_to_none=True)
        return run

    def step_torch(model, opt):
        def run(b):
            logits = model(b)
            F.cross_entropy(logits.reshape(-1, vocab), b.tgt_y.reshape(-1), ignore_index=PAD,
                            label_smoothing=0.1).backward()
            opt.step(); opt.zero_grad(set_to_none=True)
        return run

    runs = {"reference": step_book(ref, crit_ref, make_optimizer(ref, d_model=d)[0]),
            "fast": step_book(fast, crit_fast, make_optimizer(fast, d_model=d)[0]),
            "torch.nn.Transformer": step_torch(tor, make_optimizer(tor, d_model=d)[0])}
    batches = random_batches(4, vocab, tokens)
    target_tokens = sum(b.ntokens for b in batches)
    for run in runs.values():          # warm-up
        run(batches[0])
    times = {k: [] for k in runs}
    for _ in range(rounds):            # interleaved, so drifts of the machine hit all three alike
        for name, run in runs.items():
            t = time.perf_counter()
            for b in batches:
                run(b)
            times[name].append(time.perf_counter() - t)
    med = {k: statistics.median(v) for k, v in times.items()}
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                text=True).stdout.strip()
    except OSError:
        commit = "unknown"
    report = {"command": "python benchmarks/train_step.py" + (" --quick" if args.quick else ""),
              "commit": commit, "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "device": "cpu: " + (platform.processor() or platform.machine()) + f", {torch.get_num_threads()} threads",
              "torch": torch.__version__,
              "config": dict(vocab=vocab, N=N, d_model=d, d_ff=d_ff, h=h, target_tokens_per_step=target_tokens / 4),
              "results": {k: {"median_s_per_step": med[k] / len(batches),
                              "target_tokens_per_s": target_tokens / med[k],
                              "speed_vs_reference": med["reference"] / med[k]} for k in runs}}
    print(f"{'path':24} {'s/step':>8} {'tgt tok/s':>10} {'vs reference':>13}")
    for k, r in report["results"].items():
        print(f"{k:24} {r['median_s_per_step']:8.3f} {r['target_tokens_per_s']:10,.0f} {r['speed_vs_reference']:12.2f}x")
    print(f"fast vs torch.nn.Transformer: {med['torch.nn.Transformer'] / med['fast']:.2f}x")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        tmp = args.json.with_suffix(".tmp")
        tmp.write_text(json.dumps(report, indent=2) + "\n")
        tmp.replace(args.json)
    assert all(math.isfinite(v) for v in med.values())
    return 0


if __name__ == "__main__":
    sys.exit(main())
