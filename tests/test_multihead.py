"""MultiHeadedAttention against torch.nn.MultiheadAttention with copied weights."""

import pytest
import torch
from torch import nn

from annotated import MultiHeadedAttention, attention, subsequent_mask

from helpers import copy_attention_into


def copy_into_torch(
    ours: MultiHeadedAttention, d_model: int, h: int, dtype
) -> nn.MultiheadAttention:
    ref = nn.MultiheadAttention(d_model, h, dropout=0.0, batch_first=True, dtype=dtype)
    copy_attention_into(ref, ours)
    return ref


@pytest.mark.parametrize("h,d_model", [(1, 8), (4, 32), (8, 64)])
@pytest.mark.parametrize("kind", ["self", "causal", "cross-padded"])
def test_parity_with_torch(h, d_model, kind):
    dtype = torch.float64
    ours = MultiHeadedAttention(h, d_model, dropout=0.0).to(dtype)
    ref = copy_into_torch(ours, d_model, h, dtype)
    x = torch.randn(3, 6, d_model, dtype=dtype)
    mem = torch.randn(3, 9, d_model, dtype=dtype)
    if kind == "self":
        got, (want, _) = ours(x, x, x), ref(x, x, x)
    elif kind == "causal":
        m = subsequent_mask(6)
        got = ours(x, x, x, mask=m)
        want, _ = ref(x, x, x, attn_mask=~m[0])
    else:
        lengths = torch.tensor([9, 4, 1])
        keep = torch.arange(9)[None, :] < lengths[:, None]  # (3, 9)
        got = ours(x, mem, mem, mask=keep[:, None, :])
        want, _ = ref(x, mem, mem, key_padding_mask=~keep)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    # gradients agree as well
    got.sum().backward()
    want.sum().backward()
    torch.testing.assert_close(
        ours.w_o.weight.grad, ref.out_proj.weight.grad, rtol=1e-10, atol=1e-10
    )
    torch.testing.assert_close(
        torch.cat([ours.w_q.weight.grad, ours.w_k.weight.grad, ours.w_v.weight.grad]),
        ref.in_proj_weight.grad,
        rtol=1e-10,
        atol=1e-10,
    )


def test_weights_kept_and_heads_independent():
    mha = MultiHeadedAttention(4, 16, dropout=0.0)
    x = torch.randn(2, 5, 16)
    mha(x, x, x)
    assert mha.attn.shape == (2, 4, 5, 5)
    # head 0 depends only on the first d_k rows of W^Q: changing another head's rows leaves it alone
    before = mha.attn.clone()
    with torch.no_grad():
        mha.w_q.weight[4:] += 1.0
    mha(x, x, x)
    torch.testing.assert_close(mha.attn[:, 0], before[:, 0])
    assert not torch.allclose(mha.attn[:, 1], before[:, 1])


def test_matches_single_attention_when_one_head():
    mha = MultiHeadedAttention(1, 8, dropout=0.0)
    x = torch.randn(2, 4, 8)
    expected = mha.w_o(attention(mha.w_q(x), mha.w_k(x), mha.w_v(x))[0])
    torch.testing.assert_close(mha(x, x, x), expected)


def test_indivisible_heads_rejected():
    with pytest.raises(ValueError, match="not divisible by h=6"):
        MultiHeadedAttention(6, 512)


def test_key_bias_gradient_is_zero_in_exact_arithmetic():
    """Softmax ignores a shift shared by every key, so the key projection's bias has no gradient;
    the CUDA tests rely on this when they leave that bias out of their comparisons."""
    torch.manual_seed(0)
    mha = MultiHeadedAttention(4, 32, dropout=0.0).double()
    x = torch.randn(3, 7, 32, dtype=torch.float64)
    mha(x, x, x).pow(2).sum().backward()
    assert mha.w_k.bias.grad.abs().max() < 1e-12
    assert mha.w_q.bias.grad.abs().max() > 1e-3


def test_kept_attention_weights_hold_no_graph_so_the_model_can_be_copied():
    import copy

    mha = MultiHeadedAttention(4, 32, dropout=0.0)
    x = torch.randn(2, 5, 32, requires_grad=True)
    mha(x, x, x).sum().backward()
    assert mha.attn is not None and mha.attn.grad_fn is None and not mha.attn.requires_grad
    copy.deepcopy(mha)  # fails on a non-leaf tensor that carries a graph


def test_a_smaller_key_size_d_k_table_3_row_b():
    """d_k below d_model / h shrinks the query and key projections only; the scores are scaled
    by 1 / sqrt(d_k); the fast path computes the same function."""
    import copy
    import math

    from annotated.fast import make_fast

    torch.manual_seed(0)
    layer = MultiHeadedAttention(4, 32, d_k=2).double()
    assert layer.w_q.weight.shape == layer.w_k.weight.shape == (8, 32)
    assert layer.w_v.weight.shape == layer.w_o.weight.shape == (32, 32)
    x = torch.randn(3, 5, 32, dtype=torch.float64)
    out = layer(x, x, x)
    q, k, v = (
        t.view(3, 5, 4, -1).transpose(1, 2) for t in (layer.w_q(x), layer.w_k(x), layer.w_v(x))
    )
    weights = (q @ k.transpose(-2, -1) / math.sqrt(2)).softmax(-1)
    expected = layer.w_o((weights @ v).transpose(1, 2).reshape(3, 5, 32))
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(layer.attn, weights)
    fast = make_fast(copy.deepcopy(layer))
    torch.testing.assert_close(fast(x, x, x), out)
