"""The fast path (chapter 16) computes the reference function: fused attention and projections, the
fused label-smoothed loss, and FastDropout (which differs from nn.Dropout only in its random
bits)."""

import copy
import json
import math

import pytest
import torch
from torch import nn

from annotated import make_model
from annotated.batching import PAD
from annotated.fast import FastDropout, FastMultiHeadedAttention, make_fast
from annotated.loss import FusedLabelSmoothing, LabelSmoothing
from annotated.multihead import MultiHeadedAttention
from annotated.training.registry import build_config
from annotated.training.trainer import train
from annotated.training_step import loss_on_batch

from helpers import padded_batch

TOL = {torch.float64: dict(rtol=1e-9, atol=1e-10), torch.float32: dict(rtol=1e-4, atol=1e-5)}


def loss_and_grads(model, crit, b):
    model.zero_grad()
    loss = loss_on_batch(model, b, crit)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("share", [True, False])
def test_fast_model_equals_reference(dtype, norm_first, share):
    torch.manual_seed(0)
    ref = make_model(
        31,
        31,
        N=2,
        d_model=32,
        d_ff=64,
        h=4,
        dropout=0.0,
        norm_first=norm_first,
        share_embeddings=share,
    ).to(dtype)
    fast = make_fast(copy.deepcopy(ref))
    b = padded_batch()
    loss_ref, g_ref = loss_and_grads(ref, LabelSmoothing(31, PAD, 0.1), b)
    loss_fast, g_fast = loss_and_grads(fast, FusedLabelSmoothing(31, PAD, 0.1), b)
    torch.testing.assert_close(loss_fast, loss_ref, **TOL[dtype])
    assert g_fast.keys() == g_ref.keys()
    for name in g_ref:
        torch.testing.assert_close(g_fast[name], g_ref[name], **TOL[dtype], msg=name)


def attention_dropout(model, p: float):
    """`model` with dropout at rate `p` on its attention weights, which the paper and make_model
    leave out and MultiHeadedAttention (chapter 2) can apply: the fast path must keep it."""
    for m in model.modules():
        if isinstance(m, MultiHeadedAttention):
            m.dropout = nn.Dropout(p)
    return model


def test_make_fast_keeps_parameters_and_swaps_every_dropout():
    ref = attention_dropout(make_model(11, 11, N=2, d_model=16, d_ff=32, h=2, dropout=0.2), 0.1)
    fast = make_fast(copy.deepcopy(ref))
    assert fast.state_dict().keys() == ref.state_dict().keys()
    assert all(
        torch.equal(a, b) for a, b in zip(fast.state_dict().values(), ref.state_dict().values())
    )
    drops = [m for m in fast.modules() if isinstance(m, nn.Dropout)]
    assert drops and all(type(m) is FastDropout for m in drops)
    assert sorted(m.p for m in drops) == sorted(
        m.p for m in ref.modules() if isinstance(m, nn.Dropout)
    )
    layers = [m for m in fast.modules() if isinstance(m, MultiHeadedAttention)]
    assert layers and all(type(m) is FastMultiHeadedAttention for m in layers)
    ref.load_state_dict(fast.state_dict())  # checkpoints move both ways


@pytest.mark.parametrize("training", [True, False])
def test_make_fast_keeps_the_train_or_eval_mode(training):
    """A model switched after .eval() must stay deterministic: no new dropout module in training
    mode. The outputs of two calls agree, and equal the reference model's in eval mode."""
    torch.manual_seed(0)
    ref = make_model(11, 11, N=1, d_model=16, d_ff=32, h=2, dropout=0.3).train(training)
    fast = make_fast(copy.deepcopy(ref))
    assert all(m.training == training for m in fast.modules())
    if not training:
        b = padded_batch(11)
        out = fast(b.src, b.tgt, b.src_mask, b.tgt_mask)
        torch.testing.assert_close(out, fast(b.src, b.tgt, b.src_mask, b.tgt_mask))
        torch.testing.assert_close(out, ref(b.src, b.tgt, b.src_mask, b.tgt_mask))


def test_fast_attention_keeps_no_weights_and_respects_dropout_mode():
    model = make_fast(
        attention_dropout(make_model(11, 11, N=1, d_model=16, d_ff=32, h=2, dropout=0.0), 0.5)
    )
    src = torch.randint(3, 11, (2, 6))
    model.eval()
    a = model.encode(src, (src != PAD)[:, None])
    b = model.encode(src, (src != PAD)[:, None])
    assert torch.equal(a, b)  # no dropout in eval mode
    assert model.encoder.layers[0].self_attn.attn is None
    model.train()
    # attention dropout is applied
    assert not torch.equal(model.encode(src, (src != PAD)[:, None]), a)


def test_fused_kernel_pays_everywhere_but_a_cpu_in_16_bit_floats():
    from annotated.fast import fused_kernel_pays

    for dtype, pays in ((torch.float32, True), (torch.float64, True), (torch.bfloat16, False)):
        assert fused_kernel_pays(torch.zeros(1, dtype=dtype)) is pays
    assert not fused_kernel_pays(torch.zeros(1, dtype=torch.float16))
    assert fused_kernel_pays(torch.zeros(1, dtype=torch.bfloat16, device="meta"))


def test_fast_attention_in_bf16_on_cpu_runs_the_reference_softmax():
    torch.manual_seed(0)
    ref = MultiHeadedAttention(4, 32, dropout=0.0)
    fast = FastMultiHeadedAttention(4, 32, dropout=0.0)
    fast.load_state_dict(ref.state_dict())
    x = torch.randn(3, 5, 32)
    mask = torch.ones(3, 1, 5, dtype=torch.bool)
    mask[1, :, 3:] = False
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got, want = fast(x, x, x, mask), ref(x, x, x, mask)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, want)  # the same kernels, bit for bit
    assert fast.attn is not None  # the reference softmax keeps its weights


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_query_that_sees_no_key_gets_zeros_from_both_kernels(dtype):
    from annotated.scaled_dot_product import attention

    torch.manual_seed(0)
    q, k, v = torch.randn(3, 1, 2, 3, 8).to(dtype).unbind(0)  # (batch, h, n, d_k) each
    mask = torch.tensor([[[[True, True, False], [False, False, False], [True, True, True]]]])
    fused = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    explicit, _ = attention(q, k, v, mask)
    for out in (fused, explicit):
        assert torch.equal(out[:, :, 1], torch.zeros_like(out[:, :, 1]))  # the blind query
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else {}
    torch.testing.assert_close(fused, explicit, **tol)


@pytest.mark.parametrize("cross", [False, True])
def test_stacked_projections_equal_separate_ones(cross):
    torch.manual_seed(0)
    ref = MultiHeadedAttention(4, 32, dropout=0.0).double()
    fast = FastMultiHeadedAttention(4, 32, dropout=0.0).double()
    fast.load_state_dict(ref.state_dict())
    x = torch.randn(3, 5, 32, dtype=torch.float64, requires_grad=True)
    mem = torch.randn(3, 7, 32, dtype=torch.float64, requires_grad=True) if cross else x
    for got, want in zip(fast.project(x, mem, mem), ref.project(x, mem, mem)):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    # three different inputs: no stacking possible, still the same
    y, z = torch.randn(3, 7, 32, dtype=torch.float64), torch.randn(3, 7, 32, dtype=torch.float64)
    for got, want in zip(fast.project(x, y, z), ref.project(x, y, z)):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("V,eps", [(5, 0.1), (12, 0.0), (40, 0.3), (7, 0.99)])
def test_fused_loss_equals_label_smoothing(V, eps):
    g = torch.Generator().manual_seed(V)
    hidden = torch.randn(6, 5, 8, dtype=torch.float64, generator=g, requires_grad=True)
    target = torch.randint(1, V, (6, 5), generator=g)
    target[0, 2:] = PAD
    target[4, :] = PAD
    gen = make_model(V, V, N=1, d_model=8, d_ff=16, h=2).generator.double()
    slow = LabelSmoothing(V, PAD, eps)(gen(hidden).reshape(-1, V), target.reshape(-1))
    grads_slow = torch.autograd.grad(slow, [hidden, *gen.parameters()])
    for chunk in (None, 1, 4, 100):  # whole, one position, uneven chunks (26 positions), more
        fast = FusedLabelSmoothing(V, PAD, eps, chunk=chunk).from_decoder(hidden, target, gen)
        grads_fast = torch.autograd.grad(fast, [hidden, *gen.parameters()])
        torch.testing.assert_close(fast, slow, rtol=1e-12, atol=1e-10)
        for a, b in zip(grads_fast, grads_slow):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    with torch.no_grad():  # the loss alone, no gradient work
        torch.testing.assert_close(
            FusedLabelSmoothing(V, PAD, eps).from_decoder(hidden, target, gen),
            slow,
            rtol=1e-12,
            atol=1e-10,
        )
    # a drop-in: both losses take both kinds of input with the same arguments
    same = LabelSmoothing(V, PAD, eps).from_decoder(hidden, target, gen)
    torch.testing.assert_close(same, slow, rtol=1e-12, atol=1e-12)
    on_log_probs = FusedLabelSmoothing(V, PAD, eps)(gen(hidden).reshape(-1, V), target.reshape(-1))
    torch.testing.assert_close(on_log_probs, slow, rtol=1e-12, atol=1e-12)


def test_fused_loss_under_bf16_autocast_multiplies_in_bf16_and_sums_in_float32():
    torch.manual_seed(0)
    V = 300
    hidden = torch.randn(4, 9, 32, requires_grad=True)
    target = torch.randint(3, V, (4, 9))
    target[1, 5:] = PAD
    gen = make_model(V, V, N=1, d_model=32, d_ff=16, h=2).generator
    params = [hidden, *gen.parameters()]
    exact = FusedLabelSmoothing(V, PAD, 0.1).from_decoder(hidden, target, gen)
    grads = torch.autograd.grad(exact, params)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = FusedLabelSmoothing(V, PAD, 0.1, chunk=5).from_decoder(hidden, target, gen)
        ref = LabelSmoothing(V, PAD, 0.1).from_decoder(hidden, target, gen)
    assert low.dtype == torch.float32
    grads_low = torch.autograd.grad(low, params)
    grads_ref = torch.autograd.grad(ref, params)
    torch.testing.assert_close(low, ref, rtol=1e-3, atol=0)  # the same bf16 logits
    torch.testing.assert_close(low, exact, rtol=1e-2, atol=0)
    for a, b, c in zip(grads_low, grads_ref, grads):
        assert a.dtype == c.dtype == torch.float32
        torch.testing.assert_close(a, b, rtol=0, atol=0.02 * b.abs().max().item())
        torch.testing.assert_close(a, c, rtol=0, atol=0.02 * c.abs().max().item())


def test_fused_loss_rejects_a_generator_of_another_size():
    gen = make_model(9, 9, N=1, d_model=8, d_ff=16, h=2).generator
    with pytest.raises(ValueError, match="gives 9 logits.*vocabulary of 12"):
        FusedLabelSmoothing(12, PAD, 0.1).from_decoder(
            torch.randn(2, 3, 8), torch.ones(2, 3, dtype=torch.long), gen
        )


@pytest.mark.parametrize("p", [0.1, 0.3, 0.9])
def test_fast_dropout_rate_scale_and_seed(p):
    x = torch.ones(2000, 1000)
    drop = FastDropout(p)
    torch.manual_seed(7)
    y = drop(x)
    rate = round(p * 65536) / 65536
    dropped = (y == 0).double().mean().item()
    assert abs(dropped - rate) < 5 * math.sqrt(rate * (1 - rate) / x.numel())
    torch.testing.assert_close(y[y != 0], torch.full_like(y[y != 0], 1 / (1 - rate)))
    torch.manual_seed(7)
    assert torch.equal(drop(x), y)  # seeded like any torch RNG
    assert not torch.equal(drop(x), y)  # and fresh on the next call
    assert torch.equal(drop.eval()(x), x)


def test_fast_dropout_masks_are_independent_of_position():
    # every 16-bit lane of the 64-bit draws must be used alike (no lane always kept or dropped)
    torch.manual_seed(0)
    y = FastDropout(0.5)(torch.ones(4, 250_000)).reshape(-1, 4)
    lanes = (y == 0).double().mean(0)
    assert ((lanes - 0.5).abs() < 0.005).all(), lanes


def test_fast_dropout_edge_rates_and_odd_sizes():
    x = torch.randn(3, 5, 7)  # numel not a multiple of 4
    assert torch.equal(FastDropout(1.0)(x), torch.zeros_like(x))
    assert torch.equal(FastDropout(0.0)(x), x)
    y = FastDropout(0.5)(x)
    assert y.shape == x.shape and ((y == 0) | torch.isclose(y, 2 * x)).all()
    xg = x.clone().requires_grad_(True)
    torch.manual_seed(1)
    out = FastDropout(0.5)(xg)
    out.sum().backward()
    assert torch.equal(xg.grad == 0, out == 0)


def logged_losses(out, steps, *overrides):
    """Train the copy task for `steps` steps with `overrides`; the loss logged at every step."""
    cfg = build_config(
        "copy", [f"max_steps={steps}", "log_every=1", "checkpoint_every=0", *overrides]
    )
    train(cfg, out, progress=False)
    return [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_trainer_fast_and_reference_paths_train_alike(tmp_path):
    """The trainer's fast path (default) and reference path (fast=false) give the same losses
    without dropout."""
    fast, ref = (
        logged_losses(tmp_path / "fast", 5, "fast=true"),
        logged_losses(tmp_path / "ref", 5, "fast=false"),
    )
    assert len(fast) == 5
    for a, b in zip(fast, ref):
        assert math.isclose(a, b, rel_tol=1e-4), (fast, ref)


def test_trainer_compile_switch_trains_the_same_function(tmp_path):
    """--set compile=true runs the model through torch.compile; without dropout it follows the same
    losses."""
    small = ["model.N=1", "model.d_model=32", "model.d_ff=64"]
    compiled, plain = (
        logged_losses(tmp_path / "c", 3, "compile=true", *small),
        logged_losses(tmp_path / "p", 3, *small),
    )
    assert len(compiled) == 3
    for a, b in zip(compiled, plain):
        assert math.isclose(a, b, rel_tol=1e-4), (compiled, plain)


def test_fused_attention_is_switched_on_inside_the_block_and_restored_after():
    from annotated.fast import fused_attention
    from annotated.multihead import MultiHeadedAttention

    model = make_model(11, 11, N=1, d_model=16, d_ff=32, h=2)
    layers = [m for m in model.modules() if isinstance(m, MultiHeadedAttention)]
    layers[0].__class__ = FastMultiHeadedAttention  # one layer already fast: it stays fast
    before = [type(m) for m in layers]
    assert before == [FastMultiHeadedAttention] + [MultiHeadedAttention] * (len(layers) - 1)
    with fused_attention(model):
        assert all(type(m) is FastMultiHeadedAttention for m in layers)
    assert [type(m) for m in layers] == before
    with fused_attention(model, False):
        assert all(type(m) is MultiHeadedAttention for m in layers)
    assert [type(m) for m in layers] == before
    with pytest.raises(RuntimeError), fused_attention(model):
        raise RuntimeError("the block fails")
    assert [type(m) for m in layers] == before
