"""Feed-forward network and the residual + LayerNorm wrapper (chapter 3), against their formulas."""

import pytest
import torch
import torch.nn.functional as F

from annotated.layers import PositionwiseFeedForward, SublayerConnection


def branch(t):
    """A sub-layer that is not affine, so that LayerNorm cannot cancel what dropout does to it."""
    return torch.tanh(3 * t + 1)


@pytest.mark.parametrize("norm_first", [False, True])
def test_sublayer_connection_is_the_formula_with_its_dropout_mask(norm_first):
    block = SublayerConnection(16, dropout=0.5, norm_first=norm_first).train()
    x = torch.randn(4, 7, 16)
    torch.manual_seed(5)
    out = block(x, branch)
    torch.manual_seed(5)  # the same mask, drawn by the formula
    if norm_first:
        expected = x + F.dropout(branch(block.norm(x)), 0.5, training=True)
    else:
        expected = block.norm(x + F.dropout(branch(x), 0.5, training=True))
    torch.testing.assert_close(out, expected)
    no_dropout = block.norm(x + branch(x)) if not norm_first else x + branch(block.norm(x))
    assert (out - no_dropout).abs().max() > 0.1  # the dropout did act on the branch
    torch.testing.assert_close(block.eval()(x, branch), no_dropout)  # and not in eval mode


def test_feed_forward_is_the_formula_and_drops_only_when_asked():
    ffn = PositionwiseFeedForward(8, 32).train()
    x = torch.randn(2, 5, 8)
    expected = F.relu(x @ ffn.w_1.weight.T + ffn.w_1.bias) @ ffn.w_2.weight.T + ffn.w_2.bias
    torch.testing.assert_close(ffn(x), expected)  # default: no dropout, as in the paper
    dropping = PositionwiseFeedForward(8, 32, dropout=0.5).train()
    dropping.load_state_dict(ffn.state_dict())
    assert not torch.allclose(dropping(x), expected)
