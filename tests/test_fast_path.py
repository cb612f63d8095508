"""The fast path (fused attention, closed-form label smoothing) computes the reference function."""
import pytest
import torch

from annotated import make_model, subsequent_mask
from annotated.training import PAD, Batch, LabelSmoothing

TOL = {torch.float64: dict(rtol=1e-9, atol=1e-10), torch.float32: dict(rtol=1e-4, atol=1e-5)}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("norm_first", [False, True])
def test_fast_model_equals_reference(dtype, norm_first):
    torch.manual_seed(0)
    ref = make_model(31, 31, N=2, d_model=32, d_ff=64, h=4, dropout=0.0, norm_first=norm_first).to(dtype)
    fast = make_model(31, 31, N=2, d_model=32, d_ff=64, h=4, dropout=0.0, norm_first=norm_first,
                      fast_attention=True).to(dtype)
    fast.load_state_dict(ref.state_dict())
    src = torch.randint(3, 31, (4, 9)); tgt = torch.randint(3, 31, (4, 8))
    src[1, 5:] = PAD; src[3, 2:] = PAD; tgt[2, 4:] = PAD; tgt[3, 1:] = PAD
    b = Batch(src, tgt, PAD)
    losses = []
    for model, fast_loss in ((ref, False), (fast, True)):
        crit = LabelSmoothing(31, PAD, 0.1, fast=fast_loss)
        logp = model.generator(model(b.src, b.tgt, b.src_mask, b.tgt_mask))
        loss = crit(logp.reshape(-1, 31), b.tgt_y.reshape(-1))
        loss.backward()
        losses.append(loss.detach())
    torch.testing.assert_close(losses[1], losses[0], **TOL[dtype])
    for (name, p_ref), p_fast in zip(ref.named_parameters(), fast.parameters()):
        torch.testing.assert_close(p_fast.grad, p_ref.grad, **TOL[dtype], msg=name)


def test_fast_attention_keeps_no_weights_and_respects_dropout_mode():
    model = make_model(11, 11, N=1, d_model=16, d_ff=32, h=2, dropout=0.0, attn_dropout=0.5, fast_attention=True)
    src = torch.randint(3, 11, (2, 6))
    model.eval()
    a = model.encode(src, (src != PAD)[:, None])
    b = model.encode(src, (src != PAD)[:, None])
    assert torch.equal(a, b)                              # no dropout in eval mode
    assert model.encoder.layers[0].self_attn.attn is None
    model.train()
    assert not torch.equal(model.encode(src, (src != PAD)[:, None]), a)   # attention dropout is applied


@pytest.mark.parametrize("V,eps", [(5, 0.1), (12, 0.0), (40, 0.3)])
def test_closed_form_label_smoothing(V, eps):
    x = torch.randn(64, V, dtype=torch.float64).log_softmax(-1).requires_grad_(True)
    t = torch.randint(0, V, (64,))
    slow = LabelSmoothing(V, 0, eps)(x, t)
    g_slow, = torch.autograd.grad(slow, x)
    fast = LabelSmoothing(V, 0, eps, fast=True)(x, t)
    g_fast, = torch.autograd.grad(fast, x)
    torch.testing.assert_close(fast, slow, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(g_fast, g_slow)
