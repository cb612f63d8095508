"""Time training steps of the reference path, each stage of the fast path, and torch.nn.Transformer,
in one run on the same batches; then time cached against uncached beam search.

    python benchmarks/train_step.py                              # Multi30k CPU sizes (chapter 11)
    python benchmarks/train_step.py --quick                      # seconds, for CI
    python benchmarks/train_step.py --preset base --tokens 25000 # the paper's base model (GPU)
    python benchmarks/train_step.py --json results/benchmarks/cpu-multi30k-small.json

Training paths, each a whole step (forward, loss, backward, Adam):
1. reference: the book's annotated code (explicit masked softmax, separate Q/K/V projections,
   KL-divergence label smoothing over the full vocabulary, nn.Dropout);
2. + fused attention: FastMultiHeadedAttention (scaled_dot_product_attention, stacked
   projections);
3. + fused loss: FusedLabelSmoothing (padding rows skip the output projection; loss and gradient
   in one step);
4. + cheap dropout: make_fast(model) + FusedLabelSmoothing, i.e. also FastDropout;
5. fast path: + fused Adam (make_optimizer(fused=True)), what the trainer runs by default;
6. torch.nn.Transformer (the same norm placement; post-norm without a final LayerNorm) with the
   book's embeddings, positional encoding and a tied output projection of the same sizes, loss
   F.cross_entropy(label_smoothing).
   (PyTorch spreads the smoothing mass over all V tokens, the book over V - 2; same cost.)
It uses fused Adam too. With --compile, another path runs the fast path under torch.compile.
7. with --annotated-transformer FILE: harvardnlp's Annotated Transformer, its own code loaded from
   the reader's checkout (benchmarks/annotated_transformer.py), with fused Adam too.

All paths start from the same weights and run interleaved, round by round, so that drifts of a noisy
machine hit them alike; the report gives medians and ratios to the reference. Every path runs in
each precision asked for (--precision; by default on a CPU fp32, and bf16 autocast beside it where
bf16 matrix multiplies pay; bf16 on CUDA), and on CUDA with fused Adam.

Model FLOPs utilisation (MFU) = model FLOPs per second / the device's measured matmul rate, where
the model FLOPs of a step count only real (non-padding) tokens:
  6 x (weights of each matrix multiply x the tokens it meets)      forward 2, backward 4 per weight
  + 3 x 4 d_model x (sum of n_q x n_k over sentences) per layer  QK^T and AV, forward 4, x3 in all
with the encoder's weights applied to source tokens, the decoder's (and the output projection's) to
target tokens, the encoder-decoder attention's K and V projections to source tokens, and causal
self-attention counting n(n+1)/2 query-key pairs. The matmul rate is measured here on square
matrices in the precision being timed.

Decoding: beam search at beams 1 and 4 on 32 random sources with outputs of exactly 50 tokens, for
the book's decoder (key/value cache, fused attention: what translate runs), the book's uncached
reference (use_cache=False, reference attention), and torch.nn.Transformer's decoder in the same
cache-free loop.

Steadiness: each path's rounds are reported with their spread ((max - min) / median); a path
whose rounds spread by more than 10% is named as unsteady, and the ratios are also given round by
round (paths are interleaved, so a round's ratio is less exposed to the machine's drifts). The
CPU's kind (benchmarks/machine.py: bf16 units, AVX-512, AVX2, or another CPU's kernels emulated
through ATEN_CPU_CAPABILITY), its instruction sets and kernels are recorded, and so is the share
of the cores that other work kept busy just before and after: above 15%, the figures are flagged
as from a busy machine. `--json auto` files them under results/benchmarks/ by CPU kind and preset;
`--against FILE` says whether this run's ratios agree with an earlier run's within 10%, and how
far the fast path's own time moved (on a shared host it drifts more than the ratios do).

Speed goals live here, never in timed tests.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import random
import statistics
import sys
import time
from contextlib import nullcontext
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))  # machine.py, beside this file

from annotated_transformer import NotTheAnnotatedTransformer
from annotated_transformer import load as load_annotated_transformer
from annotated_transformer import training_step as annotated_transformer_step
from machine import describe_cpu, file_name, load

from annotated import make_model, subsequent_mask
from annotated.batching import BOS, EOS, PAD, Batch, make_batch
from annotated.beam import beam_search_core
from annotated.decoding import beam_search
from annotated.embeddings import Embeddings, PositionalEncoding
from annotated.experiments.throughput import matmul_rate, model_flops
from annotated.fast import FastMultiHeadedAttention, fused_attention, make_fast
from annotated.files import write_text_atomic
from annotated.loss import (
    FusedLabelSmoothing,
    LabelSmoothing,
)
from annotated.multihead import MultiHeadedAttention
from annotated.precision import BF16_MARGIN, Precision, choose_precision, matmul_speedup
from annotated.provenance import provenance
from annotated.schedule import make_optimizer
from annotated.training.prefetch import Prefetcher
from annotated.training.registry import table_settings
from annotated.training_step import loss_on_batch

STEADY = 0.10  # two runs agree within 10% when each path's rounds spread less than this
BUSY = 0.15  # share of the cores busy with other work above which the machine was not quiet


def _preset(config: str, vocab: int, tokens: int, **more) -> dict:
    """A benchmark of the registry's named configuration `config`: its model's sizes, read from
    the table (torch alone suffices), with `vocab` and `tokens` target tokens per step."""
    row = table_settings(config)
    sizes = {key: row[f"model.{key}"] for key in ("N", "d_model", "d_ff", "h", "norm_first")}
    return dict(vocab=vocab, **sizes, tokens=tokens, **more)


PRESETS = {  # vocabulary, the model's sizes, post-norm (paper) or pre-norm, target tokens per step
    "quick": dict(vocab=500, N=1, d_model=64, d_ff=128, h=4, norm_first=False, tokens=400),
    # chapter 11's multi30k-small (the CPU profile's width, 3 layers); batches of about 1,740 tokens
    "multi30k-small": _preset("multi30k-small", 8000, 1750),
    "base": _preset("wmt14-base", 37000, 25000),
    "big": _preset("wmt14-big", 37000, 25000),
    # WMT14 sizes on batches whose sentence lengths follow the WMT en-de sample (wmt_sample_batches)
    "wmt14-base": _preset("wmt14-base", 37000, 25000, lengths="wmt"),
    "wmt14-big": _preset("wmt14-big", 37000, 25000, lengths="wmt"),
}
WMT_SAMPLE = "wmt_ende_toy_sample_opennmt"  # 10,000 Moses-tokenized pairs under $ANNOTATED_DATA


FAST = "fast path (+ fused Adam)"
HARVARD = "Annotated Transformer (harvardnlp)"
CONTENDERS = ("reference", "torch.nn.Transformer", "Annotated Transformer")  # for the fast path


class TorchTransformer(nn.Module):
    """nn.Transformer with the book's embeddings and a tied output projection."""

    def __init__(self, vocab, N, d_model, d_ff, h, dropout, norm_first=False):
        super().__init__()
        self.embed = nn.Sequential(Embeddings(d_model, vocab), PositionalEncoding(d_model, dropout))
        self.core = nn.Transformer(
            d_model,
            h,
            N,
            N,
            d_ff,
            dropout,
            batch_first=True,
            layer_norm_eps=1e-6,
            norm_first=norm_first,
        )
        if (
            not norm_first
        ):  # post-norm: no final LayerNorm (pre-norm keeps it, as the book's Encoder/Decoder do)
            self.core.encoder.norm, self.core.decoder.norm = None, None
        self.core.encoder.use_nested_tensor = False  # padded tensors, as the book's model uses
        self.out = nn.Linear(d_model, vocab)
        self.out.weight = self.embed[0].lut.weight

    def forward(self, b: Batch):
        n = b.tgt.size(1)
        causal = ~subsequent_mask(n)[0].to(b.tgt.device)
        y = self.core(
            self.embed(b.src),
            self.embed(b.tgt),
            tgt_mask=causal,
            tgt_is_causal=True,
            src_key_padding_mask=b.src == PAD,
            tgt_key_padding_mask=b.tgt == PAD,
            memory_key_padding_mask=b.src == PAD,
        )
        return self.out(y)


def random_batches(n, vocab, tokens, seed=0):
    """n random batches shaped like Multi30k's under BucketSampler: sources of one length (the
    sampler sorts by source length) and targets padded by about 6% (measured on the first 200
    batches of the multi30k task: 0.2% source and 6.0% target padding)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        length = int(torch.randint(10, 30, (1,), generator=g))
        rows = max(1, tokens // length)
        lens = torch.randint(length * 7 // 8, length + 1, (rows,), generator=g)
        src = torch.randint(3, vocab, (rows, length), generator=g)
        tgt = torch.randint(3, vocab, (rows, length + 1), generator=g)
        for i, m in enumerate(lens.tolist()):
            tgt[i, m + 1 :] = PAD
        out.append([Batch(src, tgt, PAD)])  # a step of one micro-batch
    return out


def wmt_sample_batches(n, vocab, tokens, seed=0, folder=None, max_tokens=None):
    """n steps whose (source, target) lengths are those of real WMT en-de sentences: the
    10,000-pair sample is un-escaped, split by a 16,000-piece BPE learned on it (27.6 source and
    29.6 target pieces a sentence; a 37k vocabulary gives somewhat fewer), and grouped as the WMT14
    task groups them (BucketSampler). A step holds `tokens` real target tokens: one micro-batch
    without `max_tokens`, else the trainer's number of micro-batches of at most `max_tokens`
    padded tokens a side (micro_batches_per_process), each a budget of tokens / that number.
    Token ids are random: only shapes matter."""
    import html
    import os
    import tempfile

    from annotated.batching import BucketSampler
    from annotated.data.tokenizer import train_tokenizer
    from annotated.training.config import BatchConfig, TrainConfig, micro_batches_per_process

    folder = Path(folder or Path(os.environ.get("ANNOTATED_DATA", ".")) / WMT_SAMPLE)
    with (
        open(folder / "src-train.txt", encoding="utf-8") as f,
        open(folder / "tgt-train.txt", encoding="utf-8") as g,
    ):
        pairs = [(html.unescape(a.strip()), html.unescape(b.strip())) for a, b in zip(f, g)]
    with tempfile.TemporaryDirectory() as tmp:
        tok = train_tokenizer(pairs, Path(tmp) / "wmt", 16000)
        # a source ends with </s>; a target is framed by <s> ... </s>
        lengths = [(len(tok.encode(a)) + 1, len(tok.encode(b)) + 2) for a, b in pairs]
    steps_cfg = TrainConfig(
        batch=BatchConfig(tokens_per_step=tokens, max_tokens=max_tokens or tokens, accum=0)
    )
    per_step = micro_batches_per_process(steps_cfg, 1) if max_tokens else 1
    sampler = BucketSampler(lengths, math.ceil(tokens / per_step), max_tokens or tokens, seed=seed)
    micro = random.Random(seed).sample(sampler.batches(0), n * per_step)
    g = torch.Generator().manual_seed(seed)
    out = []
    for ids in micro:
        sources, targets = [], []
        for i in ids:  # random ids of the real lengths, padded by make_batch
            sources.append(torch.randint(3, vocab, (lengths[i][0],), generator=g).tolist())
            targets.append(torch.randint(3, vocab, (lengths[i][1],), generator=g).tolist())
        out.append(make_batch(sources, targets))
    return [out[i : i + per_step] for i in range(0, len(out), per_step)]


def time_training(
    cfg,
    device,
    rounds,
    n_batches,
    *,
    precision="fp32",
    compile_fast=False,
    only_fast=False,
    profile=False,
    annotated_transformer=None,
):
    vocab, N, d, d_ff, h, pre = (
        cfg["vocab"],
        cfg["N"],
        cfg["d_model"],
        cfg["d_ff"],
        cfg["h"],
        cfg["norm_first"],
    )
    torch.manual_seed(0)
    base = make_model(vocab, vocab, N=N, d_model=d, d_ff=d_ff, h=h, dropout=0.1, norm_first=pre).to(
        device
    )
    attn_only = copy.deepcopy(base)
    for m in attn_only.modules():
        if isinstance(m, MultiHeadedAttention):
            m.__class__ = FastMultiHeadedAttention  # what make_fast does, without FastDropout
    stages = {  # name: (model, criterion, fused Adam)
        "reference": (base, LabelSmoothing(vocab, PAD, 0.1), False),
        "+ fused attention": (attn_only, LabelSmoothing(vocab, PAD, 0.1), False),
        "+ fused loss": (copy.deepcopy(attn_only), FusedLabelSmoothing(vocab, PAD, 0.1), False),
        "+ cheap dropout": (
            make_fast(copy.deepcopy(base)),
            FusedLabelSmoothing(vocab, PAD, 0.1),
            False,
        ),
        "fast path (+ fused Adam)": (
            make_fast(copy.deepcopy(base)),
            FusedLabelSmoothing(vocab, PAD, 0.1),
            True,
        ),
    }
    if only_fast:
        stages = {FAST: stages[FAST]}
        del attn_only
    cuda = device.type == "cuda"
    numeric = Precision(precision, device)
    autocast = numeric.autocast
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    def book_step(model, crit, forward=None, fused_adam=False):
        opt = make_optimizer(model, d_model=d, fused=True if fused_adam or cuda else None)[0]

        def run(step):  # the trainer's accumulation: each loss over the step's target tokens
            ntokens = sum(b.ntokens for b in step)
            for b in step:
                loss = loss_on_batch(
                    model if forward is None else forward, b, crit, autocast=autocast()
                )
                (loss / ntokens).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        return run

    runs = {name: book_step(m, c, fused_adam=fused) for name, (m, c, fused) in stages.items()}
    if compile_fast:
        m = make_fast(copy.deepcopy(base))
        runs["fast path + torch.compile"] = book_step(
            m, FusedLabelSmoothing(vocab, PAD, 0.1), torch.compile(m, dynamic=True), fused_adam=True
        )
    tor = TorchTransformer(vocab, N, d, d_ff, h, 0.1, norm_first=pre).to(device)
    tor_opt = make_optimizer(tor, d_model=d, fused=True)[0]

    def torch_step(step):
        ntokens = sum(b.ntokens for b in step)
        for b in step:
            with autocast():
                logits = tor(b)
            F.cross_entropy(
                logits.float().reshape(-1, vocab),
                b.tgt_y.reshape(-1),
                ignore_index=PAD,
                label_smoothing=0.1,
                reduction="sum",
            ).div(ntokens).backward()
        tor_opt.step()
        tor_opt.zero_grad(set_to_none=True)

    if not only_fast:
        runs["torch.nn.Transformer"] = torch_step

    if cfg.get("lengths") == "wmt":
        steps = wmt_sample_batches(n_batches, vocab, cfg["tokens"], max_tokens=cfg["max_tokens"])
    else:
        steps = random_batches(n_batches, vocab, cfg["tokens"])
    batches = [[b.to(device) for b in step] for step in steps]  # steps of micro-batches
    if annotated_transformer is not None:  # harvardnlp's own code, from the reader's checkout
        torch.manual_seed(0)
        theirs = annotated_transformer["make_model"](vocab, vocab, N, d, d_ff, h, 0.1).to(device)
        runs[HARVARD] = annotated_transformer_step(
            annotated_transformer,
            theirs,
            make_optimizer(theirs, d_model=d, fused=True)[0],
            batches,
            PAD,
            vocab,
            autocast,
        )
    target_tokens = sum(b.ntokens for step in batches for b in step)
    flops = sum(model_flops(b, **cfg) for step in batches for b in step)
    warmup, peak = {}, {}
    for name, run in runs.items():  # warm-up (and compilation), on every batch shape
        if cuda:
            torch.cuda.reset_peak_memory_stats(device)
        t = time.perf_counter()
        for b in batches:
            run(b)
        sync()
        warmup[name] = time.perf_counter() - t
        peak[name] = torch.cuda.max_memory_allocated(device) / 2**30 if cuda else None
    times = {k: [] for k in runs}
    for _ in range(rounds):  # interleaved
        for name, run in runs.items():
            sync()
            t = time.perf_counter()
            for b in batches:
                run(b)
            sync()
            times[name].append(time.perf_counter() - t)
    med = {k: statistics.median(v) for k, v in times.items()}
    rate = matmul_rate(device, dtype=numeric.dtype or torch.float32)
    first = next(iter(med))  # the reference, or the fast path alone with only_fast
    results = {
        k: {
            "median_s_per_step": med[k] / len(batches),
            "target_tokens_per_s": target_tokens / med[k],
            "speed_vs_reference": med[first] / med[k],
            "peak_memory_gib": peak[k],
            "model_tflops_per_s": flops / med[k] / 1e12,
            "mfu": flops / med[k] / rate,
            "first_pass_s": warmup[k],
            "spread": (max(times[k]) - min(times[k])) / med[k],  # of the rounds, per median
        }
        for k in runs
    }
    report = {
        "target_tokens_per_step": target_tokens / len(batches),
        "model_flops_per_step": flops / len(batches),
        "matmul_tflops_per_s_measured": rate / 1e12,
        "rounds": rounds,
        "results": results,
        "micro_batches_per_step": len(batches[0]),
        "source_tokens_per_step": sum(int((b.src != PAD).sum()) for s in batches for b in s)
        / len(batches),
        **versus("torch", "torch.nn.Transformer", med, times),
        "fast_vs_reference_by_round": [r / f for r, f in zip(times[first], times[FAST])],
        **versus("annotated_transformer", HARVARD, med, times),
        "unsteady": [k for k in runs if results[k]["spread"] > STEADY],
    }
    if profile:
        report["profile"] = profile_step(runs[FAST], batches, device)
    return report


def versus(short: str, path: str, med: dict, times: dict) -> dict:
    """The fast path's speed-up over `path`, from the medians and round by round; None for both
    where `path` was not timed."""
    if path not in med:
        return {f"fast_vs_{short}": None, f"fast_vs_{short}_by_round": None}
    return {
        f"fast_vs_{short}": med[path] / med[FAST],
        f"fast_vs_{short}_by_round": [t / f for t, f in zip(times[path], times[FAST])],
    }


def profile_step(run, batches, device, top=15) -> dict:
    """Where the fast path's step spends its time: one round under torch.profiler. On CUDA, the
    kernels' summed time against the wall time shows how long the GPU waits for the host (launch
    gaps, Python, the optimiser's host side); the top kernels show which work dominates."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    with profile(activities=activities) as prof:
        sync()
        start = time.perf_counter()
        for b in batches:
            run(b)
        sync()
        wall = time.perf_counter() - start

    def own(e):  # microseconds of the event itself on the device (CPU time without a device)
        if not cuda:
            return e.self_cpu_time_total
        return getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)

    # on CUDA the kernels alone: an operator's device time is that of the kernels it launched
    kernels = [e for e in prof.key_averages() if not cuda or e.device_type != DeviceType.CPU]
    events = [e for e in kernels if own(e) > 0]
    busy = sum(own(e) for e in events) / 1e6
    events.sort(key=own, reverse=True)
    return {
        "steps": len(batches),
        "wall_s_per_step": wall / len(batches),
        "device_busy_s_per_step": busy / len(batches),
        "device_busy_fraction": busy / wall,
        "top": [
            {"name": e.key[:120], "ms_per_step": own(e) / 1e3 / len(batches), "calls": e.count}
            for e in events[:top]
        ],
    }


def time_data(cfg, device, steps, precision="fp32"):
    """The fraction of a training step spent waiting for data, for batches built by make_batch
    from token lists (as the Multi30k and WMT tasks build them): built in the loop, before each
    step (the trainer's way on a CPU), or ahead of it by a background thread (its way on a GPU),
    with the step time of each: on a CPU the thread competes with the step for the cores."""
    lists = []
    for (b,) in random_batches(steps, cfg["vocab"], cfg["tokens"], seed=1):
        tgt = torch.cat([b.tgt, b.tgt_y[:, -1:]], dim=1)
        lists.append(([r.tolist() for r in b.src], [r[r != PAD].tolist() for r in tgt]))

    def make(step):
        return [make_batch(*lists[step])]

    torch.manual_seed(0)
    sizes = {k: cfg[k] for k in ("N", "d_model", "d_ff", "h", "norm_first")}
    model = make_fast(make_model(cfg["vocab"], cfg["vocab"], dropout=0.1, **sizes)).to(device)
    crit, opt = (
        FusedLabelSmoothing(cfg["vocab"], PAD, 0.1),
        make_optimizer(model, d_model=cfg["d_model"], fused=True)[0],
    )
    autocast, cuda = Precision(precision, device).autocast, device.type == "cuda"

    def step(micro):
        loss = loss_on_batch(model, micro[0], crit, autocast=autocast())
        (loss / micro[0].ntokens).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()

    step([b.to(device) for b in make(0)])  # warm-up
    elapsed, waited = {}, {}
    for background in (False, True):  # the trainer's way on a CPU, then its way on a GPU
        prefetch, start = (
            Prefetcher(make, 0, steps, device, background=background),
            time.perf_counter(),
        )
        for i in range(steps):
            step(prefetch.get(i))
        elapsed[background], waited[background] = time.perf_counter() - start, prefetch.waited
        prefetch.close()
    in_loop, ahead = elapsed[False], elapsed[True]
    return {
        "steps": steps,
        "precision": precision,
        "build_ms_per_step": 1000 * waited[False] / steps,
        "built_in_the_loop": {
            "s_per_step": in_loop / steps,
            "data_fraction": waited[False] / in_loop,
        },
        "built_ahead": {"s_per_step": ahead / steps, "wait_fraction": waited[True] / ahead},
    }


def best_precisions(training: dict) -> dict:
    """Each contender in the precision where it ran fastest, and the fast path's ratios to them:
    the comparison the speed goals ask for."""
    names = {
        "reference": "reference",
        "fast path": FAST,
        "torch.nn.Transformer": "torch.nn.Transformer",
        "Annotated Transformer": HARVARD,
    }
    best = {}
    for short, key in names.items():
        runs = {
            p: t["results"][key]["median_s_per_step"]
            for p, t in training.items()
            if key in t["results"]
        }
        if runs:
            p = min(runs, key=runs.get)
            best[short] = {"precision": p, "median_s_per_step": runs[p]}
    fast = best.get("fast path", {}).get("median_s_per_step")
    for short in CONTENDERS:
        if fast and short in best:
            best[f"fast path vs {short}"] = best[short]["median_s_per_step"] / fast
    return best


class TorchStepDecoder:
    """torch.nn.Transformer's decoder under the book's beam search: it has no cache, so every
    step runs the decoder on the whole prefix (the loop the book's use_cache=False also runs)."""

    def __init__(self, model: TorchTransformer, src, beam: int):
        pad = src == PAD
        memory = model.core.encoder(model.embed(src), src_key_padding_mask=pad)
        self.model, self.memory = model, memory.repeat_interleave(beam, 0)
        self.pad = pad.repeat_interleave(beam, 0)

    def step(self, ys):
        causal = ~subsequent_mask(ys.size(1))[0].to(ys.device)
        y = self.model.core.decoder(
            self.model.embed(ys),
            self.memory,
            tgt_mask=causal,
            tgt_is_causal=True,
            memory_key_padding_mask=self.pad,
        )
        return F.log_softmax(self.model.out(y[:, -1]).float(), dim=-1)  # (rows, vocab)

    def reorder(self, rows):
        if rows.numel() != self.memory.size(0):  # finished sentences leave
            self.memory, self.pad = self.memory[rows], self.pad[rows]


def time_decoding(cfg, device, sentences, out_tokens, rounds, precision="fp32"):
    """Beam search at beams 1 and 4 (alpha 0.6) on the same random sources, end symbol suppressed
    so that every output is exactly out_tokens long: the book's decoder with its cache and fused
    attention (what translate runs), its uncached reference (use_cache=False on the reference
    attention), and torch.nn.Transformer's decoder in the same cache-free loop. Random weights:
    only the work per token matters here."""
    vocab, sizes = cfg["vocab"], {k: cfg[k] for k in ("N", "d_model", "d_ff", "h", "norm_first")}
    torch.manual_seed(0)
    model = make_model(vocab, vocab, **sizes).to(device).eval()
    tor = TorchTransformer(vocab, cfg["N"], cfg["d_model"], cfg["d_ff"], cfg["h"], 0.1)
    tor = tor.to(device).eval()
    with torch.no_grad():
        model.generator.proj.bias[EOS] = -1e4
        tor.out.bias[EOS] = -1e4
    g = torch.Generator().manual_seed(1)
    src = torch.randint(3, vocab, (sentences, 20), generator=g)
    src[:, -1] = EOS
    src = src.to(device)
    mask = (src != PAD)[:, None]
    limits = torch.full((sentences,), out_tokens, device=device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    autocast = Precision(precision, device).autocast

    def ours(beam, cache):
        with fused_attention(model) if cache else nullcontext():
            return beam_search(
                model, src, mask, out_tokens + 1, BOS, EOS, beam, 0.6, use_cache=cache
            )

    def theirs(beam):
        decoder = TorchStepDecoder(tor, src, beam)
        return beam_search_core(decoder, sentences, limits, BOS, EOS, beam, 0.6)

    report = {"sentences": sentences, "output_tokens": out_tokens, "alpha": 0.6}
    for beam in (1, 4):
        runs = {
            "book, cached": partial(ours, beam, True),
            "book, uncached": partial(ours, beam, False),
            "torch.nn.Transformer, uncached": partial(theirs, beam),
        }
        times: dict[str, list[float]] = {k: [] for k in runs}
        outs = {}
        for _ in range(rounds):
            for name, fn in runs.items():
                sync()
                start = time.perf_counter()
                with torch.no_grad(), autocast():
                    outs[name] = fn()
                sync()
                times[name].append(time.perf_counter() - start)
        if precision == "fp32" and outs["book, cached"] != outs["book, uncached"]:
            raise AssertionError("cached and uncached beam search disagree")
        report[f"beam {beam}"] = {
            name: {
                "median_s": statistics.median(t),
                "sentences_per_s": sentences / statistics.median(t),
            }
            for name, t in times.items()
        }
    return report


def agreement(report: dict, earlier: dict) -> dict:
    """Whether this run's figures agree with an earlier run's within STEADY (10%), for each
    precision both timed: the fast path's ratios to the other contenders, which the book reports
    (`agree`), and its own time (`time_agrees`), which also moves with whatever else shares the
    machine's host. Each is given as this run's value over the earlier one's."""
    out = {}
    for precision, now in report["training"].items():
        before = earlier.get("training", {}).get(precision)
        if before is None:
            continue
        ratios = {
            key: now[key] / before[key]
            for key in ("fast_vs_torch", "fast_vs_annotated_transformer")
            if now.get(key) and before.get(key)
        }
        moved = (now["results"][FAST]["median_s_per_step"]
                 / before["results"][FAST]["median_s_per_step"])  # fmt: skip
        out[precision] = {
            "ratios": ratios,
            "agree": all(abs(r - 1) <= STEADY for r in ratios.values()),
            "fast_path_time": moved,
            "time_agrees": abs(moved - 1) <= STEADY,
        }
    return out


def default_precisions(device, report: dict) -> list[str]:
    """CUDA: bf16 where supported. CPU: fp32, and bf16 beside it where bf16 matrix multiplies are
    fast enough to pass the first test of the trainer's `auto` probe (matmul_speedup, recorded in
    the report). Where they are not (no bf16 units, or their kernels turned off), the trainer never
    runs bf16, and timing it would only take minutes: it is many times slower than fp32 there."""
    if device.type == "cuda":
        return [choose_precision("auto", device)]
    report["bf16_matmul_speedup"] = speedup = matmul_speedup()
    return ["fp32", "bf16"] if speedup >= BF16_MARGIN else ["fp32"]


def print_training(precision: str, training: dict) -> None:
    print(
        f"\n{precision}: {'path':36} {'s/step':>8} {'tgt tok/s':>11} "
        f"{'vs reference':>13} {'MFU':>7}"
    )
    for k, r in training["results"].items():
        print(
            f"{precision}: {k:36} {r['median_s_per_step']:8.3f} {r['target_tokens_per_s']:11,.0f} "
            f"{r['speed_vs_reference']:12.2f}x {r['mfu']:7.1%}"
        )
    if training["unsteady"]:
        print(f"{precision}: UNSTEADY (rounds spread over {STEADY:.0%} of their median): "
              f"{', '.join(training['unsteady'])}; run again with more --rounds, on a quieter "
              f"machine")  # fmt: skip
    if training["fast_vs_annotated_transformer"]:
        by_round = training["fast_vs_annotated_transformer_by_round"]
        print(f"{precision}: fast path vs the Annotated Transformer's code: "
              f"{training['fast_vs_annotated_transformer']:.2f}x "
              f"(rounds {min(by_round):.2f}-{max(by_round):.2f})")  # fmt: skip
    vs_torch = training["fast_vs_torch"]
    print(
        f"{precision}: fast path vs torch.nn.Transformer: "
        f"{f'{vs_torch:.2f}x' if vs_torch else 'not timed'}; measured {precision} matmul rate "
        f"{training['matmul_tflops_per_s_measured']:.3f} TFLOP/s"
    )


def print_decoding(dec: dict, precision: str) -> None:
    print(
        f"\nbeam search ({precision}), {dec['sentences']} sentences x {dec['output_tokens']} tokens"
    )
    for beam in (1, 4):
        for name, r in dec[f"beam {beam}"].items():
            print(f"beam {beam}: {name:32} {r['sentences_per_s']:8.1f} sentences/s")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--preset", choices=sorted(PRESETS), default="multi30k-small")
    ap.add_argument(
        "--quick", action="store_true", help="same as --preset quick --rounds 2 (seconds)"
    )
    ap.add_argument("--tokens", type=int, help="target tokens per step (default: the preset's)")
    ap.add_argument(
        "--max-tokens",
        type=int,
        help="wmt presets: split each step into the trainer's micro-batches of at most this "
        "many padded tokens a side (the WMT14 configurations': 32768 base, 16384 big); default: "
        "one micro-batch",
    )
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batches", type=int, default=4, help="batches per round")
    ap.add_argument(
        "--compile", action="store_true", help="also time the fast path under torch.compile"
    )
    ap.add_argument("--no-decode", action="store_true", help="skip the beam-search timing")
    ap.add_argument("--no-data", action="store_true", help="skip the data-path timing")
    ap.add_argument(
        "--only-fast", action="store_true", help="time the fast path alone (and --compile)"
    )
    ap.add_argument(
        "--profile", action="store_true", help="profile one round of the fast path's steps"
    )
    ap.add_argument(
        "--annotated-transformer",
        type=Path,
        metavar="FILE",
        help="also time harvardnlp's Annotated Transformer: the path of "
        "the_annotated_transformer.py in a checkout of github.com/harvardnlp/annotated-transformer",
    )
    ap.add_argument(
        "--against",
        type=Path,
        metavar="JSON",
        help="an earlier run's file: say whether this run's figures agree with it within 10%%",
    )
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument(
        "--json",
        type=Path,
        help="write the figures here, with provenance; `auto`: results/benchmarks/ under a name "
        "made of the CPU's kind and the preset, one file per kind of CPU",
    )
    ap.add_argument(
        "--precision",
        help="comma-separated fp32, bf16, fp16 (default: fp32,bf16 on CPU, bf16 on CUDA)",
    )
    args = ap.parse_args(argv)
    if args.quick:
        args.preset, args.rounds = "quick", min(args.rounds, 2)
    cfg = dict(PRESETS[args.preset])
    if args.tokens:
        cfg["tokens"] = args.tokens
    cfg["max_tokens"] = args.max_tokens
    device = torch.device(args.device)
    earlier = None
    if args.against:
        try:
            earlier = json.loads(args.against.read_text())
        except (OSError, ValueError) as e:
            print(f"Could not read the earlier run {args.against}: {e}. Give a file written by "
                  f"benchmarks/train_step.py --json.", file=sys.stderr)  # fmt: skip
            return 2
    harvard = None
    if args.annotated_transformer:
        try:
            harvard, harvard_origin = load_annotated_transformer(args.annotated_transformer)
        except NotTheAnnotatedTransformer as e:
            print(e, file=sys.stderr)
            return 2
    given = list(argv if argv is not None else sys.argv[1:])
    if args.annotated_transformer:  # no path of this machine in the record: its sha256 is there
        given = [
            "CHECKOUT/the_annotated_transformer.py" if a == str(args.annotated_transformer) else a
            for a in given
        ]
    command = "python benchmarks/train_step.py " + " ".join(given)
    report = provenance(command.strip(), device)
    report["malloc_environment"] = {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")}
    if device.type == "cpu":
        report["cpu"] = describe_cpu()
    report["cores_busy"] = {"before": load()}
    report["preset"], report["config"] = args.preset, cfg
    if harvard is not None:
        report["annotated_transformer"] = harvard_origin
    precisions = args.precision.split(",") if args.precision else default_precisions(device, report)
    report["training"] = {}
    print(f"{report['device']}; preset {args.preset}: {cfg}")
    for precision in precisions:
        report["training"][precision] = training = time_training(
            cfg,
            device,
            args.rounds,
            args.batches,
            precision=precision,
            compile_fast=args.compile,
            only_fast=args.only_fast,
            profile=args.profile,
            annotated_transformer=harvard,
        )
        print_training(precision, training)
    report["best"] = best = best_precisions(report["training"])
    for short in CONTENDERS:
        if f"fast path vs {short}" in best:
            print(
                f"best precision of each: fast path ({best['fast path']['precision']}) vs {short} "
                f"({best[short]['precision']}): {best[f'fast path vs {short}']:.2f}x"
            )
    if not args.no_data:
        first = best["fast path"]["precision"]
        report["data"] = data = time_data(cfg, device, 6 if args.preset == "quick" else 40, first)
        print(
            f"\ndata ({first}): a step's batches take {data['build_ms_per_step']:.1f} ms to build; "
            f"built in the loop, {data['built_in_the_loop']['data_fraction']:.1%} of step time; "
            f"built ahead, {data['built_ahead']['wait_fraction']:.1%} spent waiting"
        )
    if not args.no_decode:
        quick = args.preset == "quick"
        report["decoding"] = time_decoding(
            cfg, device, 4 if quick else 32, 10 if quick else 50, 1 if quick else 2, precisions[0]
        )
        print_decoding(report["decoding"], precisions[0])
    report["cores_busy"]["after"] = load()  # other work, one second before and one after
    report["busy"] = max(report["cores_busy"].values()) > BUSY
    if report["busy"]:
        print(f"BUSY: {max(report['cores_busy'].values()):.0%} of the cores were busy with "
              f"other work; the figures are flagged as from a busy machine")  # fmt: skip
    if earlier is not None:
        report["against"] = {"file": args.against.name, "commit": earlier.get("commit")}
        report["agreement"] = agreement(report, earlier)
        for precision, found in report["agreement"].items():
            shown = ", ".join(f"{k} {v:.2f}x" for k, v in found["ratios"].items())
            verdict = "agree" if found["agree"] else "do NOT agree"
            print(f"{precision}: against {args.against.name} (this run / that one): {shown}; "
                  f"the ratios {verdict} within {STEADY:.0%}; the fast path's time "
                  f"{found['fast_path_time']:.2f}x")  # fmt: skip
    if args.json:
        if str(args.json) == "auto":
            what = args.preset + ("" if args.precision is None else "-" + args.precision)
            args.json = (
                ROOT
                / "results"
                / "benchmarks"
                / file_name(report.get("cpu", {"kind": device.type}), what)
            )
        args.json.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(args.json, json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json}")
    for training in report["training"].values():
        assert all(math.isfinite(r["median_s_per_step"]) for r in training["results"].values())
    return 0


if __name__ == "__main__":
    sys.exit(main())
