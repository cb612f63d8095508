"""Chapter 18's CorpusTask over a corpus held in memory (TokenPairs): micro-batch g of the
training is a pure function of (step, index), each epoch holds every pair once within the
token budget, and the sources and targets carry their markers."""

import random

import pytest
import torch

from annotated.batching import BOS, EOS, PAD
from annotated.data.tokenizer import IdTokenizer
from annotated.errors import ConfigError
from annotated.training.corpus_task import CorpusTask, TokenPairs
from annotated.training.registry import build_config
from annotated.training.tasks.multi30k import Multi30kData


def corpus(n: int = 200, seed: int = 0) -> TokenPairs:
    rng = random.Random(seed)
    sources = [[rng.randrange(3, 50) for _ in range(rng.randint(1, 30))] for _ in range(n)]
    targets = [[rng.randrange(3, 50) for _ in range(rng.randint(1, 30))] for _ in range(n)]
    return TokenPairs(sources, targets)


class InMemory(CorpusTask):
    """A corpus task whose `load` reads the corpus above; it sees only its data settings."""

    Data = Multi30kData

    def load(self, data: Multi30kData) -> tuple[IdTokenizer, TokenPairs]:
        assert type(data) is Multi30kData  # not the configuration: no batch, no model
        return IdTokenizer(50), corpus()


def task(per_step: int = 2, max_tokens: int = 120) -> CorpusTask:
    cfg = build_config(
        "multi30k-small", [f"batch.max_tokens={max_tokens}", "batch.tokens_per_step=0"]
    )
    return InMemory(cfg, per_step)


def unpadded(rows: torch.Tensor) -> list[tuple[int, ...]]:
    return [tuple(t for t in row.tolist() if t != PAD) for row in rows]


def test_each_epoch_holds_every_pair_once_within_the_budget():
    t = task()
    pairs = {
        (tuple([*s, EOS]), tuple([BOS, *g, EOS]))
        for s, g in zip(t.corpus.sources, t.corpus.targets)
    }
    for epoch in (0, 1):
        seen = []
        first = sum(len(t.epoch(e)) for e in range(epoch))  # micro-batches of earlier epochs
        for g in range(first, first + len(t.epoch(epoch))):
            b = t.micro_batch(g // t.per_step, g % t.per_step)
            assert b.src.numel() <= 120 or b.src.size(0) == 1  # padded tokens within max_tokens
            targets = [(*row[:1].tolist(), *y) for row, y in zip(b.tgt, unpadded(b.tgt_y))]
            seen += list(zip(unpadded(b.src), (tuple(x) for x in targets)))
        assert len(seen) == len(pairs) and set(seen) == pairs  # every pair, once
    assert [b.tolist() for b in t.epoch(0)] != [b.tolist() for b in t.epoch(1)]  # reshuffled


def test_a_micro_batch_is_the_same_whenever_and_wherever_it_is_asked_for():
    late = task()
    late.micro_batch(40, 1)  # far ahead first: epochs are counted on the way
    fresh = task()
    for step, index in [(0, 0), (3, 1), (40, 1), (17, 0)]:
        a, b = fresh.micro_batch(step, index), late.micro_batch(step, index)
        assert torch.equal(a.src, b.src) and torch.equal(a.tgt_y, b.tgt_y)


def test_batches_that_hold_no_pair_are_refused_rather_than_awaited():
    """batch.max_tokens (or model.max_len) below the shortest pair would leave every epoch
    empty, and the trainer would look for its first micro-batch forever: refused, with the
    length the shortest pair needs."""
    c = corpus()  # a source with </s>, a target with <s> and </s>
    need = min(max(len(s) + 1, len(t) + 2) for s, t in zip(c.sources, c.targets))
    with pytest.raises(ConfigError, match=rf"max_tokens={need - 1}, .*shortest needs {need} "):
        task(max_tokens=need - 1)
    assert len(task(max_tokens=need).epoch(0)) >= 1
