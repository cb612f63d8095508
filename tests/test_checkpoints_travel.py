"""A checkpoint carries its tokenizer (chapter 19): it translates on a machine that has neither
the data it was trained on nor a cache, and an altered or older checkpoint gets a message."""

import os
import shutil
import subprocess
import sys

import pytest
import torch

from annotated.cli import prepare

from helpers import run_trainer, sets

SENTENCES = "a dog number 3 runs\n\na cat number 12 sleeps\n"


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny run on a corpus of its own, and the translations it gives while its data exists."""
    root = tmp_path_factory.mktemp("travel")
    pairs = [(f"a dog number {i} runs", f"ein Hund Nummer {i} rennt") for i in range(300)]
    pairs += [(f"a cat number {i} sleeps", f"eine Katze Nummer {i} schläft") for i in range(300)]
    for side, lang in enumerate(("en", "de")):
        (root / f"train.{lang}").write_text("".join(p[side] + "\n" for p in pairs))
    data = root / "data"
    args = ["--src", str(root / "train.en"), "--tgt", str(root / "train.de"), "--out", str(data)]
    assert prepare.main([*args, "--vocab", "120"]) == 0
    tiny = sets("model.N=1", "model.d_model=32", "model.d_ff=64", "model.h=2", "max_steps=30")
    run_trainer("--config", "parallel", *sets(f"data.path={data}"), *tiny, "--out",
                str(root / "run"))  # fmt: skip
    checkpoint = sorted((root / "run" / "checkpoints").glob("ckpt_*.pt"))[-1]
    before = _translate(checkpoint, root, dict(os.environ))
    assert before.returncode == 0, before.stderr[-2000:]
    return root, data, checkpoint, before.stdout


def _translate(checkpoint, root, env) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "annotated.cli.translate", "--checkpoint", str(checkpoint)]
    return subprocess.run(cmd, input=SENTENCES, capture_output=True, text=True, env=env,
                          timeout=120, cwd=root)  # fmt: skip


def _bare_machine(root) -> dict:
    """An environment without the book's data or any cache: a fresh machine."""
    env = {k: v for k, v in os.environ.items() if k != "ANNOTATED_DATA"}
    empty = root / "empty-home"
    empty.mkdir(exist_ok=True)
    return {**env, "HOME": str(empty), "XDG_CACHE_HOME": str(empty / ".cache")}


def test_a_checkpoint_translates_without_its_data_or_a_cache(trained, tmp_path):
    root, data, checkpoint, expected = trained
    moved = tmp_path / "elsewhere.pt"
    shutil.copy(checkpoint, moved)  # the checkpoint alone, on another machine
    hidden = data.with_name("data-hidden")
    data.rename(hidden)  # the prepared folder is gone
    try:
        r = _translate(moved, root, _bare_machine(root))
    finally:
        hidden.rename(data)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout == expected and len(r.stdout.splitlines()) == 3
    assert not (root / "empty-home" / ".cache" / "annotated").exists()  # nothing downloaded


def test_an_older_checkpoint_without_its_tokenizer_names_the_data_it_needs(trained, tmp_path):
    root, data, checkpoint, expected = trained
    state = torch.load(checkpoint, weights_only=True)
    del state["tokenizer_model"]  # as checkpoints were written before they carried it
    old = tmp_path / "old.pt"
    torch.save(state, old)
    r = _translate(old, root, _bare_machine(root))  # the prepared folder is still there
    assert r.returncode == 0 and r.stdout == expected, r.stderr[-2000:]
    hidden = data.with_name("data-hidden")
    data.rename(hidden)
    try:
        r = _translate(old, root, _bare_machine(root))
    finally:
        hidden.rename(data)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert str(data) in r.stderr, r.stderr[-2000:]


def test_an_altered_tokenizer_in_a_checkpoint_is_refused(trained, tmp_path):
    root, data, checkpoint, expected = trained
    state = torch.load(checkpoint, weights_only=True)
    blob = bytearray(state["tokenizer_model"])
    piece = blob.find(b"Hund")
    blob[piece : piece + 4] = b"Katz"  # one piece renamed: other words for the same ids
    altered = tmp_path / "altered.pt"
    torch.save({**state, "tokenizer_model": bytes(blob)}, altered)
    r = _translate(altered, root, _bare_machine(root))
    assert r.returncode == 2 and "carries a damaged tokenizer" in r.stderr, r.stderr[-2000:]
    assert "Traceback" not in r.stderr
