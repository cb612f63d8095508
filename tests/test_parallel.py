"""A corpus of your own (chapter 27): checked inputs, chapter 24's pipeline with a manifest, the
`parallel` task through the command lines, and the messages for bad input."""

import json
import shutil

import pytest

from annotated.batching import BOS, EOS, PAD
from annotated.cli import evaluate, prepare
from annotated.data.multi30k_corpus import load_multi30k
from annotated.data.parallel_corpus import check_pair, load_prepared, prepare_parallel, split_tsv
from annotated.errors import DataError, TrainingError
from annotated.training.registry import build_config
from annotated.training.task import TASKS

from helpers import run_trainer, sets, tiny_copy

TINY_MODEL = sets("model.N=1", "model.d_model=32", "model.d_ff=64", "model.h=2", "log_every=1")


def write_corpus(folder, pairs, name="train", langs=("en", "de")):
    folder.mkdir(parents=True, exist_ok=True)
    files = [folder / f"{name}.{lang}" for lang in langs]
    for side, path in enumerate(files):
        path.write_text("".join(pair[side] + "\n" for pair in pairs), encoding="utf-8")
    return files


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """2,000 Multi30k training pairs as plain files, a validation pair and a test pair."""
    root = tmp_path_factory.mktemp("own")
    pairs = load_multi30k("train")
    train = write_corpus(root / "text", pairs[:2000])
    valid = write_corpus(root / "text", pairs[2000:2100], "valid")
    test = write_corpus(root / "text", load_multi30k("test_2016_flickr")[:50], "test")
    return root, train, valid, test


@pytest.fixture(scope="module")
def prepared(corpus):
    root, train, valid, test = corpus
    return prepare_parallel(*train, root / "data", valid=valid, tests={"t16": test}, vocab_size=600)


def test_prepare_reads_files_as_they_are_and_writes_what_training_needs(corpus, prepared):
    root, train, valid, test = corpus
    assert prepared.pair == "en-de"  # from the files' suffixes
    assert prepared.tokenizer.vocab_size == 600
    rows = {row["corpus"]: row for row in prepared.cleaning["rows"]}
    assert rows["train"]["pairs in"] == 2000
    assert len(prepared.corpus("train")) == rows["train"]["pairs out"]
    src, tgt = prepared.corpus("train").pair(0)
    first = train[0].read_text().splitlines()[0], train[1].read_text().splitlines()[0]
    assert prepared.tokenizer.decode(src.tolist()) == first[0]
    assert prepared.tokenizer.decode(tgt.tolist()) == first[1]
    again = load_prepared(root / "data")
    assert again.tokenizer.fingerprint == prepared.tokenizer.fingerprint
    assert again.test_set("t16") == list(zip(*(p.read_text().splitlines() for p in test)))
    assert len(again.test_set("dev")) == 100  # the validation pair, copied beside the data
    manifest = json.loads((root / "data" / "prepared.json").read_text())
    assert str(root) not in json.dumps(manifest)  # every path relative: the folder can move


def test_a_corpus_fixed_in_place_is_prepared_again_not_taken_for_done(tmp_path):
    """Two target lines swapped, the files' sizes unchanged: prepare sees new text, cleans and
    encodes it again; the same files again change nothing."""
    pairs = [
        (f"a small dog number {i} runs", f"ein kleiner Hund Nummer {i} rennt") for i in range(300)
    ]
    files = write_corpus(tmp_path / "text", pairs)
    first = prepare_parallel(*files, tmp_path / "data", vocab_size=200)
    encoded = first.folder / "encoded" / "train"
    before = (encoded / "header.json").stat().st_mtime_ns
    again = prepare_parallel(*files, tmp_path / "data", vocab_size=200)
    assert (encoded / "header.json").stat().st_mtime_ns == before  # nothing to redo
    lines = files[1].read_text(encoding="utf-8").splitlines()
    lines[10], lines[20] = lines[20], lines[10]  # same length: "Nummer 10" and "Nummer 20"
    size = files[1].stat().st_size
    files[1].write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    assert files[1].stat().st_size == size
    fixed = prepare_parallel(*files, tmp_path / "data", vocab_size=200)
    corpus = fixed.corpus("train")
    targets = [fixed.tokenizer.decode(corpus.pair(i)[1].tolist()) for i in range(len(corpus))]
    assert "ein kleiner Hund Nummer 20 rennt" in targets and len(targets) == 300
    sources = [fixed.tokenizer.decode(corpus.pair(i)[0].tolist()) for i in range(len(corpus))]
    assert dict(zip(sources, targets))["a small dog number 10 runs"].endswith("Nummer 20 rennt")
    assert again.tokenizer.fingerprint == first.tokenizer.fingerprint


def test_the_parallel_task_batches_every_pair_once_and_names_its_test_sets(prepared):
    cfg = build_config("parallel", [f"data.path={prepared.folder}"])
    task = TASKS["parallel"](cfg)
    assert task.tokenizer.fingerprint == prepared.tokenizer.fingerprint
    seen = sorted(i for batch in task.epoch(0) for i in batch.tolist())
    assert seen == list(range(len(prepared.corpus("train"))))
    batch = task.micro_batch(0, 0)
    row = [t for t in batch.src[0].tolist() if t != PAD]
    assert row[-1] == EOS and batch.tgt[0, 0] == BOS
    names = TASKS["parallel"].test_sets(cfg)
    assert list(names) == ["t16", "valid"] and len(names["t16"]()) == 50
    assert cfg.data.target_language() == "de"


def test_the_parallel_configuration_trains_and_evaluates_through_the_command_lines(
    prepared, tmp_path
):
    out = tmp_path / "run"
    data = f"data.path={prepared.folder}"
    run_trainer("--config", "parallel", *sets(data), *TINY_MODEL, "--max-steps", "4",
                "--out", str(out))  # fmt: skip
    args = ["--run", str(out), "--results", str(tmp_path / "results"), "--limit", "5"]
    assert evaluate.main(args) == 0
    scores = json.loads((tmp_path / "results" / "results.json").read_text())
    assert set(scores["evaluation"]["tests"]) == {"t16", "valid"}


def test_a_relative_data_path_is_kept_resolved_for_every_later_command(prepared, tmp_path):
    """--set data.path=RELATIVE, as the chapter writes it: the run records the folder resolved,
    so evaluate works from another folder and --resume with the absolute path is the same data."""
    out = tmp_path / "run"
    relative = f"data.path={prepared.folder.name}"  # relative to the folder it is run from
    run_trainer("--config", "parallel", *sets(relative), *TINY_MODEL, "--max-steps", "2",
                "--out", str(out), cwd=prepared.folder.parent)  # fmt: skip
    recorded = json.loads((out / "run.json").read_text())["config"]["data"]["path"]
    assert recorded == str(prepared.folder.resolve())
    run_trainer("--config", "parallel", *sets(f"data.path={prepared.folder.resolve()}"),
                *TINY_MODEL, "--max-steps", "3", "--out", str(out), "--resume")  # fmt: skip
    args = ["--run", str(out), "--results", str(tmp_path / "results"), "--limit", "3"]
    assert evaluate.main(args) == 0  # from this process's folder, not the one trained from


def test_the_command_line_prepares_a_tsv_and_refuses_what_is_wrong(tmp_path, capsys):
    pairs = load_multi30k("train")[:300]
    tsv = tmp_path / "pairs.tsv"
    tsv.write_text("".join(f"{s}\t{t}\n" for s, t in pairs), encoding="utf-8")
    args = ["--tsv", str(tsv), "--out", str(tmp_path / "d"), "--vocab", "300"]
    args += ["--langs", "en", "de"]
    assert prepare.main(args) == 0
    assert "train with: python -m annotated.cli.train --config parallel" in capsys.readouterr().out
    assert len(load_prepared(tmp_path / "d").corpus("train")) <= 300
    # a vocabulary the corpus cannot fill, and out of range
    assert prepare.main(args[:4] + ["--vocab", "20000"]) == 2
    assert "more than this corpus can fill" in capsys.readouterr().err
    assert prepare.main(args[:4] + ["--vocab", "70000"]) == 2
    assert "choose between 100 and 65,535" in capsys.readouterr().err
    # malformed --valid and --test values
    assert prepare.main(args + ["--valid", "only-one-file"]) == 2
    assert "expected two files joined by a comma" in capsys.readouterr().err
    assert prepare.main(args + ["--test", str(tsv)]) == 2
    assert "expected NAME=SOURCE,REFERENCE" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:
        prepare.main(["--src", str(tsv), "--out", str(tmp_path / "x")])
    assert stop.value.code == 2 and "--tgt beside --src" in capsys.readouterr().err
    for extra, said in [
        (["--tgt", str(tsv)], "a --tsv file holds both sides"),
        (["--set", "foo=1"], "--set changes a named configuration (--config)"),
    ]:  # options this way of preparing would ignore are refused, not ignored
        with pytest.raises(SystemExit) as stop:
            prepare.main([*args, *extra])
        assert stop.value.code == 2 and said in capsys.readouterr().err


@pytest.mark.parametrize(
    "source, target, message",
    [
        (b"a\nb\n", b"x\n", "has 2 lines but"),
        (b"a\nb\n", b"\n\n", "holds no text"),
        (b"a\nb\n", "x\nM\xe4nner\n".encode("latin-1"), "line 2: byte 0xe4 at column 2"),
    ],
)
def test_each_broken_corpus_gets_its_message(tmp_path, source, target, message):
    (tmp_path / "s.en").write_bytes(source)
    (tmp_path / "t.de").write_bytes(target)
    with pytest.raises(DataError, match=message):
        check_pair(tmp_path / "s.en", tmp_path / "t.de")
    with pytest.raises(DataError, match=message):  # and prepare refuses before writing anything
        prepare_parallel(tmp_path / "s.en", tmp_path / "t.de", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_other_mistakes_get_messages(tmp_path):
    with pytest.raises(DataError, match="no such file"):
        check_pair(tmp_path / "missing.en", tmp_path / "missing.de")
    (tmp_path / "p.tsv").write_text("a\tb\nno tab here\n")
    with pytest.raises(DataError, match="line 2: 0 tabs.*Put a tab between") as missing:
        split_tsv(tmp_path / "p.tsv", tmp_path / "split", ("en", "de"))
    assert "extra" not in str(missing.value)  # there are none to remove
    (tmp_path / "q.tsv").write_text("a\tb\tc\n")
    with pytest.raises(DataError, match="line 1: 2 tabs.*Remove the extra tabs"):
        split_tsv(tmp_path / "q.tsv", tmp_path / "split", ("en", "de"))
    assert not (tmp_path / "split" / "train.en").exists()  # nothing half-written
    with pytest.raises(DataError, match="holds no prepared.json"):
        load_prepared(tmp_path)
    (tmp_path / "prepared.json").write_text("{not json")
    with pytest.raises(DataError, match="damaged"):
        load_prepared(tmp_path)
    with pytest.raises(DataError, match="--set data.path=FOLDER"):
        TASKS["parallel"](build_config("parallel"))
    files = write_corpus(tmp_path / "c", [("a b", "c d")] * 3)
    with pytest.raises(DataError, match="test set name 'valid'"):
        prepare_parallel(*files, tmp_path / "o", tests={"valid": files})
    with pytest.raises(DataError, match="two different codes"):
        prepare_parallel(*files, tmp_path / "o", langs=("en", "en"))
    only_long = write_corpus(tmp_path / "long", [("a", "b " * 5)] * 3)
    with pytest.raises(DataError, match="no training pair is left after cleaning"):
        prepare_parallel(*only_long, tmp_path / "o2")


def test_prepare_out_naming_a_file_is_refused_and_the_file_kept(tmp_path, capsys):
    files = write_corpus(tmp_path / "c", [("a b", "c d")] * 3)
    notes = tmp_path / "notes.txt"
    notes.write_text("mine\n")
    with pytest.raises(SystemExit) as stop:
        prepare.main(["--src", str(files[0]), "--tgt", str(files[1]), "--out", str(notes)])
    assert stop.value.code == 2 and notes.read_text() == "mine\n"
    assert f"--out {notes} is a file; give a folder" in capsys.readouterr().err


def test_a_tokenizer_that_cannot_be_read_is_a_message_with_exit_2(tmp_path, capsys):
    """prepare --tokenizer given a damaged run.json, one with no configuration, or a file that
    is not a SentencePiece model: exit 2 and what to give instead, nothing written."""
    files = write_corpus(tmp_path / "c", [("a b", "c d")] * 3)
    damaged, empty, text = tmp_path / "damaged", tmp_path / "empty", tmp_path / "notes.model"
    for folder, record in ((damaged, "{not json"), (empty, "{}")):
        folder.mkdir()
        (folder / "run.json").write_text(record)
    text.write_text("not a model\n")
    cases = [
        (damaged, "cannot be read as JSON", "give --tokenizer the run's tokenizer .model"),
        (empty, 'holds no configuration (no "config" entry)', "give the run folder"),
        (text, "is not a SentencePiece model that can be read", "give the .model file"),
    ]
    for given, what, fix in cases:
        out = tmp_path / f"out_{given.name}"
        args = ["--src", str(files[0]), "--tgt", str(files[1]), "--out", str(out)]
        assert prepare.main([*args, "--tokenizer", str(given)]) == 2
        err = capsys.readouterr().err
        assert what in err and fix in err and "Traceback" not in err, err
        assert not out.exists() or not any(out.rglob("*.npy"))


def test_fine_tuning_starts_from_the_weights_alone_and_refuses_what_does_not_fit(
    corpus, prepared, tmp_path, capsys
):
    import torch

    from annotated.checkpoints import checkpoint_paths, load_checkpoint
    from annotated.cli import train
    from annotated.model import make_model
    from annotated.training.resuming import initial_weights

    first = tmp_path / "first"
    data = f"data.path={prepared.folder}"
    run_trainer("--config", "parallel", *sets(data), *TINY_MODEL, "--max-steps", "3",
                "--out", str(first))  # fmt: skip
    trained = checkpoint_paths(first)[-1]
    # new in-domain data, encoded with the trained run's tokenizer (found through its run folder)
    root = corpus[0]
    more = write_corpus(root / "more", load_multi30k("train")[5000:5600])
    args = ["--src", str(more[0]), "--tgt", str(more[1]), "--out", str(tmp_path / "more")]
    assert prepare.main(args + ["--tokenizer", str(first)]) == 0
    again = load_prepared(tmp_path / "more")
    assert again.tokenizer.fingerprint == prepared.tokenizer.fingerprint
    # the weights, and only the weights: a new run counts its steps from the start
    cfg = build_config("parallel", [f"data.path={again.folder}", *TINY_MODEL[1::2]])
    model = make_model(600, 600, **vars(cfg.model))
    initial_weights(model, trained, cfg, again.tokenizer.fingerprint)
    saved = load_checkpoint(trained)["model"]
    assert all(torch.equal(v, saved[k]) for k, v in model.state_dict().items())
    tuned = tmp_path / "tuned"
    own = [*TINY_MODEL, "--set", f"data.path={again.folder}", "--max-steps", "2"]
    assert (
        train.main(["--config", "parallel", "--out", str(tuned), "--init", str(trained), *own]) == 0
    )
    steps = [
        json.loads(line)["step"] for line in (tuned / "metrics.jsonl").read_text().splitlines()
    ]
    assert steps[0] == 1
    # a requeued fine-tuning job resumes from its own checkpoints, wherever --init has gone
    moved = trained.rename(tmp_path / "moved.pt")
    resumed = ["--config", "parallel", "--out", str(tuned), "--init", str(trained), "--resume"]
    assert train.main([*resumed, *own[:-1], "3"]) == 0, capsys.readouterr().err
    assert json.loads((tuned / "metrics.jsonl").read_text().splitlines()[-1])["step"] == 3
    moved.rename(trained)
    # another shape, another tokenizer, no such file: refused, each with its remedy
    other = ["--config", "parallel", "--init", str(trained), *own]
    assert train.main(other + ["--out", str(tmp_path / "a"), "--set", "model.N=2"]) == 2
    assert "--set model.N=1" in capsys.readouterr().err
    assert prepare.main(args[:4] + ["--out", str(tmp_path / "fresh"), "--vocab", "500"]) == 0
    fresh = ["--set", f"data.path={tmp_path / 'fresh'}", "--out", str(tmp_path / "b")]
    assert train.main(other + fresh) == 2
    assert "prepare --tokenizer" in capsys.readouterr().err
    assert train.main(other[:2] + ["--init", str(tmp_path / "nothing.pt"), *own[:-2],
                                   "--out", str(tmp_path / "c")]) == 2  # fmt: skip
    assert "init: must name a checkpoint file" in capsys.readouterr().err


def test_tensorboard_holds_the_runs_curves_and_the_evaluated_bleu(prepared, tmp_path, capsys):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out, board = tmp_path / "run", tmp_path / "board"
    data = f"data.path={prepared.folder}"
    run_trainer("--config", "parallel", *sets(data, "checkpoint_every=2"), *TINY_MODEL,
                "--max-steps", "4", "--tensorboard", str(board), "--out", str(out))  # fmt: skip
    logged = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    args = ["--run", str(out), "--limit", "3", "--beam", "1", "--tensorboard", str(board)]
    assert evaluate.main(args) == 0
    events = EventAccumulator(str(board))
    events.Reload()
    for key in ("loss", "lr", "target_tokens_per_s", "grad_norm"):
        points = events.Scalars(f"train/{key}")
        assert [p.step for p in points] == [r["step"] for r in logged] == [1, 2, 3, 4]
        assert [p.value for p in points] == pytest.approx([r[key] for r in logged], rel=1e-6)
    per_checkpoint = events.Scalars("bleu/t16")  # each kept checkpoint, scored on its own
    assert [p.step for p in per_checkpoint] == [2, 4]
    assert [p.step for p in events.Scalars("bleu/t16 (averaged)")] == [4]


def test_a_resumed_run_keeps_the_tensorboard_point_of_the_step_it_resumed_from(tmp_path):
    """Steps 3 and 4 logged, then killed with only checkpoint 2 kept: the resumed session hides
    what came after step 2 and logs it again, so every step shows once, as metrics.jsonl has it."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out, board = tmp_path / "run", tmp_path / "board"
    tiny_copy(out, *sets("max_steps=4", "checkpoint_every=2", "log_every=1", "keep_last=5"),
              "--tensorboard", str(board))  # fmt: skip
    (out / "checkpoints" / "ckpt_00000004.pt").unlink()  # as if killed before saving step 4
    tiny_copy(out, *sets("max_steps=4", "checkpoint_every=2", "log_every=1", "keep_last=5"),
              "--tensorboard", str(board), "--resume")  # fmt: skip
    logged = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    events = EventAccumulator(str(board))
    events.Reload()
    points = events.Scalars("train/loss")
    assert [p.step for p in points] == [r["step"] for r in logged] == [1, 2, 3, 4]
    assert [p.value for p in points] == pytest.approx([r["loss"] for r in logged], rel=1e-6)


def test_tensorboard_missing_is_a_message_not_a_traceback(prepared, tmp_path, monkeypatch):
    import sys

    from annotated.errors import ConfigError
    from annotated.training.tensorboard import open_board

    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # as if not installed
    with pytest.raises(
        ConfigError, match=r"pip install 'annotated-transformer-book\[tensorboard\]'"
    ):
        open_board(tmp_path / "board")


def test_a_folder_prepared_again_from_other_data_says_so(tmp_path, capsys):
    """The same files again: silent. Other files into the same folder: prepared, with a note
    that runs trained on the earlier version cannot resume from it."""
    dogs = [(f"a dog number {i} runs", f"ein Hund Nummer {i} rennt") for i in range(200)]
    cats = [(f"a cat number {i} sleeps", f"eine Katze Nummer {i} schläft") for i in range(200)]
    first, second = write_corpus(tmp_path / "a", dogs), write_corpus(tmp_path / "b", cats)
    out = str(tmp_path / "data")

    def prepare_from(files) -> str:
        capsys.readouterr()
        code = prepare.main(["--src", str(files[0]), "--tgt", str(files[1]), "--out", out,
                             "--vocab", "120"])  # fmt: skip
        assert code == 0
        return capsys.readouterr().err

    assert "note:" not in prepare_from(first)
    assert "note:" not in prepare_from(first)  # nothing changed
    said = prepare_from(second)
    assert f"note: {out} was prepared from other training data" in said, said
    assert "can no longer resume" in said
    assert "note:" not in prepare_from(second)


@pytest.mark.parametrize("inside", ["encoded", "clean", "raw", "tokenizer", "clean/train.en"])
def test_a_link_planted_in_a_prepared_folder_is_refused_before_anything_is_written(
    tmp_path, inside
):
    """A symbolic link in place of a folder or file of a prepared folder: prepare stops with a
    message naming it, and the folder it points to is left exactly as it was."""
    pairs = [
        (f"a red cat number {i} sleeps", f"eine rote Katze Nummer {i} schläft") for i in range(300)
    ]
    files = write_corpus(tmp_path / "text", pairs)
    prepared = prepare_parallel(
        *files, tmp_path / "data", tests={"t": files}, vocab_size=200
    ).folder
    elsewhere = tmp_path / "elsewhere"
    planted = prepared / inside
    shutil.move(planted, elsewhere)  # the real content now lives elsewhere, behind a link
    planted.symlink_to(elsewhere, target_is_directory=elsewhere.is_dir())
    files[1].write_text(files[1].read_text().replace("Katze", "Maus"))  # work for prepare to do
    before = sorted((p.relative_to(tmp_path), p.stat().st_mtime_ns) for p in
                    ([elsewhere] if elsewhere.is_file() else elsewhere.rglob("*")))  # fmt: skip
    with pytest.raises(TrainingError, match="is a symbolic link"):
        prepare_parallel(*files, tmp_path / "data", tests={"t": files}, vocab_size=200)
    after = sorted((p.relative_to(tmp_path), p.stat().st_mtime_ns) for p in
                   ([elsewhere] if elsewhere.is_file() else elsewhere.rglob("*")))  # fmt: skip
    assert after == before


def test_prepare_notices_tokenized_text_and_undoes_it_when_asked(corpus, tmp_path, capsys):
    """Files as Moses' tokenizer leaves them get a note; --detokenize prepares their plain text
    instead, in the output folder, and the note is gone. Files named without language codes get
    a note that says how to name the languages."""
    from sacremoses import MosesTokenizer

    from annotated.data.parallel_corpus import tokenized_line

    _, train, _, _ = corpus
    plain = [p.read_text(encoding="utf-8").splitlines()[:600] for p in train]
    moses = [[MosesTokenizer(lang).tokenize(line, return_str=True, aggressive_dash_splits=True)
              for line in side] for side, lang in zip(plain, ("en", "de"))]  # fmt: skip
    files = write_corpus(tmp_path / "moses", list(zip(*moses)))
    assert tokenized_line(files[0]) is not None and tokenized_line(train[0]) is None
    given = ["--src", str(files[0]), "--tgt", str(files[1]), "--vocab", "300"]
    assert 0 == prepare.main([*given, "--out", str(tmp_path / "noticed")])
    said = capsys.readouterr().err
    assert f"note: {files[0]} looks tokenized or escaped" in said and "--detokenize" in said
    assert 0 == prepare.main([*given, "--detokenize", "--out", str(tmp_path / "plain")])
    assert "looks tokenized" not in capsys.readouterr().err
    made = tmp_path / "plain" / "raw" / "train.en"
    lines = made.read_text(encoding="utf-8").splitlines()
    back = sum(a == b.strip() for a, b in zip(lines, plain[0]))
    assert back > 0.95 * len(plain[0]) and tokenized_line(made) is None  # the plain text again
    unnamed = [tmp_path / "a.txt", tmp_path / "b.txt"]
    for path, source in zip(unnamed, train):
        shutil.copy(source, path)
    assert 0 == prepare.main(["--src", str(unnamed[0]), "--tgt", str(unnamed[1]),
                  "--out", str(tmp_path / "unnamed"), "--vocab", "300"])  # fmt: skip
    assert "no --langs was given" in capsys.readouterr().err
    assert load_prepared(tmp_path / "unnamed").pair == "src-tgt"


def test_the_parallel_task_without_a_folder_says_how_to_name_one(tmp_path, monkeypatch):
    """`data.path` is kept absolute, so a run finds its data from any folder; a configuration
    without one is refused with the command that prepares a folder and the setting that names it."""
    from annotated.training.registry import build_config
    from annotated.training.tasks.parallel import TASK, ParallelData

    monkeypatch.chdir(tmp_path)
    assert ParallelData(path="corpus").path == str(tmp_path / "corpus")
    cfg = build_config("parallel")
    for use in (TASK.tokenizer_for, TASK.test_sets, lambda c: TASK(c)):
        with pytest.raises(DataError, match="cli.prepare --src FILE --tgt FILE.*data.path=FOLDER"):
            use(cfg)


def test_a_byte_order_mark_at_the_start_of_a_file_is_not_text(tmp_path):
    """Editors on Windows start a UTF-8 file with a byte-order mark: it was kept as the first
    character of the first training sentence (in a pasted TSV too)."""
    from annotated.data.cleaning import read_pairs

    files = write_corpus(tmp_path / "c", [("a b", "c d"), ("e", "f")])
    for path in files:
        path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    assert list(read_pairs([tuple(files)])) == [("a b", "c d"), ("e", "f")]
    (tmp_path / "b.tsv").write_bytes(b"\xef\xbb\xbfa b\tc d\n")
    split = split_tsv(tmp_path / "b.tsv", tmp_path / "split", ("en", "de"))
    assert list(read_pairs([split])) == [("a b", "c d")]
