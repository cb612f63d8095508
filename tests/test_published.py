"""Chapter 26's published system: OPUS-MT's newstest2014 translations and the scores its
authors printed, read from the checksummed local copy (ANNOTATED_DATA), and refused if changed."""

import os
import re
import shutil
from pathlib import Path

import pytest

from annotated.data.published import OPUS_MT_FILES, published_system
from annotated.errors import ChecksumError


def test_the_published_translations_and_scores_are_read_whole():
    hyps, scores = published_system()
    assert (
        len(hyps) == 3003 and all(isinstance(h, str) for h in hyps) and sum(map(bool, hyps)) > 2990
    )
    bleu = [value for signature, value in scores.items() if "BLEU" in signature.upper()]
    assert bleu and float(bleu[0].split()[0]) > 20  # a real system's score, as printed


def test_a_changed_copy_is_refused_by_its_checksum(tmp_path, monkeypatch):
    local = Path(os.environ["ANNOTATED_DATA"])
    for remote in OPUS_MT_FILES.values():
        (tmp_path / remote.path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(local / remote.path, tmp_path / remote.path)
    damaged = tmp_path / OPUS_MT_FILES["translations"].path
    text = damaged.read_bytes()
    damaged.write_bytes(text[:100] + (b"X" if text[100:101] != b"X" else b"Y") + text[101:])
    monkeypatch.setenv("ANNOTATED_DATA", str(tmp_path))
    name = re.escape(OPUS_MT_FILES["translations"].path)
    with pytest.raises(ChecksumError, match=f"{name}: expected .* Replace it with the official"):
        published_system()
