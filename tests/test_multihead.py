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


def _chapter_2_code() -> str:
    """The code cells of chapter 2, joined: what the reader is shown."""
    import json

    from helpers import ROOT

    cells = json.loads((ROOT / "notebooks/02_multi_head_attention.ipynb").read_text())["cells"]
    return "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")


def test_a_model_without_the_fast_path_runs_the_code_chapter_2_shows():
    """Every attention layer of a model from make_model is of chapter 2's class, and a training
    forward and backward pass through it calls no function of annotated/multihead.py whose
    source chapter 2 does not show, and nothing of the fast path (annotated/fast.py)."""
    import inspect
    import sys
    from pathlib import Path

    from annotated.loss import LabelSmoothing
    from annotated.model import make_model
    from annotated.training_step import loss_on_batch

    from helpers import padded_batch

    model = make_model(31, 31, N=2, d_model=16, d_ff=32, h=2)
    kinds = {type(m) for m in model.modules() if isinstance(m, MultiHeadedAttention)}
    assert kinds == {MultiHeadedAttention}
    called = set()

    def profile(frame, event, arg):
        if event == "call" and Path(frame.f_code.co_filename).name in ("multihead.py", "fast.py"):
            called.add(frame.f_code)

    sys.setprofile(profile)
    try:
        loss_on_batch(model, padded_batch(31), LabelSmoothing(31, 0, 0.1)).backward()
    finally:
        sys.setprofile(None)
    shown = _chapter_2_code()
    names = {code.co_qualname for code in called}
    assert {"MultiHeadedAttention.forward", "MultiHeadedAttention.attend"} <= names, names
    for code in called:
        assert Path(code.co_filename).name == "multihead.py", code.co_qualname
        function = getattr(MultiHeadedAttention, code.co_name, None)
        source = inspect.getsource(function if function is not None else code)
        assert inspect.cleandoc(source) in inspect.cleandoc(shown) or source in shown, (
            f"{code.co_qualname} runs, but chapter 2 does not show it"
        )


def test_importing_any_module_leaves_chapter_2s_class_unchanged():
    """MultiHeadedAttention's attributes, recorded before anything else of the package is
    imported, are the very same objects after every module of it has been imported; each of its
    functions was defined in its class body, in annotated/multihead.py."""
    import subprocess
    import sys

    from helpers import ROOT

    script = """
import importlib, pkgutil, sys
from annotated.multihead import MultiHeadedAttention as M
before = dict(vars(M))
import annotated
names = [m.name for m in pkgutil.walk_packages(annotated.__path__, "annotated.")]
for name in names:
    importlib.import_module(name)
after = dict(vars(M))
assert after.keys() == before.keys(), sorted(after.keys() ^ before.keys())
changed = [k for k in before if after[k] is not before[k]]
assert not changed, changed
for key, value in after.items():
    if callable(value) and hasattr(value, "__qualname__"):
        assert value.__qualname__ == "MultiHeadedAttention." + key, (key, value.__qualname__)
        assert value.__module__ == "annotated.multihead", (key, value.__module__)
print(len(names), "modules imported")
"""
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert int(done.stdout.split()[0]) > 50
