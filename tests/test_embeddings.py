"""Embeddings and positional encodings."""

import math

import pytest
import torch

from annotated import Embeddings, LearnedPositionalEncoding, PositionalEncoding
from annotated.embeddings import sinusoidal_table


def test_embedding_scaled_by_sqrt_d_model():
    emb = Embeddings(64, 100)
    ids = torch.tensor([[3, 7, 3]])
    torch.testing.assert_close(emb(ids), emb.lut.weight[ids] * 8.0)
    # initialised so that scaled embeddings have unit variance
    assert abs((emb.lut.weight * 8.0).var().item() - 1.0) < 0.1


def test_sinusoid_matches_formula_elementwise():
    pe = sinusoidal_table(50, 16)
    for pos in [0, 1, 17, 49]:
        for i in range(8):
            angle = pos / 10000 ** (2 * i / 16)
            assert math.isclose(pe[pos, 2 * i].item(), math.sin(angle), abs_tol=1e-6)
            assert math.isclose(pe[pos, 2 * i + 1].item(), math.cos(angle), abs_tol=1e-6)


@pytest.mark.parametrize("k", [1, 3, 25])
def test_relative_offset_is_a_fixed_linear_map(k):
    d, n = 32, 200
    pe = sinusoidal_table(n, d).double()
    w = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    m = torch.zeros(d, d, dtype=torch.float64)
    c, s = torch.cos(w * k), torch.sin(w * k)
    m[0::2, 0::2], m[0::2, 1::2] = torch.diag(c), torch.diag(s)
    m[1::2, 0::2], m[1::2, 1::2] = torch.diag(-s), torch.diag(c)
    torch.testing.assert_close(pe[:-k] @ m.T, pe[k:], atol=1e-5, rtol=0)
    dots = (pe[:-k] * pe[k:]).sum(-1)  # depends on k only
    assert (dots.max() - dots.min()).item() < 1e-4


def test_positions_are_distinct_and_bounded():
    pe = sinusoidal_table(512, 64)
    assert pe.abs().max() <= 1.0
    dist = torch.cdist(pe, pe)
    dist.fill_diagonal_(float("inf"))
    assert dist.min() > 1e-2


def test_positional_encoding_adds_and_offsets():
    pos = PositionalEncoding(16, dropout=0.0, max_len=30)
    x = torch.zeros(2, 5, 16)
    torch.testing.assert_close(pos(x), pos.pe[:, :5].expand(2, 5, 16))
    torch.testing.assert_close(pos(x[:, :1], start=4), pos.pe[:, 4:5].expand(2, 1, 16))
    assert "pe" in pos.state_dict() and not any(p is pos.pe for p in pos.parameters())


@pytest.mark.parametrize("cls", [PositionalEncoding, LearnedPositionalEncoding])
def test_too_long_is_an_error_with_a_fix(cls):
    with pytest.raises(ValueError, match="max_len=10.*larger max_len"):
        cls(8, 0.0, max_len=10)(torch.zeros(1, 11, 8))
    with pytest.raises(ValueError, match="12 positions"):
        cls(8, 0.0, max_len=10)(torch.zeros(1, 2, 8), start=10)


def test_odd_d_model_rejected_for_sinusoid():
    with pytest.raises(ValueError, match="even d_model"):
        sinusoidal_table(10, 7)
