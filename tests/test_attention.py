"""Scaled dot-product attention and masks against independent references."""

import math

import pytest
import torch

from annotated import attention, subsequent_mask


def reference_attention(q, k, v, mask=None):
    """The paper's formula in float64 with explicit exponentials (no torch.softmax)."""
    q, k, v = q.double(), k.double(), v.double()
    s = torch.einsum("...id,...jd->...ij", q, k) / math.sqrt(q.shape[-1])
    if mask is not None:
        s = torch.where(mask.bool(), s, torch.tensor(-math.inf, dtype=torch.float64))
    e = torch.exp(s - s.amax(-1, keepdim=True))
    w = e / e.sum(-1, keepdim=True)
    return torch.einsum("...ij,...jd->...id", w, v), w


@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (2, 5, 7, 8), (3, 4, 6, 6, 16), (1, 9, 3, 64)])
def test_matches_float64_reference(shape):
    *batch, n_q, n_k, d = shape
    q = torch.randn(*batch, n_q, d)
    k, v = torch.randn(*batch, n_k, d), torch.randn(*batch, n_k, d + 3)
    out, p = attention(q, k, v)
    ref_out, ref_p = reference_attention(q, k, v)
    torch.testing.assert_close(out.double(), ref_out, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(p.double(), ref_p, rtol=1e-5, atol=1e-6)


def test_float64_agrees_to_rounding():
    q, k, v = torch.randn(3, 2, 10, 32, dtype=torch.float64).unbind(0)
    out, _ = attention(q, k, v)
    torch.testing.assert_close(out, reference_attention(q, k, v)[0], rtol=1e-12, atol=1e-12)


def test_padding_mask_blocks_keys_exactly():
    q, k, v = torch.randn(3, 2, 5, 8).unbind(0)
    mask = torch.tensor([[[1, 1, 1, 0, 0]], [[1, 1, 1, 1, 1]]], dtype=torch.bool)  # (2, 1, 5)
    out, p = attention(q, k, v, mask)
    assert (p[0, :, 3:] == 0).all()
    torch.testing.assert_close(p.sum(-1), torch.ones(2, 5))
    # blocked keys are irrelevant: the same as attending over the first three only
    out_short, _ = attention(q[:1], k[:1, :3], v[:1, :3])
    torch.testing.assert_close(out[:1], out_short)
    torch.testing.assert_close(
        out, reference_attention(q, k, v, mask)[0].float(), rtol=1e-5, atol=1e-6
    )


def test_integer_mask_and_fully_masked_row():
    q, k, v = torch.randn(3, 1, 4, 8).unbind(0)
    mask = torch.ones(1, 4, 4, dtype=torch.long)
    mask[0, 2] = 0  # query 2 may see nothing
    out, p = attention(q, k, v, mask)
    assert torch.isfinite(out).all() and (p[0, 2] == 0).all() and (out[0, 2] == 0).all()
    torch.testing.assert_close(p[0, [0, 1, 3]].sum(-1), torch.ones(3))


def test_subsequent_mask():
    m = subsequent_mask(4)
    assert m.shape == (1, 4, 4) and m.dtype == torch.bool
    expected = torch.tensor(
        [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.bool
    )
    assert torch.equal(m[0], expected)
    assert subsequent_mask(1).item() is True


def test_causal_mask_hides_the_future():
    q, k, v = torch.randn(3, 2, 6, 8).unbind(0)
    out, _ = attention(q, k, v, subsequent_mask(6))
    k2, v2 = k.clone(), v.clone()
    k2[:, 4:] = torch.randn_like(k2[:, 4:])
    v2[:, 4:] += 5
    out2, _ = attention(q, k2, v2, subsequent_mask(6))
    torch.testing.assert_close(out[:, :4], out2[:, :4], rtol=0, atol=0)
    assert not torch.allclose(out[:, 4:], out2[:, 4:])


def test_dropout_is_applied_to_weights():
    q, k, v = torch.randn(3, 1, 5, 8).unbind(0)
    _, clean = attention(q, k, v)
    drop = torch.nn.Dropout(0.5).train()
    out, p = attention(q, k, v, dropout=drop)
    kept = p != 0
    assert kept.any() and (~kept).any()
    torch.testing.assert_close(p[kept], 2 * clean[kept])  # survivors rescaled by 1/(1-0.5)
    torch.testing.assert_close(out, p @ v)  # the output uses the dropped weights


@pytest.mark.parametrize(
    "q_shape,k_shape,v_shape,mask_shape,fragment",
    [
        ((2, 5, 8), (2, 5, 4), (2, 5, 4), None, "same last dimension d_k"),
        ((2, 5, 8), (2, 6, 8), (2, 5, 8), None, "same number of positions"),
        ((2, 5, 8), (3, 5, 8), (3, 5, 8), None, "do not broadcast"),
        ((2, 5, 8), (2, 6, 8), (2, 6, 8), (2, 1, 5), "mask of shape (2, 1, 5)"),
        ((8,), (5, 8), (5, 8), None, "at least 2 dimensions"),
    ],
)
def test_bad_shapes_are_explained(q_shape, k_shape, v_shape, mask_shape, fragment):
    mask = None if mask_shape is None else torch.ones(mask_shape, dtype=torch.bool)
    with pytest.raises(ValueError) as err:
        attention(torch.randn(q_shape), torch.randn(k_shape), torch.randn(v_shape), mask)
    assert fragment in str(err.value)
