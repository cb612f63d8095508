"""The paper's Figures 1 and 2 are drawn from the model's own structure (appendix A6): the
drawing changes with the model, and every box names code that exists, in a chapter that exists."""

from pathlib import Path

import pytest
from torch import nn

import annotated
from annotated import MultiHeadedAttention, make_model
from annotated.experiments.blocks import attention_steps, chapter_of, heads_of, model_structure
from annotated.experiments.figures import draw_attention, draw_model

ROOT = Path(__file__).resolve().parent.parent
SMALL = {"d_model": 32, "d_ff": 64, "h": 4}


def test_n_is_read_from_the_model_and_changes_the_drawing():
    two, three = make_model(11, 11, N=2, **SMALL), make_model(11, 11, N=3, **SMALL)
    encoder, decoder, _ = model_structure(two)
    assert encoder.N == len(two.encoder.layers) == 2 and decoder.N == 2
    assert "N = 2 ×" in draw_model(two).svg and "N = 3 ×" not in draw_model(two).svg
    assert "N = 3 ×" in draw_model(three).svg


def test_sublayers_come_from_the_layers_children():
    model = make_model(11, 11, N=1, **SMALL)
    encoder, decoder, head = model_structure(model)
    assert [[b.label for b in g] for g in encoder.groups] == [
        ["Multi-Head Attention", "Add & Norm"],
        ["Feed Forward", "Add & Norm"],
    ]
    assert [g[0].label for g in decoder.groups] == [
        "Masked Multi-Head Attention",
        "Multi-Head Attention",
        "Feed Forward",
    ]
    assert [b.label for b in head] == ["Linear", "Softmax"]
    pre = model_structure(make_model(11, 11, N=1, norm_first=True, **SMALL))[0]
    assert [b.label for b in pre.groups[0]] == ["Norm", "Multi-Head Attention", "Add"]
    assert pre.final is not None and encoder.final is None


def test_every_box_names_a_class_the_model_holds_and_a_chapter_that_exists():
    model = make_model(11, 11, N=2, learned_positions=True, **SMALL)
    held = {type(m).__name__ for m in model.modules()}
    figure = draw_model(model)
    assert {b.code for b in figure.blocks} <= held
    assert "LearnedPositionalEncoding" in {b.code for b in figure.blocks}
    mha = MultiHeadedAttention(4, 32)
    for b in figure.blocks + draw_attention(mha).blocks:
        assert (ROOT / "notebooks" / f"{b.chapter}.ipynb").exists(), b
        drawn = figure.svg + draw_attention(mha).svg
        assert b.code in drawn and b.tag.split(" · ")[1] in drawn, b.tag
    assert {b.code for b in draw_attention(mha).blocks} <= {"attention", "MultiHeadedAttention"}


def test_the_chapters_are_those_that_build_the_code():
    assert chapter_of(annotated.attention) == "01_attention"
    assert chapter_of(MultiHeadedAttention) == "02_multi_head_attention"
    assert chapter_of(annotated.Embeddings).startswith("04_")
    assert chapter_of(annotated.EncoderDecoder).startswith("05_")
    with pytest.raises((ValueError, TypeError)):
        chapter_of(nn.Linear)


def test_figure_2_follows_the_attention_code_and_the_heads():
    assert [b.label for b in attention_steps()] == [
        "MatMul",
        "Scale",
        "Mask (opt.)",
        "SoftMax",
        "MatMul",
    ]
    heads = heads_of(MultiHeadedAttention(2, 32))
    assert (heads.h, heads.d_k) == (2, 16)
    assert [b.detail for b in heads.projections] + [heads.output.detail] == [
        "w_q",
        "w_k",
        "w_v",
        "w_o",
    ]
    assert "h = 2" in draw_attention(MultiHeadedAttention(2, 32)).svg
    assert "h = 8" in draw_attention(MultiHeadedAttention(8, 32)).svg


def test_the_drawing_is_self_contained_svg():
    html = draw_model(make_model(11, 11, N=1, **SMALL))._repr_html_()
    assert (
        html.count("<svg") == 1
        and "<script" not in html
        and "http://" not in html.replace('xmlns="http://www.w3.org/2000/svg"', "")
    )
