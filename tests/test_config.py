"""The configuration (chapter 17): every setting, at and past its edges, is refused with a message
or trains; nothing in between ends in a traceback or takes the machine's memory."""

import math
from pathlib import Path

import pytest

from annotated.errors import ConfigError, ExpectedError
from annotated.training.config import apply_overrides, settings_of
from annotated.training.registry import build_config
from annotated.training.trainer import train

# a copy model small enough that a run of two steps takes a fraction of a second
TINY = ["model.N=1", "model.d_model=16", "model.d_ff=16", "model.h=2", "max_steps=2",
        "checkpoint_every=0", "log_every=1", "data.batch_sentences=4"]  # fmt: skip
HUGE = [str(2**40), str(2**63 - 1), str(2**63)]  # past any machine, past 64 bits
EDGES = {
    bool: ["true", "false"],
    int: ["-1", "0", "1", "2", *HUGE],
    float: ["-1", "0", "1e-300", "0.5", "0.999999", "1", "1e300", "nan", "inf", "-inf"],
    str: ["", "x"],
}
NOT_RUN = {
    "task": "fixed per configuration: test_registry",
    "init": "a checkpoint's path: test_faults, test_train",
    "compile": "torch.compile takes 20 s: test_fast_path's compile switch",
    "max_steps": "a huge value would train for ever; its small edges run below",
}


def test_every_setting_at_and_past_its_edges_is_refused_with_a_message_or_trains(tmp_path):
    base = build_config("copy", TINY)
    settings = values = refused = trained = messages = 0
    for key, value in settings_of(base).items():
        if key in NOT_RUN and key != "max_steps":
            continue
        settings += 1
        for text in EDGES[type(value)]:
            values += 1
            try:
                cfg = apply_overrides(base, [f"{key}={text}"])
            except ConfigError as e:
                assert key in str(e), (key, text, str(e))
                refused += 1
                continue
            if key == "max_steps" and text in HUGE:
                continue
            run = tmp_path / f"{values}"
            try:
                train(cfg, run, progress=False)
                trained += 1
            except ExpectedError as e:  # a message: what, where and what to do
                assert len(str(e)) > 40 and "\n" not in str(e).strip(), (key, text, str(e))
                messages += 1
            except BaseException as e:  # a traceback: a bug
                raise AssertionError(f"{key}={text}: {type(e).__name__}: {e}") from None
    print(f"{settings} settings walked, {values} values: {refused} refused as they were set, "
          f"{messages} refused by the run with a message, {trained} runs trained")  # fmt: skip
    assert settings == len(settings_of(base)) - len(NOT_RUN) + 1
    assert refused > settings and trained > settings and messages >= 10


def test_a_model_larger_than_the_machine_is_refused_before_it_is_built(tmp_path):
    """Before it was, model.N=2**40 built layers until the operating system killed the process."""
    for setting in ("model.N", "model.d_model", "model.d_ff", "model.max_len", "data.vocab"):
        cfg = build_config("copy", [*TINY, f"{setting}={2**40}"])
        try:
            train(cfg, tmp_path / setting, progress=False)
        except ConfigError as e:
            assert "the weights alone need" in str(e) and "GiB" in str(e), str(e)
        else:
            raise AssertionError(f"{setting}={2**40} trained")
    cfg = build_config("copy", [*TINY, f"batch.accum={2**17}"])
    try:
        train(cfg, Path(tmp_path) / "accum", progress=False)
    except ConfigError as e:
        assert "131,072 micro-batches a step" in str(e), str(e)
    else:
        raise AssertionError("131,072 micro-batches a step were held in memory")


def test_digits_of_other_scripts_are_refused_rather_than_read_as_numbers():
    """Python reads int("٣") as 3 and float("１.５") as 1.5: a setting written so is refused, as a
    reader of the command line or the file would not take it for that number."""
    base = build_config("copy")
    for key, text in [("max_steps", "٣"), ("max_steps", "1٣"), ("optim.lr_factor", "１.５")]:
        with pytest.raises(ConfigError, match=f"{key}={text}: {key} expects a value of type"):
            apply_overrides(base, [f"{key}={text}"])
    assert apply_overrides(base, ["max_steps=3"]).max_steps == 3


def test_an_adam_epsilon_that_float32_rounds_to_zero_is_refused_rather_than_diverging(tmp_path):
    """`optim.adam_eps=1e-320` was "positive" and so accepted; in float32 it is 0, and Adam
    divided 0 by 0 at the first weight without a gradient: a NaN reported as a diverged run."""
    for tiny in ("1e-320", "1e-45", "1e-40"):
        with pytest.raises(ConfigError, match=r"optim\.adam_eps: must be at least 2\*\*-126"):
            build_config("copy", [*TINY, f"optim.adam_eps={tiny}"])
    edge = build_config("copy", [*TINY, f"optim.adam_eps={2**-126!r}", "max_steps=10"])
    assert math.isfinite(train(edge, tmp_path / "edge", progress=False)["loss"])  # it trained
