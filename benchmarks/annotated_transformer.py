"""The Annotated Transformer's own model and loss, loaded from a reader's checkout of
harvardnlp/annotated-transformer (MIT licence) so that train_step.py can time it beside the book.

    git clone https://github.com/harvardnlp/annotated-transformer
    python benchmarks/train_step.py --annotated-transformer \\
        annotated-transformer/the_annotated_transformer.py

Nothing of that code is copied into this repository. Its file imports spaCy, torchtext, altair
and more at the top, for its data and charts; only the definitions a training step needs are
taken out of it (by name, with Python's ast module) and run, unchanged, in a namespace holding
what they use from torch. Its step is then the one its run_epoch takes: Batch (masks made from
the padding id), the model's forward, SimpleLossCompute (Generator's log-softmax over the whole
vocabulary, then LabelSmoothing's KLDivLoss against a dense smoothed distribution), backward.
Its model is pre-norm with a final LayerNorm (its own mean/std LayerNorm) and does not tie the
embeddings to the output projection, as its make_model builds it.
"""

from __future__ import annotations

import ast
import copy
import hashlib
import math
import subprocess
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

# the definitions a training step needs, as named in the_annotated_transformer.py
NEEDED = (
    "EncoderDecoder",
    "Generator",
    "clones",
    "Encoder",
    "LayerNorm",
    "SublayerConnection",
    "EncoderLayer",
    "Decoder",
    "DecoderLayer",
    "subsequent_mask",
    "attention",
    "MultiHeadedAttention",
    "PositionwiseFeedForward",
    "Embeddings",
    "PositionalEncoding",
    "make_model",
    "Batch",
    "LabelSmoothing",
    "SimpleLossCompute",
)


class NotTheAnnotatedTransformer(Exception):
    """The file given is missing, or lacks a definition the step needs."""


def load(path: Path) -> tuple[dict, dict]:
    """The namespace holding NEEDED's definitions from `path`, and where they came from (path,
    sha256 of the file, the checkout's git commit if it is one)."""
    path = Path(path)
    try:
        source = path.read_text(encoding="utf-8")
        tree = ast.parse(source, filename=str(path))
    except (OSError, SyntaxError, UnicodeDecodeError) as e:
        raise NotTheAnnotatedTransformer(
            f"Could not read the Annotated Transformer's code from {path}: {e}. Give the path of "
            "the_annotated_transformer.py in a checkout of "
            "https://github.com/harvardnlp/annotated-transformer."
        ) from None
    kinds = (ast.FunctionDef, ast.ClassDef)
    body = [n for n in tree.body if isinstance(n, kinds) and n.name in NEEDED]
    missing = sorted(set(NEEDED) - {n.name for n in body})
    if missing:
        raise NotTheAnnotatedTransformer(
            f"{path} does not define {', '.join(missing)}, which the Annotated Transformer's "
            "training step needs; it does not look like harvardnlp's the_annotated_transformer.py. "
            "Give the path of that file in a checkout of "
            "https://github.com/harvardnlp/annotated-transformer."
        )
    namespace = {"torch": torch, "nn": nn, "math": math, "copy": copy}
    namespace.update(log_softmax=F.log_softmax, __name__="the_annotated_transformer")
    exec(compile(ast.Module(body=body, type_ignores=[]), str(path), "exec"), namespace)
    return namespace, origin(path, source)


def origin(path: Path, source: str) -> dict:
    """Which file was timed: its name, sha256, and its checkout's commit where git knows it."""
    commit = subprocess.run(
        ["git", "-C", str(path.resolve().parent), "rev-parse", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    )
    return {
        "file": path.name,
        "sha256": hashlib.sha256(source.encode()).hexdigest(),
        "git_commit": commit.stdout.strip() if commit.returncode == 0 else None,
    }


def training_step(at: dict, model: nn.Module, optimizer, steps, pad: int, vocab: int, autocast):
    """A function running one of `steps` (lists of the book's Batch) the Annotated Transformer's
    way. Its own Batch objects (with their masks) are built once, here, as a data pipeline would
    build them ahead of the step."""
    criterion = at["LabelSmoothing"](vocab, pad, 0.1)
    compute = at["SimpleLossCompute"](model.generator, criterion)
    theirs = {
        id(b): at["Batch"](b.src, torch.cat([b.tgt[:, :1], b.tgt_y], 1), pad)
        for step in steps
        for b in step
    }

    def run(step):
        ntokens = sum(b.ntokens for b in step)
        for b in step:
            batch = theirs[id(b)]
            with autocast():
                out = model(batch.src, batch.tgt, batch.src_mask, batch.tgt_mask)
                _, loss = compute(out, batch.tgt_y, ntokens)
            loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return run
