"""Multi30k as a trainer task (chapter 11): framing of sources and targets, batches, translate."""

import torch

from annotated.batching import BOS, EOS, PAD, make_batch
from annotated.data.multi30k_corpus import load_multi30k
from annotated.evaluation.translation import translate
from annotated.training.registry import build_config
from annotated.training.tasks.multi30k import Multi30kTask


def test_sources_end_and_targets_are_framed():
    cfg = build_config("multi30k-cpu")
    task = Multi30kTask(cfg)
    pairs = load_multi30k("train")
    first_src, first_tgt = pairs[0]
    encoded = task.tokenizer.encode(first_src), task.tokenizer.encode(first_tgt)
    assert task.corpus.pair(0) == encoded  # the ids alone; the markers come with the batch
    assert task.lengths[0].tolist() == [len(encoded[0]) + 1, len(encoded[1]) + 2]
    batch = task.micro_batch(3, 0)
    for src_row, tgt_row in zip(
        batch.src.tolist(), torch.cat([batch.tgt[:, :1], batch.tgt_y], 1).tolist()
    ):
        src_row, tgt_row = [t for t in src_row if t != PAD], [t for t in tgt_row if t != PAD]
        assert src_row[-1] == EOS and EOS not in src_row[:-1] and BOS not in src_row
        assert tgt_row[0] == BOS and tgt_row[-1] == EOS and EOS not in tgt_row[:-1]
    # <s> is not predicted
    assert batch.ntokens == sum(task.lengths[i, 1] - 1 for i in task.epoch(0)[3])


class EchoModel(torch.nn.Module):
    """Stands in for a trained model in `translate`: always predicts the source, token by token."""

    def __init__(self, vocab):
        super().__init__()
        self.vocab, self.weight = vocab, torch.nn.Parameter(torch.zeros(1))
        self.src_embed = [None, type("Positions", (), {"max_len": 256})()]


def test_translate_decodes_without_special_tokens(monkeypatch):
    import importlib

    from annotated.beam import Hypothesis

    translation = importlib.import_module("annotated.evaluation.translation")
    task_tokenizer = Multi30kTask(build_config("multi30k-cpu")).tokenizer

    def fake_beam_search(model, src, src_mask, max_len, bos, eos, beam_size, alpha):
        tokens = [
            [BOS] + [t for t in row if t not in (PAD, EOS)] + [EOS, PAD] for row in src.tolist()
        ]
        return [[Hypothesis(t, 0.0, 0.0, True)] for t in tokens]

    monkeypatch.setattr(translation, "beam_search_hypotheses", fake_beam_search)
    sentences = ["Ein Hund läuft.", "", "Zwei Männer spielen Fußball."]
    out = translate(EchoModel(task_tokenizer.vocab_size), task_tokenizer, sentences)
    assert out == ["Ein Hund läuft.", "", "Zwei Männer spielen Fußball."]
    assert make_batch([[5, 6, EOS], [7, EOS]]).src.tolist() == [[5, 6, EOS], [7, EOS, PAD]]
