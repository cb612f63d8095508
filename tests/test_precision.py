"""The precision policy: the float16 gradient scaler on CPU (a step with an infinite gradient is
skipped and never reaches the weights or a checkpoint), its state in checkpoints for an exact
resume, the choice per device, and the bf16 probe leaving the run untouched."""

import copy
import json
from functools import partial

import pytest
import torch

import annotated.precision as precision_module
from annotated.batching import PAD
from annotated.errors import ConfigError
from annotated.fast import make_fast
from annotated.loss import FusedLabelSmoothing
from annotated.model import ModelConfig, make_model
from annotated.precision import Precision, bf16_speedup, choose_precision
from annotated.schedule import make_optimizer
from annotated.training.config import OptimConfig, TrainConfig, apply_overrides
from annotated.training.tasks.copy import CopyData, copy_batch
from annotated.training.trainer import train
from annotated.training_step import loss_on_batch, train_step


def tiny_model(seed=0):
    torch.manual_seed(seed)
    return make_model(13, 13, N=1, d_model=16, d_ff=32, h=2, dropout=0.0)


def test_fp16_scaler_skips_an_overflowed_step_and_halves_the_scale():
    model = tiny_model()
    opt = make_optimizer(model, d_model=16)[0]
    fp16 = Precision("fp16", "cpu")
    batch = copy_batch(13, 8, generator=torch.Generator().manual_seed(0))
    crit = FusedLabelSmoothing(13, PAD, 0.1)
    stats = train_step(model, [batch], crit, opt, precision=fp16)
    assert not stats["skipped"] and fp16.skipped == 0
    scale = fp16.scaler.get_scale()
    before = copy.deepcopy(model.state_dict())
    with fp16.autocast():
        loss = loss_on_batch(model, batch, crit)
    fp16.backward(loss * float("inf"))  # every gradient becomes inf or NaN
    norm, skipped = fp16.step(opt, model.parameters(), max_grad_norm=1.0)
    assert skipped and fp16.skipped == 1 and fp16.scaler.get_scale() == scale / 2
    assert not torch.isfinite(torch.tensor(norm))
    for k, v in model.state_dict().items():
        assert torch.equal(before[k], v), k


def test_fp16_autocast_runs_the_matrix_multiplies_in_half_precision():
    model = tiny_model()
    batch = copy_batch(13, 4, generator=torch.Generator().manual_seed(0))
    seen = []
    linear = next(m for m in model.modules() if isinstance(m, torch.nn.Linear))
    linear.register_forward_hook(lambda module, args, out: seen.append(out.dtype))
    for name in ("fp16", "bf16", "fp32"):
        with Precision(name, "cpu").autocast():
            out = model(batch.src, batch.tgt, batch.src_mask, batch.tgt_mask)
        assert out.dtype == torch.float32  # layer norm runs in float32 under autocast
    assert seen == [torch.float16, torch.bfloat16, torch.float32]


def test_choose_precision_follows_the_device_and_the_probe():
    assert choose_precision("auto", "cpu") == "fp32"  # no probe: no measurement, no guess
    assert choose_precision("auto", "cpu", probe=lambda: 1.5) == "bf16"
    assert choose_precision("auto", "cpu", probe=lambda: 1.05) == "fp32"
    assert choose_precision("auto", "mps", probe=lambda: 9.0) == "fp32"
    assert choose_precision("fp16", "cpu", probe=lambda: 9.0) == "fp16"
    with pytest.raises(ConfigError, match="choose fp32, bf16, fp16 or auto"):
        choose_precision("half", "cpu")
    with pytest.raises(ConfigError, match="precision: must be auto, fp32, bf16 or fp16"):
        apply_overrides(TrainConfig(data=CopyData()), ["precision=half"])


def test_bf16_probe_leaves_gradients_and_random_state_as_they_were():
    model = make_fast(tiny_model())
    model.train()
    batch = copy_batch(13, 8, generator=torch.Generator().manual_seed(0))
    crit = FusedLabelSmoothing(13, PAD, 0.1)
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    speedup = bf16_speedup(model, lambda: loss_on_batch(model, batch, crit), repeats=1)
    assert speedup > 0 and all(p.grad is None for p in model.parameters())
    assert torch.equal(torch.rand(3), expected)


def copy_config(**changes) -> TrainConfig:
    model = ModelConfig(N=1, d_model=16, d_ff=32, h=2, dropout=0.1)
    base = dict(
        data=CopyData(batch_sentences=8),
        model=model,
        optim=OptimConfig(warmup=10),
        log_every=1,
        precision="fp16",
    )
    return TrainConfig(**{**base, **changes})


def test_fp16_trainer_skips_overflowed_steps_checkpoints_finite_weights_and_resumes_exactly(
    tmp_path, monkeypatch
):
    # a scale of 2^40 overflows float16 at once: the first steps must be skipped, not applied
    monkeypatch.setattr(
        precision_module.torch.amp, "GradScaler", partial(torch.amp.GradScaler, init_scale=2.0**40)
    )
    straight = train(copy_config(max_steps=40, checkpoint_every=20), tmp_path / "a", progress=False)
    train(copy_config(max_steps=20, checkpoint_every=20), tmp_path / "b", progress=False)
    resumed = train(
        copy_config(max_steps=40, checkpoint_every=20), tmp_path / "b", resume=True, progress=False
    )
    a = torch.load(straight["last_checkpoint"], weights_only=False)
    b = torch.load(resumed["last_checkpoint"], weights_only=False)
    assert a["precision"]["name"] == "fp16" and a["precision"]["skipped"] >= 10
    assert a["precision"]["scaler"]["scale"] < 2.0**40
    assert all(torch.isfinite(v).all() for v in a["model"].values())
    assert a["precision"] == b["precision"]
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    records = [json.loads(line) for line in (tmp_path / "a" / "metrics.jsonl").open()]
    assert (
        records[0]["skipped_steps"] == 1
        and records[-1]["skipped_steps"] == a["precision"]["skipped"]
    )
    assert json.loads((tmp_path / "a" / "run.json").read_text())["precision"] == "fp16"
    assert records[-1]["loss"] < records[0]["loss"]  # it learns once the scale fits


def test_bf16_probe_stops_at_once_where_bf16_matrix_multiplies_are_slower(monkeypatch):
    monkeypatch.setattr(precision_module, "matmul_speedup", lambda: 0.01)  # emulated bf16
    calls = []
    assert bf16_speedup(tiny_model(), lambda: calls.append(1)) == 0.01
    assert calls == []  # no forward or backward pass was run


def test_fast_decoding_translates_as_the_reference_and_restores_the_layers():
    """`translate` runs a model as given; inside `fast_decoding` its attention is fused and the
    search runs under the precision asked for (bf16 autocast here); afterwards every layer is of
    chapter 2's class again, and a bad precision is refused before anything runs."""
    from annotated.evaluation.translation import translate
    from annotated.fast import FastMultiHeadedAttention
    from annotated.multihead import MultiHeadedAttention
    from annotated.precision import fast_decoding
    from annotated.training.tasks.copy import IdTokenizer

    model, tokenizer = tiny_model(3).eval(), IdTokenizer(13)
    lines = ["3 4 5", "9 8 7 6", "", "4"]
    plain = translate(model, tokenizer, lines, beam_size=3, nbest=2, max_len=6)
    seen = []
    original = MultiHeadedAttention.forward

    def spy(self, *args, **kwargs):
        seen.append((type(self), torch.is_autocast_enabled("cpu")))
        return original(self, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(MultiHeadedAttention, "forward", spy)
        with fast_decoding(model, "bf16"):
            translate(model, tokenizer, lines[:1], beam_size=2, max_len=4)
    assert seen and all(issubclass(cls, FastMultiHeadedAttention) and cast for cls, cast in seen)
    with fast_decoding(model):  # "auto" on a CPU: float32
        fast = translate(model, tokenizer, lines, beam_size=3, nbest=2, max_len=6)
    assert [[t for t, _ in p] for p in plain] == [[t for t, _ in f] for f in fast]
    assert all(abs(a[1] - b[1]) < 1e-5 for p, f in zip(plain, fast) for a, b in zip(p, f))
    kinds = {type(m) for m in model.modules() if isinstance(m, MultiHeadedAttention)}
    assert kinds == {MultiHeadedAttention}
    with pytest.raises(ConfigError, match="precision='fp8'"):
        with fast_decoding(model, "fp8"):
            pass
