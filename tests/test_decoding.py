"""Beam search, incremental decoding, checkpoint averaging and BLEU (chapter 8)."""

import itertools
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from annotated import (
    average_checkpoints,
    greedy_decode,
    make_model,
    sacrebleu_score,
    tokenized_bleu,
)
from annotated.beam import MAX_ALPHA, length_penalty
from annotated.bleu_scores import PaperTokenizer, split_compounds
from annotated.data.download import read_lines
from annotated.decoding import (
    StepDecoder,
    beam_search,
    beam_search_hypotheses,
    sequence_log_prob,
)
from annotated.errors import TrainingError
from annotated.fast import make_fast

PAD, BOS, EOS = 0, 1, 2
BIN = Path(sys.executable).parent


def random_batch(vocab, batch=5, n=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(3, vocab, (batch, n), generator=g)
    for i in range(batch):  # ragged source lengths, from n down to 2
        src[i, max(2, n - i) :] = PAD
    return src, (src != PAD)[:, None]


def strip(ys):
    """greedy_decode output -> token lists without <s> and </s>, and whether </s> was produced."""
    rows = [row[1:] for row in ys.tolist()]
    return [r[: r.index(EOS)] if EOS in r else r for r in rows], [EOS in r for r in rows]


@pytest.mark.parametrize("norm_first", [False, True])
def test_beam_size_one_is_greedy(norm_first):
    for seed in range(3):
        torch.manual_seed(seed)
        model = make_model(12, 12, N=2, d_model=32, d_ff=64, h=4, norm_first=norm_first).eval()
        src, mask = random_batch(12, seed=seed)
        greedy, _ = strip(greedy_decode(model, src, mask, 15, BOS, end_symbol=EOS))
        for use_cache in (True, False):
            assert (
                beam_search(
                    model, src, mask, 15, BOS, EOS, beam_size=1, alpha=0.6, use_cache=use_cache
                )
                == greedy
            )


def test_beam_does_not_score_below_greedy_on_random_models():
    """With alpha=0 beam search maximises log P(Y|X). This is not a theorem (beam search may prune
    the greedy prefix and then find only worse continuations), so it is checked on fixed random
    models, where it holds: 10 models x 8 sentences."""
    better = 0
    for seed in range(10):
        torch.manual_seed(seed)
        model = make_model(12, 12, N=2, d_model=32, d_ff=64, h=4).double().eval()
        src, mask = random_batch(12, batch=8, n=6, seed=seed)
        greedy, ended = strip(greedy_decode(model, src, mask, 10, BOS, end_symbol=EOS))
        greedy_lp = sequence_log_prob(model, src, mask, greedy, BOS, EOS, ended)
        beams = beam_search_hypotheses(model, src, mask, 10, BOS, EOS, beam_size=4, alpha=0.0)
        beam_lp = torch.tensor([b[0].log_prob for b in beams], dtype=torch.float64)
        best = [b[0] for b in beams]
        torch.testing.assert_close(  # the reported log P is the model's
            sequence_log_prob(
                model, src, mask, [h.tokens for h in best], BOS, EOS, [h.finished for h in best]
            ),
            beam_lp,
        )
        assert (beam_lp >= greedy_lp - 1e-9).all(), (seed, beam_lp - greedy_lp)
        better += int((beam_lp > greedy_lp + 1e-9).sum())
    assert better > 0


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0])
def test_beam_as_large_as_the_search_space_is_exact_search(alpha):
    V, L = 7, 3  # 4 real tokens (+ pad, bos, eos), at most 3 generated tokens
    torch.manual_seed(3)
    model = make_model(V, V, N=1, d_model=16, d_ff=32, h=2).double().eval()
    src, mask = random_batch(V, batch=2, n=4, seed=1)
    outputs = [
        ([*s[:-1]], True) if s[-1] == EOS else ([*s], False)
        for n in range(1, L + 1)
        for s in itertools.product(range(V), repeat=n)
        if EOS not in s[:-1] and (s[-1] == EOS or n == L)
    ]
    beams = beam_search_hypotheses(model, src, mask, L + 1, BOS, EOS, beam_size=V**L, alpha=alpha)
    for i in range(2):
        lp = sequence_log_prob(
            model,
            src[i : i + 1].expand(len(outputs), -1),
            mask[i : i + 1].expand(len(outputs), -1, -1),
            [o for o, _ in outputs],
            BOS,
            EOS,
            [f for _, f in outputs],
        )
        n_tokens = torch.tensor([len(o) + f for o, f in outputs], dtype=torch.float64)
        scores = lp / length_penalty(n_tokens, alpha)
        order = scores.argsort(descending=True)
        best = beams[i][0]
        assert best.tokens == outputs[int(order[0])][0]
        assert math.isclose(best.score, scores.max().item(), rel_tol=1e-12)
        # the whole final beam is the top of the exhaustive ranking
        top = sorted(scores.tolist(), reverse=True)[: len(beams[i])]
        assert [h.score for h in beams[i]] == pytest.approx(top, rel=1e-12)


class TableDecoder:
    """A stand-in decoder: next-token log-probabilities are a fixed random function of the
    prefix."""

    def __init__(self, vocab, seed):
        self.vocab, self.seed = vocab, seed

    def log_probs(self, prefix: tuple) -> torch.Tensor:
        g = torch.Generator().manual_seed(hash((self.seed,) + prefix) % 2**62)
        return torch.log_softmax(2 * torch.randn(self.vocab, generator=g, dtype=torch.float64), -1)

    def step(self, ys):
        return torch.stack([self.log_probs(tuple(row)) for row in ys.tolist()])

    def reorder(self, rows):
        pass


def plain_beam_search(decoder, K, limit, alpha):
    """The paper's search written out: at every step keep the K candidates with the highest
    length-normalised score; a finished hypothesis competes as itself."""
    beam = [((BOS,), 0.0, False)]  # (tokens, log P, finished)
    while not all(done for _, _, done in beam):
        candidates = []
        for ys, lp, done in beam:
            if done:
                candidates.append((ys, lp, True))
                continue
            for token, step_lp in enumerate(decoder.log_probs(ys).tolist()):
                new = ys + (token,)
                candidates.append((new, lp + step_lp, token == EOS or len(new) - 1 >= limit))
        score = {c: c[1] / ((5 + len(c[0]) - 1) / 6) ** alpha for c in candidates}
        beam = sorted(candidates, key=score.get, reverse=True)[:K]
    return max(beam, key=lambda c: c[1] / ((5 + len(c[0]) - 1) / 6) ** alpha)[0][1:]


@pytest.mark.parametrize("alpha", [0.6, 2.0])
def test_length_penalty_ranks_candidates_during_the_search(alpha):
    """Applying lp only to the final beam is a different search, which prunes hypotheses the
    paper's search keeps; compare with the search written out, on 40 random tables."""
    from annotated.beam import beam_search_core

    for seed in range(40):
        decoder = TableDecoder(6, seed)
        best = beam_search_core(decoder, 1, torch.tensor([5]), BOS, EOS, beam_size=3, alpha=alpha)[
            0
        ][0]
        expected = plain_beam_search(decoder, 3, 5, alpha)
        assert best.tokens + [EOS] * best.finished == list(expected), seed


@pytest.mark.parametrize(
    "config", [dict(), dict(norm_first=True), dict(learned_positions=True), dict(fast=True)]
)
def test_cache_gives_the_same_hypotheses(config):
    config = dict(config)
    fast = config.pop("fast", False)
    for seed in range(2):
        torch.manual_seed(seed)
        model = make_model(15, 15, N=2, d_model=32, d_ff=64, h=4, **config).double().eval()
        model = make_fast(model) if fast else model
        src, mask = random_batch(15, batch=4, n=6, seed=seed)
        for beam_size, max_len in [(1, 12), (3, 12), (5, None)]:
            fast = beam_search_hypotheses(
                model, src, mask, max_len, BOS, EOS, beam_size, 0.6, use_cache=True
            )
            slow = beam_search_hypotheses(
                model, src, mask, max_len, BOS, EOS, beam_size, 0.6, use_cache=False
            )
            assert [[h.tokens for h in b] for b in fast] == [[h.tokens for h in b] for b in slow]
            for fb, sb in zip(fast, slow):
                assert [h.score for h in fb] == pytest.approx([h.score for h in sb], rel=1e-10)


@pytest.mark.parametrize("norm_first", [False, True])
def test_greedy_decoding_with_and_without_the_cache_agree(norm_first):
    torch.manual_seed(3)
    model = make_model(12, 12, N=2, d_model=32, d_ff=64, h=4, norm_first=norm_first).eval()
    src, mask = random_batch(12, batch=6, seed=3)
    cached = greedy_decode(model, src, mask, 15, BOS, end_symbol=EOS, use_cache=True)
    recomputed = greedy_decode(model, src, mask, 15, BOS, end_symbol=EOS, use_cache=False)
    assert torch.equal(cached, recomputed)


def test_beam_search_runs_the_fast_layers(monkeypatch):
    """On a model switched to the fast path, the search calls the fused attention kernel (the
    decoder layers are the model's own, not a copy) and finds what the reference path finds."""
    torch.manual_seed(0)
    reference = make_model(15, 15, N=2, d_model=32, d_ff=64, h=4).double().eval()
    fast = make_fast(make_model(15, 15, N=2, d_model=32, d_ff=64, h=4).double().eval())
    fast.load_state_dict(reference.state_dict())
    src, mask = random_batch(15, batch=4, n=6)
    expected = beam_search(reference, src, mask, None, BOS, EOS, 4, 0.6)
    fused = torch.nn.functional.scaled_dot_product_attention
    calls = []

    def counting(*args, **kwargs):
        calls.append(args[0].shape)
        return fused(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", counting)
    assert beam_search(fast, src, mask, None, BOS, EOS, 4, 0.6) == expected
    one_query = [shape for shape in calls if shape[2] == 1]  # (rows, h, 1, d_k): one new position
    assert len(one_query) > 0 and one_query[0][0] == 4 * 4  # 4 sentences x beam 4 ...
    assert all(shape[0] % 4 == 0 for shape in one_query)  # ... fewer as sentences finish


def test_finished_sentences_leave_the_batch(monkeypatch):
    """Three sentences with limits of 55, 54 and 53 tokens: the decoder is asked for fewer rows
    as each one finishes, and every sentence gets what decoding it alone gives."""
    torch.manual_seed(0)
    model = make_model(10, 10, N=1, d_model=16, d_ff=32, h=2).eval()
    with torch.no_grad():
        model.generator.proj.bias[EOS] = -3.0  # ends late, at different steps per sentence
    src, mask = random_batch(10, batch=3, n=5)
    rows_seen = []
    step = StepDecoder.step

    def counting(self, ys):
        rows_seen.append(ys.size(0))
        return step(self, ys)

    monkeypatch.setattr(StepDecoder, "step", counting)
    together = beam_search_hypotheses(model, src, mask, None, BOS, EOS, beam_size=3)
    assert rows_seen[0] == 9 and rows_seen == sorted(rows_seen, reverse=True)
    assert len(set(rows_seen)) > 1  # some sentence left before the last one finished
    for i in range(3):
        alone = beam_search_hypotheses(model, src[i : i + 1], mask[i : i + 1], None, BOS, EOS, 3)
        assert [h.tokens for h in alone[0]] == [h.tokens for h in together[i]]
        assert [h.score for h in alone[0]] == pytest.approx([h.score for h in together[i]])


def test_length_limits():
    torch.manual_seed(0)
    model = make_model(10, 10, N=1, d_model=16, d_ff=32, h=2).eval()
    with torch.no_grad():
        model.generator.proj.bias[EOS] = -1e9  # never finishes: every search runs to its limit
    src, mask = random_batch(10, batch=3, n=5)
    n_src = mask.sum(-1).squeeze(-1).tolist()  # [5, 4, 3]
    beams = beam_search_hypotheses(model, src, mask, None, BOS, EOS, beam_size=2)
    # the paper's input length + 50
    assert [len(b[0].tokens) for b in beams] == [n + 50 for n in n_src]
    assert not any(h.finished for b in beams for h in b)
    # max_len counts <s>
    assert [len(t) for t in beam_search(model, src, mask, 6, BOS, EOS)] == [5, 5, 5]


def test_empty_source_gives_empty_output():
    torch.manual_seed(0)
    model = make_model(10, 10, N=1, d_model=16, d_ff=32, h=2).eval()
    src = torch.tensor([[5, 6, EOS], [PAD, PAD, PAD]])
    out = beam_search(model, src, (src != PAD)[:, None], None, BOS, EOS)
    assert out[1] == [] and len(out) == 2
    empty = torch.full((2, 3), PAD)
    assert beam_search(model, empty, (empty != PAD)[:, None], None, BOS, EOS) == [[], []]


def test_dropout_is_off_during_search_and_mode_is_restored():
    torch.manual_seed(0)
    model = make_model(10, 10, N=2, d_model=16, d_ff=32, h=2, dropout=0.5)
    src, mask = random_batch(10, batch=3)
    model.eval()
    expected = beam_search(model, src, mask, 10, BOS, EOS)
    model.train()
    assert beam_search(model, src, mask, 10, BOS, EOS) == expected
    assert model.training


def test_bad_arguments():
    model = make_model(10, 10, N=1, d_model=16, d_ff=32, h=2)
    src, mask = random_batch(10, batch=1)
    with pytest.raises(ValueError, match="beam_size"):
        beam_search(model, src, mask, 10, BOS, EOS, beam_size=0)
    with pytest.raises(ValueError, match="max_len"):
        beam_search(model, src, mask, 0, BOS, EOS)
    for alpha in (1e308, math.inf, math.nan, -0.1):  # 1e308 was an IndexError's traceback
        with pytest.raises(ValueError, match=r"alpha must lie in \[0, 5\]"):
            beam_search(model, src, mask, 10, BOS, EOS, alpha=alpha)
    # the largest exponent allowed keeps every score finite, on outputs of up to 200 tokens
    beams = beam_search_hypotheses(model, src, mask, 201, BOS, EOS, 4, MAX_ALPHA)
    assert all(math.isfinite(h.score) for beam in beams for h in beam)
    from annotated.data.tokenizer import IdTokenizer
    from annotated.evaluation.translation import translate

    with pytest.raises(ValueError, match="alpha 0 to 5"):  # the sentences' entry point too
        translate(model, IdTokenizer(10), ["3 4"], alpha=1e308)


# ---------------------------------------------------------------- checkpoint averaging


def test_average_of_two_checkpoints_is_the_elementwise_mean(tmp_path):
    torch.manual_seed(0)
    a, b = (make_model(11, 11, N=1, d_model=16, d_ff=32, h=2) for _ in range(2))
    torch.save({"model": a.state_dict(), "step": 10}, tmp_path / "a.pt")  # the trainer's format
    torch.save(b.state_dict(), tmp_path / "b.pt")  # a plain state_dict
    avg = average_checkpoints([tmp_path / "a.pt", tmp_path / "b.pt"])
    sa, sb = a.state_dict(), b.state_dict()
    assert avg.keys() == sa.keys()
    for k in sa:
        torch.testing.assert_close(avg[k], (sa[k] + sb[k]) / 2)
        assert avg[k].dtype == sa[k].dtype
    m = make_model(11, 11, N=1, d_model=16, d_ff=32, h=2)
    m.load_state_dict(avg)  # shared embeddings load fine
    assert m.generator.proj.weight is m.tgt_embed[0].lut.weight


def test_average_keeps_half_precision_and_integer_entries(tmp_path):
    for i, v in enumerate([1.0, 2.0, 4.0]):
        torch.save(
            {"w": torch.full((3,), v, dtype=torch.float16), "n": torch.tensor(i)},
            tmp_path / f"{i}.pt",
        )
    avg = average_checkpoints(sorted(tmp_path.glob("*.pt")))
    assert avg["w"].dtype == torch.float16 and torch.equal(
        avg["w"], torch.full((3,), 7 / 3, dtype=torch.float16)
    )
    assert int(avg["n"]) == 2  # from the last checkpoint


def test_average_refuses_different_models(tmp_path):
    torch.save(make_model(11, 11, N=1, d_model=16, d_ff=32, h=2).state_dict(), tmp_path / "a.pt")
    torch.save(make_model(11, 11, N=1, d_model=16, d_ff=64, h=2).state_dict(), tmp_path / "wide.pt")
    torch.save(make_model(11, 11, N=2, d_model=16, d_ff=32, h=2).state_dict(), tmp_path / "deep.pt")
    with pytest.raises(
        ValueError, match=r"encoder\.layers\.0\.feed_forward\.w_1\.weight \(32, 16\) vs \(64, 16\)"
    ):
        average_checkpoints([tmp_path / "a.pt", tmp_path / "wide.pt"])
    with pytest.raises(ValueError, match=r"unexpected decoder\.layers\.1\."):
        average_checkpoints([tmp_path / "a.pt", tmp_path / "deep.pt"])
    with pytest.raises(ValueError, match="no checkpoint"):
        average_checkpoints([])
    torch.save({"model": 3}, tmp_path / "junk.pt")
    with pytest.raises(ValueError, match="neither a state_dict"):
        average_checkpoints([tmp_path / "junk.pt"])


def test_average_refuses_checkpoints_of_different_runs(tmp_path):
    """Equal shapes are not enough: another tokenizer, or another use of the same tensors."""
    weights = make_model(11, 11, N=1, d_model=16, d_ff=32, h=2).state_dict()
    model = {"N": 1, "d_model": 16, "norm_first": False}
    run = {"model": weights, "tokenizer": "bpe11-aaaa", "config": {"model": model}}
    torch.save(run, tmp_path / "a.pt")
    torch.save({**run, "tokenizer": "bpe11-bbbb"}, tmp_path / "tok.pt")
    torch.save({**run, "config": {"model": {**model, "norm_first": True}}}, tmp_path / "pre.pt")
    torch.save({**run, "step": 7}, tmp_path / "same.pt")
    with pytest.raises(TrainingError, match="a.pt: its tokenizer is bpe11-bbbb, not bpe11-aaaa"):
        average_checkpoints([tmp_path / "a.pt", tmp_path / "tok.pt"])
    with pytest.raises(
        TrainingError, match="another run than .*a.pt: its model.norm_first is True"
    ):
        average_checkpoints([tmp_path / "a.pt", tmp_path / "pre.pt"])
    avg = average_checkpoints([tmp_path / "a.pt", tmp_path / "same.pt"])  # one run: fine
    torch.testing.assert_close(avg, weights)
    torch.save(weights, tmp_path / "plain.pt")  # a plain state_dict records no run: not compared
    torch.testing.assert_close(
        average_checkpoints([tmp_path / "a.pt", tmp_path / "plain.pt"]), weights
    )


# ---------------------------------------------------------------- BLEU

HYPS = ["Die Katze saß auf der Matte.", "Er liest ein Handbuch für das E-Mail-Programm.", ""]
REFS = ["Die Katze sitzt auf der Matte.", "Er liest ein E-Mail-Programm-Handbuch.", "Ende."]


def test_identical_corpora_score_100():
    assert sacrebleu_score(REFS, REFS)[0] == pytest.approx(100.0)
    assert tokenized_bleu(REFS, REFS)[0] == pytest.approx(100.0)


def test_sacrebleu_matches_its_command_line(tmp_path):
    (tmp_path / "hyp").write_text("\n".join(HYPS) + "\n", encoding="utf-8")
    (tmp_path / "ref").write_text("\n".join(REFS) + "\n", encoding="utf-8")

    def sacrebleu_cli(ref, hyp, *options):  # the score sacrebleu's own command prints
        cli = [str(BIN / "sacrebleu"), str(ref), "-i", str(hyp), "-b", "-w", "4", *options]
        return subprocess.run(cli, capture_output=True, text=True, check=True).stdout.strip()

    score, signature = sacrebleu_score(HYPS, REFS)
    assert sacrebleu_cli(tmp_path / "ref", tmp_path / "hyp") == f"{score:.4f}"
    assert "tok:13a" in signature and "version:" in signature
    # tokenized BLEU = sacreBLEU without its own tokenisation and smoothing, on the paper's tokens
    system, reference = PaperTokenizer("de", replace_punctuation=True), PaperTokenizer("de")
    (tmp_path / "hyp.tok").write_text("\n".join(system(h) for h in HYPS) + "\n", encoding="utf-8")
    (tmp_path / "ref.tok").write_text(
        "\n".join(reference(r) for r in REFS) + "\n", encoding="utf-8"
    )
    tscore, description = tokenized_bleu(HYPS, REFS)
    options = ["--tokenize", "none", "--smooth-method", "none", "--force"]
    assert sacrebleu_cli(tmp_path / "ref.tok", tmp_path / "hyp.tok", *options) == f"{tscore:.4f}"
    assert "##AT##" in description and "tok:none" in description
    assert tscore > score  # split compounds add easy matches
    # without compound splitting: the same on the Moses tokens alone
    plain = PaperTokenizer("de", compound_split=False)
    (tmp_path / "hyp.tok").write_text("\n".join(plain(h) for h in HYPS) + "\n", encoding="utf-8")
    (tmp_path / "ref.tok").write_text("\n".join(plain(r) for r in REFS) + "\n", encoding="utf-8")
    pscore, description = tokenized_bleu(HYPS, REFS, compound_split=False)
    assert sacrebleu_cli(tmp_path / "ref.tok", tmp_path / "hyp.tok", *options) == f"{pscore:.4f}"
    assert "##AT##" not in description and "moses-tok:de|" in description
    assert "##AT##" not in plain("Ein E-Mail-Programm.") and pscore < tscore


def test_compound_splitting():
    assert split_compounds("rich-text format") == "rich ##AT##-##AT## text format"
    # non-overlapping, like perl
    assert split_compounds("a-b-c -x y- --") == "a ##AT##-##AT## b-c -x y- --"
    assert (
        PaperTokenizer("de")("Ein E-Mail-Programm-Handbuch, bitte.")
        == "Ein E ##AT##-##AT## Mail ##AT##-##AT## Programm ##AT##-##AT## Handbuch , bitte ."
    )


@pytest.mark.skipif(shutil.which("perl") is None, reason="perl not installed")
def test_compound_splitting_matches_the_perl_one_liner():
    lines = "a-b-c rich-text -x y- 3-4 -- E-Mail-Adresse\nDas ist ein Hin-und-Her.\n"
    perl = subprocess.run(
        ["perl", "-ple", r"s{(\S)-(\S)}{$1 ##AT##-##AT## $2}g"],
        input=lines,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert perl.splitlines() == [split_compounds(x) for x in lines.splitlines()]


def test_length_mismatch_names_both_counts():
    for f in (sacrebleu_score, tokenized_bleu):
        with pytest.raises(ValueError, match="2 hypotheses but 3 references"):
            f(HYPS[:2], REFS)
    with pytest.raises(ValueError, match="empty"):
        sacrebleu_score([], [])


def test_empty_lines_do_not_crash():
    for f in (sacrebleu_score, tokenized_bleu):
        assert f(["", ""], ["a b", "c"])[0] == 0.0
        assert (
            0.0
            < f(
                ["", "Die Katze sitzt auf der Matte."], ["Ende.", "Die Katze sitzt auf der Matte."]
            )[0]
            < 100.0
        )


def test_command_line(tmp_path):
    from annotated.cli.bleu import main as bleu_main

    module = "annotated.cli.bleu"
    (tmp_path / "hyp").write_text("\n".join(HYPS) + "\n", encoding="utf-8")
    (tmp_path / "ref").write_text("\n".join(REFS) + "\n", encoding="utf-8")
    (tmp_path / "short").write_text("\n".join(HYPS[:2]) + "\n", encoding="utf-8")
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            module,
            "--hyp",
            str(tmp_path / "hyp"),
            "--ref",
            str(tmp_path / "ref"),
        ],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr
    from annotated.bleu_scores import lowercase_tokenized_bleu

    lines = {line[:20].strip(): float(line[20:28]) for line in run.stdout.splitlines()}
    plain = tokenized_bleu(HYPS, REFS, compound_split=False)[0]
    assert lines == {
        "sacreBLEU": round(sacrebleu_score(HYPS, REFS)[0], 2),
        "tokenized BLEU": round(plain, 2),
        "compound-split BLEU": round(tokenized_bleu(HYPS, REFS)[0], 2),
        "lowercased BLEU": round(lowercase_tokenized_bleu(HYPS, REFS)[0], 2),
    }
    assert "RuntimeWarning" not in run.stderr
    with pytest.raises(SystemExit) as exit:
        bleu_main(["--hyp", str(tmp_path / "short"), "--ref", str(tmp_path / "ref")])
    assert exit.value.code == 2


def test_lowercase_tokenized_bleu_is_multi_bleu_lc_on_moses_tokens():
    from annotated.bleu_scores import lowercase_tokenized_bleu

    refs = ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee, hinter dem Haus."]
    assert lowercase_tokenized_bleu(refs, refs)[0] == pytest.approx(100)
    ascii_upper = str.maketrans("abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ")
    shouted = [r.translate(ascii_upper) for r in refs]  # "FäHRT": ASCII letters only
    assert lowercase_tokenized_bleu(shouted, refs)[0] == pytest.approx(100)
    assert sacrebleu_score(shouted, refs)[0] < 50
    # Perl's lc on undecoded bytes leaves non-ASCII capitals alone: "FÄHRT" stays "fÄhrt"
    assert lowercase_tokenized_bleu([r.upper() for r in refs], refs)[0] < 100
    # tokenized first, then lowercased: "Nr." is a Moses abbreviation, "nr." is not
    assert (
        lowercase_tokenized_bleu(["Er wohnt in Nr. 5 am Ende."], ["er wohnt in nr. 5 am ende."])[0]
        < 100
    )
    assert lowercase_tokenized_bleu(["Er wohnt in Nr. 5 am Ende."], ["ER WOHNT IN Nr. 5 AM ENDE."])[
        0
    ] == pytest.approx(100)
    half = ["Ein Mann fährt Fahrrad.", "Eine Katze schläft."]
    assert 0 < lowercase_tokenized_bleu(half, refs)[0] < 100
    assert "moses-tok:de+ascii-lowercase" in lowercase_tokenized_bleu(refs, refs)[1]
    with pytest.raises(ValueError, match="1 hypotheses but 2 references"):
        lowercase_tokenized_bleu(refs[:1], refs)


def test_length_penalty_is_gnmts_formula():
    """lp(Y) = ((5 + |Y|) / 6)^alpha (Wu et al. 2016): 1 for a one-token output, whatever alpha,
    and for alpha = 1 a straight line through (1, 1) with slope 1/6."""
    lengths = torch.tensor([1.0, 4.0, 7.0, 31.0], dtype=torch.float64)
    torch.testing.assert_close(length_penalty(lengths, 1.0), (5 + lengths) / 6)
    for alpha in (0.0, 0.6, 2.0):
        assert length_penalty(torch.tensor(1.0), alpha).item() == pytest.approx(1.0)
        torch.testing.assert_close(
            length_penalty(lengths, alpha), length_penalty(lengths, 1.0) ** alpha
        )
    assert length_penalty(torch.tensor(7.0), 1.0).item() == pytest.approx(2.0)


class OnlyEndAfterFirst(TableDecoder):
    """After its first token, only the end symbol is possible (every other token has log P =
    -inf)."""

    def log_probs(self, prefix: tuple) -> torch.Tensor:
        lp = super().log_probs(prefix)
        allowed = [EOS, 3] if len(prefix) == 1 else [EOS]
        blocked = torch.ones_like(lp, dtype=torch.bool)
        blocked[allowed] = False
        return lp.masked_fill(blocked, -math.inf)


def test_impossible_hypotheses_are_dropped_and_the_search_stops():
    """With fewer possible continuations than beams, the impossible ones must count as finished:
    the search ends when the possible ones do, and never returns an impossible output."""
    from annotated.beam import beam_search_core

    steps = []
    beams = beam_search_core(
        OnlyEndAfterFirst(6, 0),
        1,
        torch.tensor([20]),
        BOS,
        EOS,
        beam_size=4,
        on_step=lambda *args: steps.append(1),
    )
    assert len(steps) == 2  # "</s>" and "3 </s>": two steps
    assert sorted(h.tokens for h in beams[0]) == [[], [3]]
    assert all(h.finished and math.isfinite(h.log_prob) for h in beams[0])


MOSES_RECORD = Path(__file__).resolve().parent.parent / "results" / "bleu-vs-moses" / "results.json"


@pytest.mark.parametrize("case", list(json.loads(MOSES_RECORD.read_text())["cases"]))
def test_tokenized_bleu_equals_the_perl_scripts_statistic_for_statistic(case):
    """get_ende_bleu.sh as written (Unicode punctuation replaced in the system output only) and
    multi-bleu.perl on tokenizer.perl's tokens: our statistics equal the Perl lines recorded by
    tools/bleu_vs_moses.py with the Moses scripts of the paper's time (sacremoses follows them)."""
    import bleu_vs_moses  # tools/bleu_vs_moses.py (tests/conftest.py puts tools/ on the path)

    recorded = json.loads(MOSES_RECORD.read_text())["cases"][case]
    hyp, ref = (bleu_vs_moses.resolve(recorded[k]) for k in ("hypotheses", "references"))
    ours = bleu_vs_moses.ours(read_lines(hyp), read_lines(ref))
    perl = recorded["perl"]["moses-d2b558728"]
    assert ours["paper-style"] == perl["paper-style"]
    assert ours["multi-bleu.perl"] == perl["multi-bleu.perl"]
    assert perl["multi-bleu.perl -lc"].startswith(ours["multi-bleu.perl -lc"] + ",")
    # the pipeline matters: replacing the punctuation on both sides scores another number
    both = ours["paper-style, punctuation replaced on both sides"]
    assert both == recorded["ours"]["paper-style, punctuation replaced on both sides"]
    assert (both != ours["paper-style"]) == case.startswith("newstest2014")


@pytest.mark.skipif(not os.environ.get("MOSES_DIR"), reason="MOSES_DIR (a Moses checkout) unset")
def test_the_perl_scripts_still_print_what_was_recorded():
    """With MOSES_DIR pointing at the Moses scripts of the paper's time, tools/moses_bleu.sh
    prints the recorded lines again (needs perl)."""
    import bleu_vs_moses

    for recorded in json.loads(MOSES_RECORD.read_text())["cases"].values():
        hyp, ref = (bleu_vs_moses.resolve(recorded[k]) for k in ("hypotheses", "references"))
        lines = bleu_vs_moses.perl(Path(os.environ["MOSES_DIR"]), hyp, ref)
        assert lines == recorded["perl"]["moses-d2b558728"]


def full_vocabulary_extend(step_lp, log_prob, length, finished, limits, alpha):
    """The textbook step: score all K * V candidates of each sentence, keep the K best."""
    b, K, V = step_lp.shape
    itself = torch.full_like(step_lp, -math.inf)
    itself[..., EOS] = 0.0  # a finished hypothesis's one candidate: itself
    cand_lp = log_prob[..., None] + torch.where(finished[..., None], itself, step_lp)
    cand_len = (length + (~finished).long())[..., None].float()
    best = (cand_lp / length_penalty(cand_len, alpha)).view(b, -1).topk(K, dim=1).indices
    return best // V, best % V, cand_lp.view(b, -1).gather(1, best)


@pytest.mark.parametrize("seed", range(5))
def test_keeping_each_hypothesiss_k_best_tokens_first_picks_the_same_candidates(seed):
    """_extend scores only each hypothesis's K best tokens: the winners must be the same as when
    all K * V candidates are scored, with finished and dead hypotheses in the beam."""
    from annotated.beam import _extend

    g = torch.Generator().manual_seed(seed)
    b, K, V, alpha = 6, 4, 50, 0.6
    step_lp = torch.randn(b, K, V, generator=g).log_softmax(-1)
    log_prob = -torch.rand(b, K, generator=g) * 10
    finished = torch.rand(b, K, generator=g) < 0.3
    log_prob[0, 1:] = -math.inf  # a fresh sentence: one live copy of <s>, three dead ones
    finished[0] = torch.tensor([False, True, True, True])
    length = torch.randint(1, 9, (b, K), generator=g)
    limits = torch.full((b,), 30)
    parent, token, lp, *_ = _extend(step_lp, log_prob, length, finished, limits, EOS, alpha)
    ref_parent, ref_token, ref_lp = full_vocabulary_extend(
        step_lp, log_prob, length, finished, limits, alpha
    )
    live = lp > -math.inf  # dead candidates are interchangeable
    assert torch.equal(live, ref_lp > -math.inf) and int(live.sum()) > b * 2
    assert torch.equal(lp[live], ref_lp[live])  # the same values, bit for bit
    assert torch.equal(parent[live], ref_parent[live]) and torch.equal(token[live], ref_token[live])


def test_bleu_reads_a_pipe_and_refuses_folders_and_empty_languages(tmp_path, capsys):
    """--hyp <(command) is a pipe, read as it comes; a folder, a missing file and --lang ''
    are refused with what to give instead, exit 2."""
    import os
    import threading

    from annotated.cli.bleu import main as bleu_main

    (tmp_path / "ref").write_text("\n".join(REFS) + "\n", encoding="utf-8")
    pipe = tmp_path / "hyp.fifo"
    os.mkfifo(pipe)
    writer = threading.Thread(target=lambda: pipe.write_text("\n".join(HYPS) + "\n", "utf-8"))
    writer.start()
    assert bleu_main(["--hyp", str(pipe), "--ref", str(tmp_path / "ref")]) == 0
    writer.join(timeout=10)
    assert f"{sacrebleu_score(HYPS, REFS)[0]:.2f}" in capsys.readouterr().out
    for args, says in [
        (["--hyp", str(tmp_path)], "is a folder"),
        (["--hyp", str(tmp_path / "nothing")], "does not exist"),
        (["--hyp", str(tmp_path / "ref"), "--lang", ""], "language code"),
    ]:
        with pytest.raises(SystemExit) as exit:
            bleu_main([*args, "--ref", str(tmp_path / "ref")])
        assert exit.value.code == 2 and says in capsys.readouterr().err


def test_several_references_score_as_sacrebleus_command_line_and_print_as_json(tmp_path, capsys):
    """Two reference files: the score sacreBLEU's own command gives for them, higher than with
    either alone; --json prints every score and signature as one object."""
    import json

    from annotated.cli.bleu import main as bleu_main

    other = [r.replace("Haus", "Gebäude").replace("der", "die") for r in REFS]  # a second version
    for name, lines in [("hyp", HYPS), ("ref1", REFS), ("ref2", other)]:
        (tmp_path / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    both, signature = sacrebleu_score(HYPS, [REFS, other])
    cli = [str(BIN / "sacrebleu"), str(tmp_path / "ref1"), str(tmp_path / "ref2")]
    cli += ["-i", str(tmp_path / "hyp"), "-b", "-w", "4"]
    assert subprocess.run(cli, capture_output=True, text=True, check=True).stdout.strip() == (
        f"{both:.4f}"
    )
    assert "nrefs:2" in signature and both >= max(
        sacrebleu_score(HYPS, r)[0] for r in (REFS, other)
    )
    args = ["--hyp", str(tmp_path / "hyp"), "--ref", str(tmp_path / "ref1"), str(tmp_path / "ref2")]
    capsys.readouterr()
    assert bleu_main([*args, "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["references"] == 2 and printed["sentences"] == len(HYPS)
    assert (
        printed["sacrebleu"] == pytest.approx(both) and "nrefs:2" in printed["sacrebleu_signature"]
    )
    assert printed["tokenized_bleu"] == pytest.approx(
        tokenized_bleu(HYPS, [REFS, other], compound_split=False)[0]
    )
    (tmp_path / "short").write_text("one line\n", encoding="utf-8")
    with pytest.raises(SystemExit) as exit:
        bleu_main([*args, str(tmp_path / "short")])
    assert exit.value.code == 2 and "line counts differ" in capsys.readouterr().err
