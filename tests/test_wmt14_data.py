"""WMT14 data: archives served from a local HTTP server (small ones built from the shared sample),
extraction, cleaning, the encoded binary format, and preparation end to end. No internet."""

import errno
import gzip
import hashlib
import io
import json
import os
import tarfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import annotated.data.encoded as encoded
from annotated.data.cleaning import LINE_BREAKS, RULES, clean_corpora, read_pairs, sample_pairs
from annotated.data.download import RemoteFile, fetch
from annotated.data.encoded import EncodedCorpus, is_encoded, write_encoded
from annotated.data.preparation import prepare_wmt14
from annotated.data.tokenizer import TokenizerMismatch, train_tokenizer
from annotated.data.wmt14_files import (
    SAMPLE_FILES,
    SCALE_ENV,
    WMT14_ARCHIVES,
    WMT14_PAIRS,
    default_scale,
    extract_members,
    fetch_archive,
    load_test_set,
)
from annotated.errors import ChecksumError, DataError, TrainingError

from helpers import serve

ROOT = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("ANNOTATED_DATA") or ROOT.parent / "shared" / "data").resolve()
SAMPLE = SHARED / "wmt_ende_toy_sample_opennmt"
NEWSTEST = SHARED / "wmt14_en_de_newstest"


@pytest.fixture(autouse=True)
def _private_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("ANNOTATED_DATA", str(SHARED))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    monkeypatch.delenv(SCALE_ENV, raising=False)


def _lines(path: Path, n: int, start: int = 0) -> bytes:
    return b"".join(path.read_bytes().splitlines(keepends=True)[start : start + n])


def _tar(path: Path, members: dict[str, bytes]) -> None:
    with tarfile.open(path, "w:gz" if path.suffix == ".tgz" else "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def _small_archives(folder: Path, x: str = "de") -> dict[str, RemoteFile]:
    """Archives laid out like the official ones, holding slices of the sample (its German side
    stands in for French). Returns WMT14_ARCHIVES with their true sizes and digests."""
    en, xx = SAMPLE / "src-train.txt", SAMPLE / "tgt-train.txt"
    train = {c.archive: c for c in WMT14_PAIRS[f"en-{x}"]["train"]}
    contents: dict[str, dict[str, bytes]] = {}
    for k, (name, corpus) in enumerate(train.items()):
        lines = {"en": _lines(en, 300, 300 * k), x: _lines(xx, 300, 300 * k)}
        if name == "giga-fren":  # compressed inside the tar, as the real one is
            lines = {lang: gzip.compress(data) for lang, data in lines.items()}
        contents[name] = {corpus.members[lang]: lines[lang] for lang in ("en", x)}
    dev = WMT14_PAIRS[f"en-{x}"]
    sgm = NEWSTEST / "sgm"
    contents["dev"] = {
        dev["dev"][0].members["en"]: (NEWSTEST / "newstest2013.en").read_bytes(),
        dev["dev"][0].members[x]: (NEWSTEST / "newstest2013.de").read_bytes(),
        dev["test"][0].members["en"]: (sgm / "newstest2014-deen-src.en.sgm").read_bytes(),
        dev["test"][0].members[x]: (sgm / "newstest2014-deen-ref.de.sgm").read_bytes(),
        "dev/unrelated.txt": b"not read\n",
    }
    files = {}
    for name, members in contents.items():
        file = WMT14_ARCHIVES[name]
        path = folder / file.path
        path.parent.mkdir(parents=True, exist_ok=True)
        _tar(path, members)
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        # archives without a published digest keep sha256="" (and the UN one its unknown size)
        files[name] = replace(
            file,
            size=path.stat().st_size if file.size else 0,
            sha256=digest if file.sha256 else "",
        )
    return files


@pytest.fixture
def mirror(tmp_path):
    folder = tmp_path / "mirror"
    with serve(folder) as (url, handler):
        yield folder, url, handler


def _prepare(tmp_path, archives, url, pair="en-de", **kwargs):
    return prepare_wmt14(
        pair,
        "full",
        folder=tmp_path / "prepared",
        vocab_size=1000,
        archives=archives,
        root=tmp_path / "root",  # never the shared data folder
        base_url=url,
        download=True,
        progress=False,
        lock=tmp_path / "lock.json",
        **kwargs,
    )


def test_full_pipeline_on_small_archives(tmp_path, mirror):
    folder, url, handler = mirror
    archives = _small_archives(folder)
    prepared = _prepare(tmp_path, archives, url)
    rows = {row["corpus"]: row for row in prepared.cleaning["rows"]}
    assert list(rows) == ["europarl-v7", "commoncrawl", "news-commentary-v9"]
    for row in rows.values():  # every pair is counted once: kept or dropped by one rule
        assert row["pairs in"] == 300 == row["pairs out"] + sum(row[r] for r in RULES)
    corpus = prepared.corpus("train")
    assert len(corpus) == sum(row["pairs out"] for row in rows.values())
    # the test set comes out of the SGML: the same 3,003 sentences as the plain-text copies
    test = prepared.test_set()
    assert len(test) == 3003
    references = (NEWSTEST / "newstest2014.de").read_text(encoding="utf-8").splitlines()
    assert [t for _, t in test] == references
    assert len(prepared.corpus("dev")) == 3000
    requests = len(handler.log)
    assert requests == 4  # one per archive
    again = _prepare(tmp_path, archives, url)  # everything verified, nothing redone
    assert (
        len(handler.log) == requests
        and again.tokenizer.fingerprint == prepared.tokenizer.fingerprint
    )


def test_encoded_pairs_round_trip_exactly(tmp_path, mirror):
    folder, url, _ = mirror
    prepared = _prepare(tmp_path, _small_archives(folder), url)
    corpus, tok = prepared.corpus("train"), prepared.tokenizer
    clean = prepared.folder / "clean"
    pairs = [
        (s, t)
        for row in prepared.cleaning["rows"]
        for s, t in zip(
            (clean / f"{row['corpus']}.en").read_text(encoding="utf-8").splitlines(),
            (clean / f"{row['corpus']}.de").read_text(encoding="utf-8").splitlines(),
        )
    ]
    assert len(pairs) == len(corpus) and corpus.tokens.dtype == np.uint16
    for i, (s, t) in enumerate(pairs):
        src, tgt = corpus.pair(i)
        assert src.tolist() == tok.encode(s) and tgt.tolist() == tok.encode(t)
    lengths = corpus.lengths()
    assert lengths.shape == (len(pairs), 2) and int(lengths.sum()) == corpus.header["tokens"]


def test_english_french_with_a_lock_file_for_unpublished_digests(tmp_path, mirror):
    folder, url, _ = mirror
    archives = _small_archives(folder, "fr")
    prepared = _prepare(tmp_path, archives, url, pair="en-fr")
    names = [row["corpus"] for row in prepared.cleaning["rows"]]
    assert names == ["europarl-v7", "commoncrawl", "news-commentary-v9", "un", "giga-fren"]
    lock = json.loads((tmp_path / "lock.json").read_text())
    for name in ("un", "giga-fren"):
        path = folder / archives[name].path
        entry = lock[archives[name].path]
        assert entry == {
            "size": path.stat().st_size,
            "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        }
    # a later copy that differs from the locked digest is refused
    changed = tmp_path / "elsewhere" / archives["un"].path
    changed.parent.mkdir(parents=True)
    changed.write_bytes(b"x" * lock[archives["un"].path]["size"])
    with pytest.raises(ChecksumError, match=lock[archives["un"].path]["sha256"]):
        fetch_archive(archives["un"], lock=tmp_path / "lock.json", root=tmp_path / "elsewhere")


def test_a_corrupt_download_names_the_file_and_both_digests(tmp_path, mirror):
    folder, url, _ = mirror
    archives = _small_archives(folder)
    wrong = replace(archives["nc-v9"], sha256="0" * 64)
    with pytest.raises(ChecksumError) as err:
        fetch(wrong, root=tmp_path / "root", download=True, base_url=url, progress=False)
    message = str(err.value)
    assert "0" * 64 in message and archives["nc-v9"].sha256 in message and "deleted" in message
    assert not list((tmp_path / "root").rglob("*.tgz*"))


def test_a_cut_connection_is_resumed_by_the_next_run(tmp_path, mirror):
    folder, url, handler = mirror
    archives = _small_archives(folder)
    handler.cut = 1000
    kwargs = dict(root=tmp_path / "root", download=True, base_url=url, progress=False)
    with pytest.raises(DataError, match="run again to resume") as err:
        fetch(archives["europarl-v7"], **kwargs)
    assert "1,000 bytes" in str(err.value)
    path = fetch(archives["europarl-v7"], **kwargs)
    assert path.read_bytes() == (folder / archives["europarl-v7"].path).read_bytes()
    assert handler.log[-1][1] == "bytes=1000-"


def test_a_truncated_archive_is_reported(tmp_path, mirror):
    folder, _, _ = mirror
    archives = _small_archives(folder)
    whole = (folder / archives["europarl-v7"].path).read_bytes()
    cut = tmp_path / "cut.tgz"
    cut.write_bytes(whole[: len(whole) // 2])
    member = WMT14_PAIRS["en-de"]["train"][0].members["de"]  # the second, past the cut
    with pytest.raises(DataError, match="truncated or corrupt"):
        extract_members(cut, {member: tmp_path / "out.de"})
    assert list(tmp_path.glob("out*")) == []  # no partial member either
    with pytest.raises(DataError, match="has no member nothing/here"):
        extract_members(folder / archives["europarl-v7"].path, {"nothing/here": tmp_path / "x"})


def test_each_cleaning_rule_is_counted(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    en = ["a good pair", "", "one two three four five", "x " * 251, "a good pair", "fine", "ok"]
    de = ["ein gutes paar", "leer", "eins", "y", "ein gutes paar", "gut", "gut"]
    (raw / "a.en").write_bytes("\n".join(en).encode() + b"\n\xff\xfe bad\n")
    (raw / "a.de").write_bytes("\n".join(de).encode() + b"\nschlecht\n")
    (raw / "b.en").write_text("a good pair\nfine\n")
    (raw / "b.de").write_text("ein gutes paar\nanders\n")
    corpora = {name: {lang: raw / f"{name}.{lang}" for lang in ("en", "de")} for name in "ab"}
    done = clean_corpora(corpora, ("en", "de"), tmp_path / "clean")
    a, b = done["rows"]
    assert a == {
        "corpus": "a",
        "pairs in": 8,
        "not UTF-8": 1,
        "empty side": 1,
        "over 250 words": 1,
        "ratio over 2": 1,
        "duplicate": 1,
        "pairs out": 3,
    }
    assert b["duplicate"] == 1 and b["pairs out"] == 1  # duplicates are found across corpora
    assert (tmp_path / "clean" / "a.en").read_text().splitlines() == ["a good pair", "fine", "ok"]
    (raw / "b.de").write_text("ein gutes paar\n")
    with pytest.raises(DataError, match="not line-aligned"):
        clean_corpora(corpora, ("en", "de"), tmp_path / "clean")


@pytest.mark.parametrize("mark", list(LINE_BREAKS))
def test_a_line_break_inside_a_sentence_keeps_the_pairs_aligned(tmp_path, mark):
    """A carriage return, U+0085, U+2028 and the like inside one sentence of an archive: the
    archive's lines end at "\n" only, and every later pair keeps its own translation."""
    english = ["one", f"two{mark}halves", "three", "four"]
    german = ["eins", "zwei hälften", f"drei{mark}", "vier"]
    raw = {"en": tmp_path / "c.en", "de": tmp_path / "c.de"}
    raw["en"].write_bytes("".join(f"{s}\n" for s in english).encode())
    raw["de"].write_bytes("".join(f"{s}\n" for s in german).encode())
    done = clean_corpora({"c": raw}, ("en", "de"), tmp_path / "clean")
    assert done["rows"][0]["pairs out"] == 4
    cleaned = (tmp_path / "clean" / "c.en", tmp_path / "clean" / "c.de")
    expected = [
        ("one", "eins"),
        ("two halves", "zwei hälften"),
        ("three", "drei"),
        ("four", "vier"),
    ]
    assert list(read_pairs([cleaned])) == expected
    assert sample_pairs([cleaned], 4, 4) == expected
    # the test sets split at "\n" too, and stay aligned (each line stripped)
    stripped = [s.strip() for s in german]
    assert load_test_set({"t": raw}, "en-de") == list(zip(english, stripped))


def test_the_tokenizer_sample_is_seeded_uniform_and_in_file_order(tmp_path):
    files = []
    for k in range(3):
        for lang in ("en", "de"):
            (tmp_path / f"{k}.{lang}").write_text("".join(f"{lang}{k}-{i}\n" for i in range(100)))
        files.append((tmp_path / f"{k}.en", tmp_path / f"{k}.de"))
    picked = sample_pairs(files, 300, 50, seed=1)
    assert len(picked) == 50 == len(set(picked)) and picked == sample_pairs(files, 300, 50, seed=1)
    assert picked != sample_pairs(files, 300, 50, seed=2)
    assert all(s.replace("en", "de") == t for s, t in picked)
    order = [int(s[2]) * 100 + int(s.split("-")[1]) for s, _ in picked]
    assert order == sorted(order) and {s[2] for s, _ in picked} == {"0", "1", "2"}
    assert len(sample_pairs(files, 300, 1000)) == 300


@pytest.fixture(scope="module")
def small_tokenizer(tmp_path_factory):
    lines = (SAMPLE / "src-train.txt").read_text(encoding="utf-8").splitlines()[:2000]
    return train_tokenizer([(s, s) for s in lines], tmp_path_factory.mktemp("tok") / "t", 500)


def test_a_full_disk_leaves_nothing_behind(tmp_path, monkeypatch, small_tokenizer):
    real = encoded._encode_block
    calls = []

    def filling(*args):
        calls.append(1)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(*args)

    monkeypatch.setattr(encoded, "_encode_block", filling)
    pairs = [("a sentence", "ein Satz")] * 50
    with pytest.raises(DataError, match="the disk filled up") as err:
        write_encoded(tmp_path / "enc", pairs, small_tokenizer, block=20)
    assert "XDG_CACHE_HOME" in str(err.value)
    assert list(tmp_path.iterdir()) == []  # neither the folder nor its temporary twin


def test_encoding_refuses_another_tokenizer_and_damage(tmp_path, small_tokenizer):
    write_encoded(tmp_path / "enc", [("a b", "c d")] * 5, small_tokenizer)
    with pytest.raises(DataError) as err:  # a TokenizerMismatch: a DataError and a TrainingError
        EncodedCorpus(tmp_path / "enc", "0123456789abcdef")
    assert isinstance(err.value, TokenizerMismatch) and isinstance(err.value, TrainingError)
    assert str(err.value) == (
        f"{tmp_path / 'enc'} was encoded with tokenizer {small_tokenizer.fingerprint}, but the "
        f"tokenizer in use is 0123456789abcdef: the same ids would mean other words. Encode the "
        f"corpus again with this tokenizer, or use the one it was encoded with."
    )
    assert is_encoded(tmp_path / "enc", small_tokenizer.fingerprint)
    tokens = tmp_path / "enc" / "tokens.u16"
    tokens.write_bytes(tokens.read_bytes()[:-2])
    assert not is_encoded(tmp_path / "enc", small_tokenizer.fingerprint)
    with pytest.raises(DataError, match="damaged"):
        EncodedCorpus(tmp_path / "enc")
    with pytest.raises(DataError, match="not a complete encoded corpus"):
        EncodedCorpus(tmp_path / "nothing")


def test_the_sample_files_match_their_registry_and_the_scale_switch(monkeypatch):
    for entry in SAMPLE_FILES.values():
        assert fetch(entry).stat().st_size == entry.size
    assert default_scale() == "sample"  # no GPU here
    monkeypatch.setenv(SCALE_ENV, "full")
    assert default_scale() == "full"
    monkeypatch.setenv(SCALE_ENV, "huge")
    with pytest.raises(DataError, match="'full' or 'sample'"):
        default_scale()
    with pytest.raises(DataError, match="English-German only"):
        prepare_wmt14("en-fr", "sample")


def test_the_samples_moses_tokenization_is_undone_by_language():
    """The offline sample is Moses-tokenized: `detokenized` undoes its escapes, its @-@ joiners
    and its spaces before punctuation, so that its text reads as the official files do."""
    from annotated.data.archives import detokenized

    en = ["It &apos;s a well @-@ known fact , isn &apos;t it ?",
          "He paid 3 @,@ 000 euros for &quot; the house &quot; ."]  # fmt: skip
    assert detokenized(en, "en") == ["It's a well-known fact, isn't it?",
                                     'He paid 3,000 euros for "the house".']  # fmt: skip
    assert detokenized(["Ein &quot; Haus &quot; , nicht ?"], "de") == ['Ein "Haus", nicht?']
    assert detokenized(["A plain line."], "en") == ["A plain line."]  # nothing to undo
