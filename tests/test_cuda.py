"""The same claims on a CUDA device: the fast path equals the reference, bf16 autocast keeps the
loss right, the trainer trains and resumes, compile and fused Adam agree with eager, and cached beam
search equals uncached. Every test here is skipped on a machine without CUDA;
`benchmarks/gpu_suite.py` runs them on one."""

import copy
import json

import pytest
import torch

from annotated import make_model
from annotated.batching import BOS, EOS, PAD
from annotated.decoding import beam_search, greedy_decode
from annotated.fast import make_fast
from annotated.loss import FusedLabelSmoothing, LabelSmoothing
from annotated.training.registry import build_config
from annotated.training.tasks.copy import copy_batch
from annotated.training.trainer import train
from annotated.training_step import loss_on_batch

from helpers import killed_then_resumed, padded_batch, sets

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
CUDA = torch.device("cuda")


def cuda_batch(vocab=31, seed=0):
    return padded_batch(vocab, seed).to(CUDA)


def noise_only(name: str) -> bool:
    """The key projections' biases get a gradient of exactly zero in exact arithmetic (softmax
    ignores a shift shared by every key), so theirs is rounding noise, about 1e-16 in float64: not
    comparable."""
    return name.endswith("w_k.bias")


def loss_and_grads(model, crit, b, autocast=None):
    model.zero_grad()
    loss = loss_on_batch(model, b, crit, autocast=autocast)
    loss.backward()
    return loss.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("norm_first", [False, True])
def test_fast_path_equals_reference_in_float32(norm_first):
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(0)
    ref = make_model(31, 31, N=2, d_model=64, d_ff=128, h=4, dropout=0.0, norm_first=norm_first).to(
        CUDA
    )
    fast = make_fast(copy.deepcopy(ref))
    b = cuda_batch()
    l_ref, g_ref = loss_and_grads(ref, LabelSmoothing(31, PAD, 0.1), b)
    l_fast, g_fast = loss_and_grads(fast, FusedLabelSmoothing(31, PAD, 0.1), b)
    torch.testing.assert_close(l_fast, l_ref, rtol=1e-4, atol=1e-4)
    for name in g_ref:
        torch.testing.assert_close(g_fast[name], g_ref[name], rtol=1e-3, atol=1e-4, msg=name)


def test_bf16_autocast_fused_loss_is_float32_and_close_to_float32_loss():
    torch.manual_seed(0)
    model = make_fast(make_model(101, 101, N=2, d_model=64, d_ff=128, h=4, dropout=0.0)).to(CUDA)
    b = cuda_batch(101)
    crit = FusedLabelSmoothing(101, PAD, 0.1)
    l32, g32 = loss_and_grads(model, crit, b)
    l16, g16 = loss_and_grads(model, crit, b, autocast=torch.autocast("cuda", dtype=torch.bfloat16))
    assert l16.dtype == torch.float32
    assert abs(l16.item() - l32.item()) / l32.item() < 2e-2
    for name in g32:
        assert torch.isfinite(g16[name]).all(), name
        if noise_only(name):
            continue
        cos = torch.nn.functional.cosine_similarity(
            g16[name].flatten().float(), g32[name].flatten(), dim=0
        )
        assert cos > 0.98, (name, float(cos))


def test_cached_beam_search_equals_uncached():
    torch.manual_seed(0)
    model = make_fast(make_model(40, 40, N=2, d_model=64, d_ff=128, h=4)).to(CUDA).eval()
    b = cuda_batch(40, seed=3)
    cached = beam_search(model, b.src, b.src_mask, 15, BOS, EOS, 4, 0.6, use_cache=True)
    plain = beam_search(model, b.src, b.src_mask, 15, BOS, EOS, 4, 0.6, use_cache=False)
    assert cached == plain


def test_fused_adam_equals_foreach_adam():
    torch.manual_seed(0)
    a = make_model(31, 31, N=1, d_model=32, d_ff=64, h=4, dropout=0.0).to(CUDA)
    b = copy.deepcopy(a)
    opt_a = torch.optim.Adam(a.parameters(), lr=1e-3, betas=(0.9, 0.98), eps=1e-9, fused=True)
    opt_b = torch.optim.Adam(b.parameters(), lr=1e-3, betas=(0.9, 0.98), eps=1e-9, foreach=True)
    crit = LabelSmoothing(31, PAD, 0.1)
    for seed in range(5):
        batch = cuda_batch(seed=seed)
        for model, opt in ((a, opt_a), (b, opt_b)):
            loss_on_batch(model, batch, crit).backward()
            opt.step()
            opt.zero_grad()
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        if noise_only(
            name
        ):  # Adam scales its noise gradient up to full-size steps: any rounding shows
            continue
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=name)


def small_run(tmp_path, name, *overrides, resume=False):
    cfg = build_config(
        "copy",
        [
            "model.N=1",
            "model.d_model=32",
            "model.d_ff=64",
            "log_every=1",
            "model.dropout=0.1",
            *overrides,
        ],
    )
    return train(cfg, tmp_path / name, resume=resume, progress=False)


def weights_of(summary) -> dict:
    return torch.load(summary["last_checkpoint"], weights_only=True)["model"]


def test_trainer_on_cuda_learns_the_copy_task_in_bf16(tmp_path):
    summary = small_run(
        tmp_path, "run", "max_steps=400", "checkpoint_every=400", "model.dropout=0.0"
    )
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert run["device"] == torch.cuda.get_device_name(0)
    model = make_model(13, 13, N=1, d_model=32, d_ff=64, h=4).to(CUDA).eval()
    model.load_state_dict(weights_of(summary))
    b = copy_batch(13, 200, generator=torch.Generator().manual_seed(123)).to(CUDA)
    out = greedy_decode(model, b.src, b.src_mask, b.src.size(1) + 2, BOS, end_symbol=EOS)[:, 1:]
    width = b.tgt_y.size(1)
    got = torch.nn.functional.pad(out, (0, max(0, width - out.size(1))), value=-1)[:, :width]
    exact = ((got == b.tgt_y) | (b.tgt_y == PAD)).all(1).float().mean().item()
    assert exact >= 0.9, exact


def test_resume_on_cuda_continues_the_same_run(tmp_path):
    """Stopping after 30 steps and resuming gives the weights of an uninterrupted 60-step run: the
    checkpoint holds the CUDA random state, so dropout masks repeat. Checked to exact equality."""
    straight = small_run(tmp_path, "straight", "max_steps=60", "checkpoint_every=30")
    small_run(tmp_path, "split", "max_steps=30", "checkpoint_every=30")
    resumed = small_run(tmp_path, "split", "max_steps=60", "checkpoint_every=30", resume=True)
    a, b = weights_of(straight), weights_of(resumed)
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_a_run_killed_on_cuda_resumes_to_the_same_weights(tmp_path):
    """SIGKILL mid-run (no clean stop: the process just ends), then --resume: exactly the weights
    of an uninterrupted run, in bf16 with dropout, on the GPU."""
    overrides = ["model.N=1", "model.d_model=32", "model.d_ff=64", "model.dropout=0.1"]
    overrides += ["max_steps=300", "checkpoint_every=20", "keep_last=50", "precision=bf16"]
    straight, killed = killed_then_resumed(tmp_path, ["--config", "copy", *sets(*overrides)], 300)
    record = json.loads((tmp_path / "killed" / "run.json").read_text())
    assert record["device"] != "cpu", record["device"]
    for k in straight:
        assert torch.equal(straight[k], killed[k]), k


def test_compile_on_cuda_trains_like_eager(tmp_path):
    small_run(tmp_path, "eager", "max_steps=30", "precision=fp32", "model.dropout=0.0")
    compiled = small_run(
        tmp_path, "compiled", "max_steps=30", "precision=fp32", "model.dropout=0.0", "compile=true"
    )
    losses = [
        [
            json.loads(line)["loss"]
            for line in (tmp_path / n / "metrics.jsonl").read_text().splitlines()
        ]
        for n in ("eager", "compiled")
    ]
    assert len(losses[0]) == len(losses[1]) == 30
    for x, y in zip(*losses):
        assert abs(x - y) <= 1e-3 * abs(x) + 1e-4, (x, y)
    assert compiled["loss"] < 0.8 * losses[1][0]


def test_fp16_with_the_gradient_scaler_learns_and_resumes_exactly_on_cuda(tmp_path):
    """The T4 and V100 path: float16 autocast with the scaler, chosen by precision=fp16. The
    scaler's state is in the checkpoint, so stopping and resuming gives the uninterrupted run."""
    straight = small_run(
        tmp_path, "straight", "max_steps=60", "checkpoint_every=30", "precision=fp16"
    )
    small_run(tmp_path, "split", "max_steps=30", "checkpoint_every=30", "precision=fp16")
    resumed = small_run(
        tmp_path, "split", "max_steps=60", "checkpoint_every=30", "precision=fp16", resume=True
    )
    a = torch.load(straight["last_checkpoint"], weights_only=False)
    b = torch.load(resumed["last_checkpoint"], weights_only=False)
    assert a["precision"]["name"] == "fp16" and a["precision"]["scaler"] is not None
    assert a["precision"] == b["precision"]
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    records = [json.loads(line) for line in (tmp_path / "straight" / "metrics.jsonl").open()]
    assert records[-1]["loss"] < records[0]["loss"] and "skipped_steps" in records[-1]


def test_auto_precision_on_cuda_is_bf16_where_supported_else_fp16():
    from annotated.precision import choose_precision

    expected = "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    assert choose_precision("auto", CUDA) == expected


def test_prefetched_batches_are_pinned_then_arrive_on_the_gpu():
    from annotated.training.prefetch import Prefetcher

    seen = []

    def make(step):
        batch = copy_batch(11, 4, generator=torch.Generator().manual_seed(step))
        seen.append(batch)
        return [batch]

    prefetch = Prefetcher(make, 0, 3, "cuda")
    for step in range(3):
        (batch,) = prefetch.get(step)
        assert batch.src.is_cuda and batch.tgt_mask.is_cuda
        want = copy_batch(11, 4, generator=torch.Generator().manual_seed(step))
        assert torch.equal(batch.src.cpu(), want.src)
    prefetch.close()
    assert prefetch.waited >= 0


def test_fused_loss_in_bf16_on_cuda_matches_float32():
    torch.manual_seed(0)
    V = 1000
    gen = make_model(V, V, N=1, d_model=64, d_ff=16, h=2).generator.cuda()
    hidden = torch.randn(8, 20, 64, device="cuda", requires_grad=True)
    target = torch.randint(3, V, (8, 20), device="cuda")
    exact = FusedLabelSmoothing(V, PAD, 0.1).from_decoder(hidden, target, gen)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        low = FusedLabelSmoothing(V, PAD, 0.1, chunk=37).from_decoder(hidden, target, gen)
    assert low.dtype == torch.float32
    torch.testing.assert_close(low, exact, rtol=1e-2, atol=0)
