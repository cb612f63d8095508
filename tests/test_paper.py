"""The paper's numbers have one home each in the package, and that home says what the paper
says: each is compared here with the sentence of the paper that gives it (Vaswani et al., 2017,
sections 5.3, 5.4 and 6.1, Table 3), read by pattern, not with a copy of the number; and every
default that uses one reads it from its home."""

import inspect
import re
from dataclasses import fields

from annotated import beam, embeddings, loss, schedule
from annotated.decoding import beam_search, beam_search_hypotheses
from annotated.evaluation.translation import translate
from annotated.model import TRANSFORMER_BASE, TRANSFORMER_BIG, ModelConfig
from annotated.training.config import LossConfig, OptimConfig

SECTION_5_3 = (
    "We used the Adam optimizer with beta_1 = 0.9, beta_2 = 0.98 and epsilon = 10^-9. [...] "
    "This corresponds to increasing the learning rate linearly for the first warmup_steps "
    "training steps, and decreasing it thereafter proportionally to the inverse square root of "
    "the step number. We used warmup_steps = 4000."
)
SECTION_5_4 = (
    "Residual Dropout [...] For the base model, we use a rate of P_drop = 0.1. "
    "Label Smoothing During training, we employed label smoothing of value epsilon_ls = 0.1."
)
SECTION_6_1 = (
    "we used beam search with a beam size of 4 and length penalty alpha = 0.6. [...] We set the "
    "maximum output length during inference to input length + 50, but terminate early when "
    "possible."
)
TABLE_3 = {  # the rows "base" and "big", column = value (big leaves d_k, d_v and eps_ls blank)
    "base": "N = 6, d_model = 512, d_ff = 2048, h = 8, d_k = 64, d_v = 64, P_drop = 0.1",
    "big": "N = 6, d_model = 1024, d_ff = 4096, h = 16, P_drop = 0.3",
}


def said(text: str, name: str) -> float:
    """The number the paper gives for `name` in `text` ("name = number", or "of value ... =")."""
    found = re.search(rf"\b{re.escape(name)} = (\d+(?:\.\d+)?(?:\^-\d+)?)", text)
    assert found, (name, text)
    number = found[1]
    if "^" in number:
        base, power = number.split("^")
        return float(base) ** int(power)
    return float(number)


def test_adam_and_the_warmup_are_section_5_3s():
    assert schedule.BETAS == (said(SECTION_5_3, "beta_1"), said(SECTION_5_3, "beta_2"))
    assert schedule.EPS == said(SECTION_5_3, "epsilon")
    assert schedule.WARMUP == said(SECTION_5_3, "warmup_steps")


def test_dropout_and_label_smoothing_are_section_5_4s():
    assert loss.SMOOTHING == said(SECTION_5_4, "epsilon_ls")
    assert ModelConfig().dropout == said(SECTION_5_4, "P_drop")


def test_decoding_is_section_6_1s():
    assert beam.BEAM_SIZE == int(re.search(r"a beam size of (\d+)", SECTION_6_1)[1])
    assert beam.ALPHA == said(SECTION_6_1, "alpha")
    assert beam.EXTRA_LENGTH == int(re.search(r"input length \+ (\d+)", SECTION_6_1)[1])


def test_the_base_and_big_models_are_table_3s():
    for model, row in [(TRANSFORMER_BASE, TABLE_3["base"]), (TRANSFORMER_BIG, TABLE_3["big"])]:
        columns = ("N", "d_model", "d_ff", "h", "P_drop")
        assert (model.N, model.d_model, model.d_ff, model.h, model.dropout) == tuple(
            said(row, c) for c in columns
        )
        assert model.d_model // model.h == said(TABLE_3["base"], "d_k")  # 64 in both rows


def default(function, name):
    return inspect.signature(function).parameters[name].default


def test_every_default_reads_the_one_home():
    """The defaults are the homes' values (a copy elsewhere would drift when a home changed)."""
    assert default(schedule.rate, "warmup") == schedule.WARMUP
    opt = default(schedule.make_optimizer, "betas"), default(schedule.make_optimizer, "eps")
    assert opt == (schedule.BETAS, schedule.EPS)
    optim = {f.name: f.default for f in fields(OptimConfig)}
    assert "adam_beta1" not in optim and optim["adam_beta2"] == schedule.BETAS[1]
    assert (optim["adam_eps"], optim["warmup"]) == (schedule.EPS, schedule.WARMUP)
    assert LossConfig().label_smoothing == loss.SMOOTHING
    assert default(loss.LabelSmoothing.__init__, "smoothing") == loss.SMOOTHING
    for f in (beam.beam_search_core, beam_search, beam_search_hypotheses, translate):
        assert (default(f, "beam_size"), default(f, "alpha")) == (beam.BEAM_SIZE, beam.ALPHA)
    assert ModelConfig().max_len == embeddings.MAX_LEN
    assert default(embeddings.PositionalEncoding.__init__, "max_len") == embeddings.MAX_LEN


def test_the_package_writes_each_number_once():
    """`grep` over the package: 0.6 as a decoding default, 4000 as a warm-up, 0.98 and 1e-9,
    each once (in its home); the source files are the generated modules."""
    from pathlib import Path

    package = Path(beam.__file__).parent
    text = {p: p.read_text() for p in package.rglob("*.py")}

    def places(pattern: str) -> list[str]:
        found = re.compile(pattern)
        return [f"{p.name}:{i}" for p, t in text.items()
                for i, line in enumerate(t.splitlines(), 1) if found.search(line)]  # fmt: skip

    assert places(r"(alpha|ALPHA|length_penalty)\W*(: float )?=\s*0\.6\b|= 4, 0\.6") == [
        f"beam.py:{_line(text, package / 'beam.py', 'BEAM_SIZE, ALPHA = 4, 0.6')}"
    ]
    assert len(places(r"\b4000\b")) == 1 and len(places(r"\b0\.98\b")) == 1
    assert len(places(r"\b1e-9\b|\b1e-09\b")) == 1


def _line(text, path, needle: str) -> int:
    return next(i for i, line in enumerate(text[path].splitlines(), 1) if needle in line)
