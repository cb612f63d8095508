"""A task of one's own, used only by tests/test_registry.py: one module and one row of the
registry's table are all it takes. The model learns to write a random sequence backwards."""

from dataclasses import dataclass
from typing import ClassVar

import torch

from annotated.batching import BOS, EOS, PAD, Batch
from annotated.training.config import TaskData, TrainConfig, task_data
from annotated.training.tasks.copy import IdTokenizer


@dataclass
class ReverseData(TaskData):
    """Sequences of the symbols 3 .. vocab - 1, up to `longest` of them."""

    vocab: int = 11
    longest: int = 6
    batch_sentences: int = 32

    def rules(self) -> list[tuple[bool, str, str]]:
        return [(self.longest >= 1, "data.longest", "must be at least 1")]


class ReverseTask:
    """Micro-batch (step, index): random sequences, their reversal as the targets."""

    Data: ClassVar[type[TaskData]] = ReverseData

    def __init__(self, cfg: TrainConfig, per_step: int = 1):
        self.cfg, self.data = cfg, task_data(cfg, ReverseData)
        self.tokenizer = self.tokenizer_for(cfg)
        self.src_vocab = self.tgt_vocab = self.data.vocab

    @staticmethod
    def tokenizer_for(cfg: TrainConfig) -> IdTokenizer:
        return IdTokenizer(task_data(cfg, ReverseData).vocab)

    @staticmethod
    def test_sets(cfg: TrainConfig) -> dict:
        return {}

    def micro_batch(self, step: int, index: int) -> Batch:
        d = self.data
        g = torch.Generator().manual_seed(self.cfg.seed * 7_919 + step * 101 + index)
        src = torch.full((d.batch_sentences, d.longest + 1), PAD)
        tgt = torch.full((d.batch_sentences, d.longest + 2), PAD)
        for i in range(d.batch_sentences):
            n = int(torch.randint(1, d.longest + 1, (1,), generator=g))
            symbols = torch.randint(3, d.vocab, (n,), generator=g)
            src[i, :n], src[i, n] = symbols, EOS
            tgt[i, 0], tgt[i, 1 : n + 1], tgt[i, n + 1] = BOS, symbols.flip(0), EOS
        return Batch(src, tgt, PAD)


TASK = ReverseTask
