"""The assembled model: parity with torch.nn.Transformer, sharing, counts, errors."""

from dataclasses import asdict

import pytest
import torch
from torch import nn

from annotated import (
    TRANSFORMER_BASE,
    TRANSFORMER_BIG,
    EncoderDecoder,
    ModelConfig,
    count_parameters,
    make_model,
    subsequent_mask,
)

from helpers import copy_attention_into

PAD = 0


def torch_transformer_from(
    model: EncoderDecoder, *, d_model, h, d_ff, N, norm_first
) -> nn.Transformer:
    ref = nn.Transformer(
        d_model,
        h,
        N,
        N,
        d_ff,
        dropout=0.0,
        batch_first=True,
        norm_first=norm_first,
        layer_norm_eps=1e-6,
        dtype=torch.float64,
    )
    if not norm_first:  # the paper's post-norm stacks have no final LayerNorm
        ref.encoder.norm, ref.decoder.norm = None, None

    with torch.no_grad():
        for t, o in zip(ref.encoder.layers, model.encoder.layers):
            copy_attention_into(t.self_attn, o.self_attn)
            t.linear1.load_state_dict(o.feed_forward.w_1.state_dict())
            t.linear2.load_state_dict(o.feed_forward.w_2.state_dict())
            t.norm1.load_state_dict(o.sublayer[0].norm.state_dict())
            t.norm2.load_state_dict(o.sublayer[1].norm.state_dict())
        for t, o in zip(ref.decoder.layers, model.decoder.layers):
            copy_attention_into(t.self_attn, o.self_attn)
            copy_attention_into(t.multihead_attn, o.src_attn)
            t.linear1.load_state_dict(o.feed_forward.w_1.state_dict())
            t.linear2.load_state_dict(o.feed_forward.w_2.state_dict())
            for i, norm in enumerate([t.norm1, t.norm2, t.norm3]):
                norm.load_state_dict(o.sublayer[i].norm.state_dict())
        if norm_first:
            ref.encoder.norm.load_state_dict(model.encoder.norm.state_dict())
            ref.decoder.norm.load_state_dict(model.decoder.norm.state_dict())
    return ref


def random_batch(vocab, batch=4, n_src=9, n_tgt=7):
    src = torch.randint(1, vocab, (batch, n_src))
    tgt = torch.randint(1, vocab, (batch, n_tgt))
    for i, (ls, lt) in enumerate([(9, 7), (5, 3), (1, 6), (7, 1)][:batch]):
        src[i, ls:] = PAD
        tgt[i, lt:] = PAD
    return src, tgt


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("N,d_model,h,d_ff", [(1, 16, 2, 32), (2, 32, 4, 64), (3, 64, 8, 128)])
def test_parity_with_torch_transformer(norm_first, N, d_model, h, d_ff):
    vocab = 23
    model = make_model(
        vocab, vocab, N=N, d_model=d_model, d_ff=d_ff, h=h, dropout=0.0, norm_first=norm_first
    ).double()
    ref = torch_transformer_from(model, d_model=d_model, h=h, d_ff=d_ff, N=N, norm_first=norm_first)
    model.train()
    ref.train()  # dropout is 0; train mode keeps torch off its nested-tensor fast path
    src, tgt = random_batch(vocab)
    src_mask = (src != PAD)[:, None, :]
    tgt_mask = (tgt != PAD)[:, None, :] & subsequent_mask(tgt.size(1))
    got = model(src, tgt, src_mask, tgt_mask)
    want = ref(
        model.src_embed(src),
        model.tgt_embed(tgt),
        tgt_mask=~subsequent_mask(tgt.size(1))[0],
        src_key_padding_mask=src == PAD,
        tgt_key_padding_mask=tgt == PAD,
        memory_key_padding_mask=src == PAD,
    )
    real = tgt != PAD
    torch.testing.assert_close(got[real], want[real], rtol=1e-9, atol=1e-9)
    # the same loss gives the same gradients on every copied weight
    w = torch.randn_like(got)
    (got[real] * w[real]).sum().backward()
    (want[real] * w[real]).sum().backward()
    torch.testing.assert_close(
        model.encoder.layers[0].feed_forward.w_1.weight.grad,
        ref.encoder.layers[0].linear1.weight.grad,
        rtol=1e-9,
        atol=1e-9,
    )
    torch.testing.assert_close(
        model.decoder.layers[-1].src_attn.w_o.weight.grad,
        ref.decoder.layers[-1].multihead_attn.out_proj.weight.grad,
        rtol=1e-9,
        atol=1e-9,
    )


def test_generator_gives_log_probabilities():
    model = make_model(11, 13, N=1, d_model=16, d_ff=32, h=2)
    out = model.generator(torch.randn(2, 3, 16))
    assert out.shape == (2, 3, 13)
    torch.testing.assert_close(out.exp().sum(-1), torch.ones(2, 3))


def test_three_way_sharing_when_vocabularies_match():
    model = make_model(50, 50, N=1, d_model=16, d_ff=32, h=2)
    assert (
        model.src_embed[0].lut.weight
        is model.tgt_embed[0].lut.weight
        is model.generator.proj.weight
    )
    unshared = make_model(50, 50, N=1, d_model=16, d_ff=32, h=2, share_embeddings=False)
    assert count_parameters(unshared) - count_parameters(model) == 2 * 50 * 16
    assert unshared.src_embed[0].lut.weight is not unshared.generator.proj.weight


def test_target_tied_to_generator_when_vocabularies_differ():
    model = make_model(40, 30, N=1, d_model=16, d_ff=32, h=2)
    assert model.tgt_embed[0].lut.weight is model.generator.proj.weight
    assert model.src_embed[0].lut.weight is not model.tgt_embed[0].lut.weight
    assert model.src_embed[0].lut.weight.shape == (40, 16)


def closed_form(V, N, d, d_ff, shared=True):
    attn, ffn, ln = 4 * (d * d + d), 2 * d * d_ff + d_ff + d, 2 * d
    emb = V * d if shared else 3 * V * d
    return emb + N * (attn + ffn + 2 * ln) + N * (2 * attn + ffn + 3 * ln) + V


@pytest.mark.parametrize("cfg,paper", [(TRANSFORMER_BASE, 65e6), (TRANSFORMER_BIG, 213e6)])
def test_parameter_counts_against_table3(cfg, paper):
    with torch.device("meta"):
        model = make_model(37000, 37000, **asdict(cfg))
    n = count_parameters(model)
    assert n == closed_form(37000, cfg.N, cfg.d_model, cfg.d_ff)
    assert abs(n - paper) / paper < 0.03  # within 3% of the paper's rounded figure


def test_learned_positions_and_pre_norm_options():
    model = make_model(
        20, 20, N=2, d_model=16, d_ff=32, h=2, learned_positions=True, norm_first=True
    )
    assert isinstance(model.encoder.norm, nn.LayerNorm)
    pos = model.src_embed[1].pe
    assert isinstance(pos, nn.Embedding) and pos.weight.requires_grad
    src = torch.randint(1, 20, (2, 5))
    out = model(src, src, (src != PAD)[:, None], subsequent_mask(5))
    out.sum().backward()
    assert pos.weight.grad is not None and pos.weight.grad.abs().sum() > 0


def test_config_dataclass_round_trips():
    cfg = ModelConfig(N=2, d_model=32, d_ff=64, h=4, dropout=0.2)
    model = make_model(10, 10, **asdict(cfg))
    assert len(model.encoder.layers) == 2 and model.encoder.layers[0].self_attn.h == 4
    assert model.src_embed[1].dropout.p == 0.2


@pytest.mark.parametrize(
    "kwargs,fragment",
    [
        (dict(d_model=500, h=8), "model.h: d_model=500 is not divisible by h=8"),
        (dict(d_model=30, h=2, learned_positions=False), None),
        (dict(N=0), "model.N: must be at least 1. Change it with --set model.N=VALUE"),
        (dict(d_ff=0), "model.d_ff: must be at least 1. Change it with --set model.d_ff=VALUE"),
        (dict(dropout=1.0), "model.dropout: a dropout rate, must lie in"),
    ],
)
def test_bad_configurations(kwargs, fragment):
    if fragment is None:  # an even d_model divisible by h is fine
        make_model(10, 10, d_ff=8, **kwargs)
        return
    with pytest.raises(ValueError, match=fragment):
        make_model(10, 10, **kwargs)


def test_sequence_longer_than_positional_table():
    model = make_model(10, 10, N=1, d_model=16, d_ff=32, h=2, max_len=8)
    src = torch.ones(1, 9, dtype=torch.long)
    with pytest.raises(ValueError, match="9 positions but the table holds max_len=8"):
        model.encode(src, (src != PAD)[:, None])


def test_defaults_are_the_papers_base_model():
    """make_model(V, V) and a bare ModelConfig are Table 3's base model: post-norm, sinusoids,
    P_drop = 0.1 on sub-layer outputs and embeddings, no dropout anywhere else."""
    assert asdict(ModelConfig()) == dict(
        N=6,
        d_model=512,
        d_ff=2048,
        h=8,
        d_k=0,  # d_model / h
        dropout=0.1,
        share_embeddings=True,
        norm_first=False,
        learned_positions=False,
        max_len=5000,
    )
    model = make_model(11, 11)
    connections = [m for m in model.modules() if type(m).__name__ == "SublayerConnection"]
    assert len(connections) == 6 * 2 + 6 * 3 and not any(c.norm_first for c in connections)
    assert isinstance(model.encoder.norm, nn.Identity) and isinstance(
        model.decoder.norm, nn.Identity
    )
    assert {c.dropout.p for c in connections} == {0.1} and model.src_embed[1].dropout.p == 0.1
    assert all(
        m.dropout is None for m in model.modules() if type(m).__name__ == "MultiHeadedAttention"
    )
    assert {
        m.dropout.p for m in model.modules() if type(m).__name__ == "PositionwiseFeedForward"
    } == {0.0}
    assert type(model.src_embed[1]).__name__ == "PositionalEncoding"
    assert model.src_embed[0].lut.weight is model.generator.proj.weight


def test_unknown_option_names_the_known_ones():
    with pytest.raises(TypeError, match="unknown option.*norm_frist.*norm_first"):
        make_model(10, 10, norm_frist=True)


def test_initialisation_is_the_stated_one():
    """Chapter 5: Xavier-uniform weights and zero biases in every linear map; chapter 4: embedding
    entries N(0, 1/d_model), shared with the output projection."""
    import math

    torch.manual_seed(0)
    d_model, d_ff = 64, 256
    model = make_model(500, 500, N=2, d_model=d_model, d_ff=d_ff, h=4)
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear) and module.weight is not model.generator.proj.weight:
            fan_out, fan_in = module.weight.shape
            bound = math.sqrt(6 / (fan_in + fan_out))
            assert torch.count_nonzero(module.bias) == 0, name
            assert module.weight.abs().max() <= bound, name
            assert abs(module.weight.std().item() - bound / math.sqrt(3)) < 0.1 * bound, name
    embedding = model.src_embed[0].lut.weight
    assert abs(embedding.std().item() * math.sqrt(d_model) - 1) < 0.05
    assert torch.count_nonzero(model.generator.proj.bias) == 0
