"""Helpers that several test files share."""

import torch
from torch import nn

from annotated.batching import PAD, Batch
from annotated.multihead import MultiHeadedAttention


def padded_batch(vocab: int = 31, seed: int = 0) -> Batch:
    """A random batch of 4 sentences with ragged source and target lengths (one target of a
    single token), so that every padding mask matters."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(3, vocab, (4, 9), generator=g)
    tgt = torch.randint(3, vocab, (4, 8), generator=g)
    src[1, 5:] = PAD
    src[3, 2:] = PAD
    tgt[2, 4:] = PAD
    tgt[3, 1:] = PAD
    return Batch(src, tgt, PAD)


@torch.no_grad()
def copy_attention_into(theirs: nn.MultiheadAttention, ours: MultiHeadedAttention) -> None:
    """Our four projections into torch's layout: Q, K and V stacked in in_proj, then out_proj."""
    theirs.in_proj_weight.copy_(torch.cat([ours.w_q.weight, ours.w_k.weight, ours.w_v.weight]))
    theirs.in_proj_bias.copy_(torch.cat([ours.w_q.bias, ours.w_k.bias, ours.w_v.bias]))
    theirs.out_proj.weight.copy_(ours.w_o.weight)
    theirs.out_proj.bias.copy_(ours.w_o.bias)
