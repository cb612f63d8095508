"""Chapter 26: where translations fail (length and rarity groups, per-group BLEU, numbers)."""

import pytest

from annotated.bleu_scores import sacrebleu_score
from annotated.evaluation.analysis import (
    bleu_by_group,
    dropped_numbers,
    length_group,
    numbers,
    rarest_word_pieces,
    rarity_group,
)


class Letters:
    """A stand-in tokenizer: a word of n letters takes ceil(n / 4) pieces."""

    def encode(self, text: str) -> list[int]:
        return list(range(-(-len(text) // 4)))


def test_length_groups_cover_every_length_once():
    groups = [length_group(" ".join(["x"] * n)) for n in range(1, 60)]
    assert groups[0] == groups[9] == "1-10" and groups[10] == "11-20" and groups[40] == "41+"
    assert len(set(groups)) == 5
    assert length_group("", edges=(5,)) == "1-5"  # an empty source falls in the first group
    assert length_group("a b c d e f", edges=(5,)) == "6+"


def test_rarity_counts_pieces_of_letter_words_only():
    tok = Letters()
    assert rarest_word_pieces("a cat sat", tok) == 1
    assert rarest_word_pieces("the Bundesverfassungsgericht ruled", tok) == 6  # 24 letters
    assert rarest_word_pieces("in 20142014201420142014", tok) == 1  # digits are not words here
    assert rarest_word_pieces("", tok) == 1
    assert rarity_group("the Bundesverfassungsgericht", tok) == "4+"
    assert rarity_group("the houses", tok, cap=9) == "2"


def test_bleu_by_group_scores_each_group_alone_in_numeric_order():
    refs = [
        "Das ist ein ganz normaler Satz mit mehreren Wörtern .",
        "Heute scheint die Sonne über der ganzen Stadt .",
        "Der Zug kommt heute leider eine Stunde zu spät an .",
    ]
    hyps = [refs[0], "Morgen regnet es .", refs[2]]
    groups = ["11-20", "41+", "11-20"]
    rows = bleu_by_group(groups, hyps, refs)
    assert [r["group"] for r in rows] == ["11-20", "41+"]
    assert rows[0]["sentences"] == 2 and rows[0]["sacrebleu"] == pytest.approx(100)
    assert rows[0]["ratio"] == 1.0
    assert rows[1]["sacrebleu"] == pytest.approx(sacrebleu_score([hyps[1]], [refs[1]])[0])
    assert rows[1]["ratio"] == pytest.approx(4 / 9)  # too short: content left out
    order = bleu_by_group(["10+", "2", "1-9"], hyps, refs)
    assert [r["group"] for r in order] == ["1-9", "2", "10+"]


def test_numbers_compare_by_digits_and_only_shared_ones_are_expected():
    assert numbers("1,000.5 and 1.000,5 and 10:30") == {"10005": 2, "1030": 1}
    assert numbers("no digits here") == {}
    assert dropped_numbers("3 cats and 3 dogs", "3 Katzen und 3 Hunde", "3 Katzen") == ["3"]
    assert dropped_numbers("at 9 p.m.", "um 21 Uhr", "um 9 Uhr") == []  # rewritten: not expected
    assert dropped_numbers("in 2014", "im Jahr 2014", "im Jahr 2.014") == []
    assert dropped_numbers("2 girls", "2 Mädchen", "Zwei Mädchen") == ["2"]
