"""Chapter 14: attention maps recorded by hooks on the model's own layers.

The recorded weights must be the ones each layer used: they equal torch.nn.MultiheadAttention's
per-head weights for the same parameters and inputs, and they rebuild the layer's output.
"""

import pytest
import torch
from torch import nn

from annotated import make_model
from annotated.experiments.attention_maps import (
    KINDS,
    AttentionMaps,
    attention_maps,
    capture_attention,
)
from annotated.experiments.charts import _distinct, attention_chart
from annotated.fast import FastMultiHeadedAttention, make_fast
from annotated.multihead import MultiHeadedAttention

from helpers import copy_attention_into, padded_batch

H, D = 4, 32


def small_model(fast: bool = True) -> nn.Module:
    model = make_model(31, 31, N=2, d_model=D, d_ff=64, h=H, dropout=0.0).double().eval()
    return make_fast(model) if fast else model


def record_calls(model: nn.Module) -> tuple[list, list]:
    """(hook handles, [(module, args, kwargs, output)]) for every attention call."""
    calls, handles = [], []
    for module in model.modules():
        if isinstance(module, MultiHeadedAttention):
            hook = lambda m, a, kw, out: calls.append((m, a, kw, out))  # noqa: E731
            handles.append(module.register_forward_hook(hook, with_kwargs=True))
    return handles, calls


def torch_weights(ours: MultiHeadedAttention, query, key, value, mask):
    """torch.nn.MultiheadAttention's per-head weights for our parameters: (batch, h, n_q, n_k)."""
    theirs = nn.MultiheadAttention(D, H, batch_first=True, dtype=torch.float64)
    copy_attention_into(theirs, ours)
    blocked = ~mask.expand(query.size(0), query.size(1), key.size(1))  # torch: True = blocked
    _, weights = theirs(
        query,
        key,
        value,
        attn_mask=blocked.repeat_interleave(H, dim=0),
        need_weights=True,
        average_attn_weights=False,
    )
    return weights


def test_recorded_weights_are_the_ones_each_layer_used():
    model, batch = small_model(), padded_batch()
    handles, calls = record_calls(model)
    with torch.no_grad(), capture_attention(model) as records:
        model(batch.src, batch.tgt, batch.src_mask, batch.tgt_mask)
    for handle in handles:
        handle.remove()
    recorded = [w for name in records for w in records[name]]
    assert len(recorded) == len(calls) == 3 * 2  # encoder self, decoder self and cross, 2 layers
    by_module = {id(m): records[name] for name, m in model.named_modules() if name in records}
    for module, args, _kwargs, output in calls:
        (weights,) = by_module[id(module)]
        query, key, value, mask = args
        assert weights.shape == (batch.src.size(0), H, query.size(1), key.size(1))
        expected = torch_weights(module, query, key, value, mask)
        torch.testing.assert_close(weights, expected, rtol=0, atol=1e-12)
        with torch.no_grad():  # the weights and the layer's own values give its output
            heads = weights @ module.split_heads(module.w_v(value))  # (batch, h, n_q, d_k)
            rebuilt = module.w_o(heads.transpose(1, 2).reshape(query.size(0), query.size(1), D))
        torch.testing.assert_close(rebuilt, output, rtol=0, atol=1e-12)


def test_recording_changes_nothing_and_is_undone():
    model, batch = small_model(), padded_batch()
    inputs = (batch.src, batch.tgt, batch.src_mask, batch.tgt_mask)
    with torch.no_grad():
        fast = model(*inputs)
        with capture_attention(model) as records:
            kinds = {type(m) for m in model.modules() if isinstance(m, MultiHeadedAttention)}
            assert kinds == {MultiHeadedAttention}  # chapter 2's class, which keeps weights
            recorded = model(*inputs)
    torch.testing.assert_close(recorded, fast, rtol=0, atol=1e-12)
    assert sum(len(calls) for calls in records.values()) == 6
    for module in model.modules():
        if isinstance(module, MultiHeadedAttention):
            assert type(module) is FastMultiHeadedAttention and not module._forward_hooks
    with pytest.raises(RuntimeError, match="inside"):  # an error in the block undoes it too
        with capture_attention(model):
            raise RuntimeError("inside")
    assert all(
        type(m) is FastMultiHeadedAttention
        for m in model.modules()
        if isinstance(m, MultiHeadedAttention)
    )
    plain = small_model(fast=False)
    with capture_attention(plain):
        pass
    assert all(
        type(m) is MultiHeadedAttention
        for m in plain.modules()
        if isinstance(m, MultiHeadedAttention)
    )


class WordTokenizer:
    """Whitespace words as pieces, ids from a fixed small table (ids 4 and up)."""

    def pieces(self, text: str) -> list[str]:
        return text.split()

    def encode(self, text: str) -> list[int]:
        return [4 + sum(map(ord, w)) % 27 for w in text.split()]


def test_attention_maps_label_rows_with_queries_and_columns_with_keys():
    model = small_model()
    maps = attention_maps(model, WordTokenizer(), "a dog runs on a beach", "ein Hund läuft")
    assert maps.source == ["a", "dog", "runs", "on", "a", "beach", "</s>"]
    assert maps.target == ["<s>", "ein", "Hund", "läuft"]
    assert sorted(maps.weights) == sorted((k, i) for k in KINDS.values() for i in range(2))
    for (kind, _), weights in maps.weights.items():
        queries, keys = maps.axes(kind)
        assert weights.shape == (H, len(queries), len(keys)), kind
        torch.testing.assert_close(weights.sum(-1), torch.ones(H, len(queries)))
        if kind == "decoder self-attention":
            assert weights.triu(diagonal=1).abs().max() == 0  # no query sees a later piece
    assert maps.axes("encoder-decoder attention") == (maps.target, maps.source)
    assert maps.axes("encoder self-attention") == (maps.source, maps.source)
    assert maps.axes("decoder self-attention") == (maps.target, maps.target)


def test_the_chart_has_a_selector_for_kind_layer_and_head_and_every_row():
    weights = {
        ("encoder self-attention", 0): torch.rand(2, 3, 3).softmax(-1),
        ("encoder-decoder attention", 0): torch.rand(2, 4, 3).softmax(-1),
    }
    maps = AttentionMaps(["x", "x", "</s>"], ["<s>", "y", "z", "y"], weights)
    spec = attention_chart(maps).to_dict()
    params = {p["name"]: p["bind"] for p in spec["params"]}
    # the kinds these maps hold, in the order recorded: no selector offers an empty map
    assert params["attention"]["options"] == ["encoder self-attention", "encoder-decoder attention"]
    assert params["layer"]["options"] == [0] and params["head"]["options"] == [0, 1]
    assert spec["encoding"]["y"]["field"] == "query" and spec["encoding"]["x"]["field"] == "key"
    rows = spec["datasets"][spec["data"]["name"]]
    assert len(rows) == 2 * 3 + 2 * 4  # one row per head and query
    cross = [r for r in rows if r["attention"] == "encoder-decoder attention" and r["head"] == 1]
    assert [r["query"] for r in cross] == ["<s>", "y", "z", "y·2"]
    assert cross[2]["key"] == ["x", "x·2", "</s>"]
    assert cross[2]["weight"] == [
        round(w, 3) for w in weights[cross[2]["attention"], 0][1, 2].tolist()
    ]
    assert {"flatten": ["key", "key position", "weight"]} in spec["transform"]


def test_repeated_tokens_get_distinct_labels():
    assert _distinct(["▁in", "▁the", "▁in", "▁in"]) == ["▁in", "▁the", "▁in·2", "▁in·3"]
