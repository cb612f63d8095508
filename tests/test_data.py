"""Data files and tokenizer: checksums, local copies, downloads (from a local server), parallel
reading, and the SentencePiece tokenizer. Nothing here touches the internet.

The real data is read from $ANNOTATED_DATA, defaulting to <repo>/../shared/data.
"""

import gzip
import hashlib
import os
import shutil
import unicodedata
from pathlib import Path

import pytest

import annotated.data.download as data
from annotated.batching import BOS, EOS, PAD
from annotated.data.download import data_root, fetch, read_parallel
from annotated.data.multi30k_corpus import MULTI30K_FILES, load_multi30k
from annotated.data.tokenizer import UNK, load_tokenizer, train_tokenizer
from annotated.errors import ChecksumError

from helpers import serve

ROOT = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("ANNOTATED_DATA") or ROOT.parent / "shared" / "data").resolve()
TRAIN_EN = "multi30k/task1/raw/train.en.gz"
VAL_DE = "multi30k/task1/raw/val.de.gz"


@pytest.fixture(autouse=True)
def _shared_data(monkeypatch, tmp_path):
    """Every test sees ANNOTATED_DATA = the shared copy, and a private cache folder."""
    if not (SHARED / TRAIN_EN).is_file():
        pytest.fail(
            f"the shared data is missing: no {SHARED / TRAIN_EN}. Set ANNOTATED_DATA to the folder "
            f"holding multi30k/task1/raw/ (see README)."
        )
    monkeypatch.setenv("ANNOTATED_DATA", str(SHARED))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    monkeypatch.delenv("ANNOTATED_DATA_MIRROR", raising=False)


# --- where the data lives, and checksums --------------------------------------------------------


def test_data_root_follows_the_env_var(monkeypatch, tmp_path):
    assert data_root() == SHARED
    monkeypatch.delenv("ANNOTATED_DATA")
    assert data_root() == tmp_path / "xdg-cache" / "annotated"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert data_root() == Path.home() / ".cache" / "annotated"


def test_every_shared_file_matches_the_registry():
    for relpath, entry in MULTI30K_FILES.items():
        path = fetch(entry)
        assert path == SHARED / relpath
        assert path.stat().st_size == entry.size
    assert MULTI30K_FILES[TRAIN_EN].url.startswith(
        "https://raw.githubusercontent.com/multi30k/dataset/a3d2e0d2"
    )


def test_corrupted_local_copy_is_reported_with_both_digests(monkeypatch, tmp_path):
    local = tmp_path / "data"
    copy = local / VAL_DE
    copy.parent.mkdir(parents=True)
    blob = bytearray((SHARED / VAL_DE).read_bytes())
    blob[100] ^= 0xFF
    copy.write_bytes(bytes(blob))
    monkeypatch.setenv("ANNOTATED_DATA", str(local))
    with pytest.raises(ChecksumError) as err:
        fetch(MULTI30K_FILES[VAL_DE])
    message = str(err.value)
    assert MULTI30K_FILES[VAL_DE].sha256 in message
    assert hashlib.sha256(bytes(blob)).hexdigest() in message
    assert str(copy) in message
    assert copy.exists(), "a local file that fails the check is the user's: it must not be deleted"


def test_missing_local_copy_names_the_path_and_the_env_var(monkeypatch, tmp_path):
    monkeypatch.setenv("ANNOTATED_DATA", str(tmp_path / "empty"))
    monkeypatch.setattr(data, "_download", lambda *a, **k: pytest.fail("must not download"))
    with pytest.raises(data.DataError) as err:
        fetch(MULTI30K_FILES[TRAIN_EN])
    message = str(err.value)
    assert str(tmp_path / "empty" / TRAIN_EN) in message
    assert "ANNOTATED_DATA" in message


def test_unknown_split():
    with pytest.raises(ValueError, match="test_2016_flickr"):
        load_multi30k("test")


# --- downloads, served from a temporary folder on 127.0.0.1 -------------------------------------


@pytest.fixture
def server(tmp_path):
    """A mirror folder (initially with true copies of two files) served over HTTP on 127.0.0.1."""
    mirror = tmp_path / "mirror"
    for relpath in (TRAIN_EN, VAL_DE):
        (mirror / relpath).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(SHARED / relpath, mirror / relpath)
    with serve(mirror) as (url, handler):
        yield url, mirror, handler


def test_download_verifies_and_renames(monkeypatch, tmp_path, server):
    url, _, handler = server
    monkeypatch.delenv("ANNOTATED_DATA")  # downloads are allowed only then
    monkeypatch.setenv("ANNOTATED_DATA_MIRROR", url)
    path = fetch(MULTI30K_FILES[VAL_DE], progress=False)
    assert path == tmp_path / "xdg-cache" / "annotated" / VAL_DE
    assert path.read_bytes() == (SHARED / VAL_DE).read_bytes()
    assert not path.with_name(path.name + ".part").exists()
    assert handler.log == [(f"/{VAL_DE}", None)]
    fetch(MULTI30K_FILES[VAL_DE], progress=False)  # second call: local, verified, no request
    assert len(handler.log) == 1


@pytest.mark.parametrize("server_honours_range", [True, False])
def test_download_resumes_a_partial_file(tmp_path, server, server_honours_range):
    url, _, handler = server
    handler.ranges = server_honours_range
    root = tmp_path / "root"
    full = (SHARED / TRAIN_EN).read_bytes()
    part = root / (TRAIN_EN + ".part")
    part.parent.mkdir(parents=True)
    part.write_bytes(full[:200_000])
    path = fetch(MULTI30K_FILES[TRAIN_EN], root=root, download=True, base_url=url, progress=False)
    assert path.read_bytes() == full
    assert not part.exists()
    assert handler.log == [(f"/{TRAIN_EN}", "bytes=200000-")]


def test_download_with_wrong_checksum_leaves_nothing(tmp_path, server):
    url, mirror, _ = server
    (mirror / VAL_DE).write_bytes(b"x" * MULTI30K_FILES[VAL_DE].size)  # right size, wrong bytes
    root = tmp_path / "root"
    with pytest.raises(ChecksumError) as err:
        fetch(MULTI30K_FILES[VAL_DE], root=root, download=True, base_url=url, progress=False)
    assert MULTI30K_FILES[VAL_DE].sha256 in str(err.value) and "deleted" in str(err.value)
    assert f"was downloaded from {url}" in str(err.value)
    assert not (root / VAL_DE).exists()
    assert not (root / (VAL_DE + ".part")).exists()


def test_bad_partial_file_is_deleted_so_the_next_try_starts_over(tmp_path, server):
    url, _, handler = server
    root = tmp_path / "root"
    part = root / (VAL_DE + ".part")
    part.parent.mkdir(parents=True)
    part.write_bytes(b"garbage")  # resumed onto wrong bytes
    with pytest.raises(ChecksumError) as err:
        fetch(MULTI30K_FILES[VAL_DE], root=root, download=True, base_url=url, progress=False)
    assert "the rest from an earlier attempt" in str(err.value)
    assert not part.exists()
    assert fetch(
        MULTI30K_FILES[VAL_DE], root=root, download=True, base_url=url, progress=False
    ).is_file()
    assert handler.log[-1] == (f"/{VAL_DE}", None)


def test_stale_complete_partial_file_is_not_reported_as_a_download(tmp_path, server):
    url, _, handler = server
    root = tmp_path / "root"
    part = root / (VAL_DE + ".part")
    part.parent.mkdir(parents=True)
    part.write_bytes(b"x" * MULTI30K_FILES[VAL_DE].size)  # full size, wrong bytes, from an old try
    with pytest.raises(ChecksumError) as err:
        fetch(MULTI30K_FILES[VAL_DE], root=root, download=True, base_url=url, progress=False)
    message = str(err.value)
    assert handler.log == []  # nothing was requested ...
    assert "earlier attempt" in message and "nothing was downloaded now" in message
    assert "was downloaded from" not in message  # ... and the message does not claim it
    assert not part.exists()
    assert fetch(
        MULTI30K_FILES[VAL_DE], root=root, download=True, base_url=url, progress=False
    ).is_file()


# --- reading parallel text ----------------------------------------------------------------------


def test_multi30k_splits_and_stripping():
    train = load_multi30k("train")
    assert len(train) == 29000 and len(load_multi30k("test_2016_flickr")) == 1000
    assert train[0] == (
        "Two young, White males are outside near many bushes.",
        "Zwei junge weiße Männer sind im Freien in der Nähe vieler Büsche.",
    )
    assert all(s == s.strip() and t == t.strip() and s and t for s, t in train)


def test_different_line_counts(tmp_path):
    src, tgt = tmp_path / "a.en", tmp_path / "b.de"
    src.write_text("one\ntwo\nthree\n")
    tgt.write_text("eins\nzwei\n")
    with pytest.raises(ValueError) as err:
        read_parallel(src, tgt)
    message = str(err.value)
    assert f"{src} has 3 lines" in message and f"{tgt} has 2." in message


def test_empty_pairs_are_dropped_and_counted(tmp_path):
    src, tgt = tmp_path / "a.en.gz", tmp_path / "b.de"
    with gzip.open(src, "wt", encoding="utf-8") as f:
        f.write("a dog\n   \nthe cat \nhello\n")
    tgt.write_text("ein Hund\nleer\n\u00a0die Katze\u00a0\n\t\n", encoding="utf-8")
    with pytest.warns(UserWarning, match="dropped 2 of 4"):
        pairs = read_parallel(src, tgt)
    assert pairs == [("a dog", "ein Hund"), ("the cat", "die Katze")]


def test_only_newline_ends_a_line(tmp_path):
    src, tgt = tmp_path / "a", tmp_path / "b"
    src.write_bytes("one\u2028still one\x85too\r\ntwo\n".encode())
    tgt.write_bytes(b"eins\nzwei")  # no final newline: still two lines
    assert read_parallel(src, tgt) == [("one\u2028still one\x85too", "eins"), ("two", "zwei")]


def test_invalid_utf8_names_file_and_line(tmp_path):
    src, tgt = tmp_path / "a.en", tmp_path / "b.de"
    src.write_text("fine\nfine\nfine\n")
    tgt.write_bytes(b"gut\ngut\nschlecht \xff\n")
    with pytest.raises(ValueError) as err:
        read_parallel(src, tgt)
    assert str(tgt) in str(err.value) and "line 3" in str(err.value)


# --- the tokenizer ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    train = load_multi30k("train", root=SHARED)  # module fixture: runs before the env is set
    folder = tmp_path_factory.mktemp("tok")
    return train, folder, train_tokenizer(train, folder / "bpe", vocab_size=8000, seed=0)


def test_special_ids():
    assert (PAD, BOS, EOS, UNK) == (0, 1, 2, 3)


def test_tokenizer_round_trip_on_multi30k(trained):
    _, folder, tok = trained
    assert tok.vocab_size == 8000
    assert [tok.sp.id_to_piece(i) for i in (PAD, BOS, EOS, UNK)] == [
        "<pad>",
        "<s>",
        "</s>",
        "<unk>",
    ]
    for en, de in load_multi30k("val") + load_multi30k(
        "test_2016_flickr"
    ):  # all characters seen in training
        for sentence in (en, de):
            ids = tok.encode(sentence)
            assert ids and BOS not in ids and EOS not in ids and UNK not in ids
            assert tok.decode(ids) == " ".join(unicodedata.normalize("NFKC", sentence).split())
    de = "Ein Hund läuft über die Straße."
    assert tok.decode([BOS] + tok.encode(de) + [EOS, PAD]) == de
    loaded = load_tokenizer(folder / "bpe.model")
    assert loaded.encode(de) == tok.encode(de) and loaded.vocab_size == 8000


def test_tokenizer_training_is_deterministic(trained):
    train, folder, _ = trained
    train_tokenizer(train, folder / "again", vocab_size=8000, seed=0)
    assert (folder / "again.model").read_bytes() == (folder / "bpe.model").read_bytes()


def test_failed_training_leaves_no_model(tmp_path):
    pairs = [(f"word{i} other{i}", f"wort{i} anderes{i}") for i in range(100)]
    with pytest.raises(data.DataError, match=r"more than this corpus can fill \(at most \d+\)"):
        train_tokenizer(pairs, tmp_path / "tiny", vocab_size=5000)  # far too large for it
    with pytest.raises(data.DataError, match=r"such as (\d{3}) \(--set data.vocab=\1 "):
        train_tokenizer(pairs, tmp_path / "tiny", vocab_size=5000)  # a size that fits
    for text in ("\0" * 3000, "a b c"):  # NUL bytes, or too few distinct characters
        with pytest.raises(data.DataError, match="too little text to learn subword pieces"):
            train_tokenizer([(text, text)] * 10, tmp_path / "tiny", vocab_size=8000)
    assert list(tmp_path.iterdir()) == []


def test_interrupted_training_keeps_the_old_model(monkeypatch, tmp_path):
    import sentencepiece as spm

    pairs = [("a dog runs", "ein Hund läuft"), ("a cat sleeps", "eine Katze schläft")] * 20
    train_tokenizer(pairs, tmp_path / "m", vocab_size=40)
    before = (tmp_path / "m.model").read_bytes()

    def interrupted(*, model_writer, **kwargs):
        model_writer.write(b"half a model")
        raise KeyboardInterrupt

    monkeypatch.setattr(spm.SentencePieceTrainer, "train", interrupted)
    with pytest.raises(KeyboardInterrupt):
        train_tokenizer(pairs, tmp_path / "m", vocab_size=40)
    with pytest.raises(KeyboardInterrupt):
        train_tokenizer(pairs, tmp_path / "new", vocab_size=40)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.model"]
    assert (tmp_path / "m.model").read_bytes() == before


def test_foreign_model_is_rejected(tmp_path):
    import sentencepiece as spm

    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(["a dog runs", "a cat sleeps"] * 20),
        model_prefix=str(tmp_path / "default"),
        vocab_size=30,
        hard_vocab_limit=False,
        minloglevel=2,
    )
    with pytest.raises(ValueError, match="pad, bos, eos, unk"):
        load_tokenizer(tmp_path / "default.model")
    with pytest.raises(FileNotFoundError):
        load_tokenizer(tmp_path / "nope.model")


def test_tokenizer_cache_is_keyed_by_what_the_model_depends_on():
    from annotated.data.multi30k_corpus import multi30k_tokenizer

    pairs = load_multi30k("val")
    first = multi30k_tokenizer(600, pairs)
    other_data = multi30k_tokenizer(600, pairs[:600])  # same size, other sentences
    assert other_data.fingerprint != first.fingerprint
    assert multi30k_tokenizer(600, pairs).fingerprint == first.fingerprint  # from the cache
    assert multi30k_tokenizer(500, pairs).vocab_size == 500
    cached = sorted(p.name for p in (data.cache_dir() / "tokenizers").glob("*.model"))
    assert len(cached) == 3 and all(name.startswith("multi30k_bpe") for name in cached), cached


def test_fingerprint_tells_tokenizers_apart(tmp_path):
    pairs = load_multi30k("val")
    a = train_tokenizer(pairs, tmp_path / "a", vocab_size=600)
    b = train_tokenizer(pairs, tmp_path / "b", vocab_size=600)
    smaller = train_tokenizer(pairs, tmp_path / "c", vocab_size=500)
    assert a.fingerprint == b.fingerprint and len(a.fingerprint) == 16
    assert load_tokenizer(tmp_path / "a.model").fingerprint == a.fingerprint
    assert smaller.fingerprint != a.fingerprint


def test_byte_order_mark_is_dropped_from_the_first_line_only(tmp_path):
    path = tmp_path / "bom.de"
    path.write_bytes("\ufeffErste Zeile\nzweite \ufeff Zeile\n".encode("utf-8"))
    assert data.read_lines(path) == ["Erste Zeile", "zweite \ufeff Zeile"]
