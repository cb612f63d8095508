"""`python -m annotated.cli.translate`: model rebuilt from the checkpoint, bad checkpoints and
inputs."""

import select
import subprocess
import sys

import pytest
import torch

from annotated.errors import TrainingError
from annotated.evaluation.translation import load_model
from annotated.training.registry import build_config
from annotated.training.tasks.copy import IdTokenizer
from annotated.training.trainer import train

from helpers import refused


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    out = tmp_path_factory.mktemp("copy")
    cfg = build_config(
        "copy",
        [
            "max_steps=3",
            "checkpoint_every=1",
            "model.N=1",
            "model.d_model=16",
            "model.d_ff=32",
            "model.h=2",
            "data.batch_sentences=4",
        ],
    )
    train(cfg, out, progress=False)
    return sorted((out / "checkpoints").glob("*.pt"))


def test_model_is_rebuilt_from_its_configuration(checkpoint):
    model, tok, cfg = load_model([checkpoint[-1]])
    assert cfg.model.d_model == 16 and isinstance(tok, IdTokenizer)
    state = torch.load(checkpoint[-1], weights_only=True)["model"]
    for k, v in model.state_dict().items():
        assert torch.equal(v, state[k]), k


def test_averaging_several_checkpoints(checkpoint):
    model, _, _ = load_model(checkpoint[-2:])
    a, b = (torch.load(p, weights_only=True)["model"] for p in checkpoint[-2:])
    k = "encoder.layers.0.feed_forward.w_1.weight"
    torch.testing.assert_close(model.state_dict()[k], (a[k] + b[k]) / 2)


def test_one_call_from_python_with_string_paths(checkpoint):
    """annotated.load: one checkpoint as a str or a Path, or several (averaged); its translate
    and score are translate's and score_translations' on the loaded model."""
    import annotated
    from annotated.bleu_scores import score_translations
    from annotated.evaluation.translation import translate

    one = annotated.load(str(checkpoint[-1]))
    same = load_model(checkpoint[-1])  # a single path, not read one character at a time
    assert all(torch.equal(a, b) for a, b in zip(one.model.state_dict().values(),
                                                  same[0].state_dict().values()))  # fmt: skip
    lines = ["3 4 5", "7 7 8 9"]
    assert one.translate(lines) == translate(same[0], same[1], lines)
    assert one.translate(lines, beam=1) == translate(same[0], same[1], lines, beam_size=1)
    best = one.translate(lines, nbest=2)
    assert len(best) == 2 and all(len(b) == 2 for b in best)
    pairs = [("3 4 5", "3 4 5"), ("7 7 8 9", "7 7 8 9")]
    scored = one.score(pairs)  # score's: every BLEU, the translations, the decoding time
    assert scored.pop("translations") == one.translate(lines) and scored.pop("decode_seconds") >= 0
    assert scored == score_translations(one.translate(lines), [r for _, r in pairs], "de")
    averaged = annotated.load([str(p) for p in checkpoint[-2:]]).model.state_dict()
    assert all(torch.equal(a, b) for a, b in zip(averaged.values(),
               load_model(checkpoint[-2:])[0].state_dict().values()))  # fmt: skip
    with pytest.raises(TrainingError, match="no checkpoint given"):
        annotated.load([])
    with pytest.raises(TrainingError, match="does not exist"):
        annotated.load("no/such.pt")


def test_checkpoint_of_another_shape_names_the_parameters(checkpoint, tmp_path):
    state = torch.load(checkpoint[-1], weights_only=True)
    state["config"]["model"]["d_ff"] = 64  # the weights no longer fit the configuration
    bad = tmp_path / "bad.pt"
    torch.save(state, bad)
    with pytest.raises(
        TrainingError, match=r"size mismatch for encoder\.layers\.0\.feed_forward\.w_1\.weight"
    ):
        load_model([bad])


def test_missing_checkpoint_and_bad_symbols(checkpoint, tmp_path):
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "annotated.cli.translate",
            "--checkpoint",
            str(tmp_path / "none.pt"),
        ],
        input="3 4\n",
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and "does not exist" in r.stderr
    r = subprocess.run(
        [sys.executable, "-m", "annotated.cli.translate", "--checkpoint", str(checkpoint[-1])],
        input="3 4\nhello\n",
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and "integers separated by spaces" in r.stderr


def cli(*args, stdin: bytes = b"3 4\n"):
    return subprocess.run(
        [sys.executable, "-m", "annotated.cli.translate", *map(str, args)],
        input=stdin,
        capture_output=True,
    )


def test_checkpoint_of_another_tokenizer_is_refused(checkpoint, tmp_path):
    """Ids written as numbers are rebuilt from the fingerprint alone ("ids-13"); a fingerprint
    that does not match the weights (as if trained on other ids) is refused by name, and so is
    a SentencePiece fingerprint with no tokenizer carried and a task that makes another one."""
    state = torch.load(checkpoint[-1], weights_only=True)
    assert state["tokenizer"] == IdTokenizer(13).fingerprint  # written by the trainer
    assert isinstance(load_model([checkpoint[-1]])[1], IdTokenizer)
    state["tokenizer"] = "ids-99"  # as if trained on other ids
    bad = tmp_path / "other_tokenizer.pt"
    torch.save(state, bad)
    with pytest.raises(TrainingError, match="other_tokenizer.pt does not fit the model built"):
        load_model([bad])
    state["tokenizer"] = "5d947ff1cc62ab0f"  # a SentencePiece model's, not carried
    torch.save(state, bad)
    with pytest.raises(
        TrainingError,
        match="trained with tokenizer 5d947ff1cc62ab0f, but the tokenizer in use is ids-13",
    ):
        load_model([bad])


def test_corrupt_older_checkpoint_while_averaging_is_named(checkpoint, tmp_path):
    bad = tmp_path / "ckpt_old.pt"
    bad.write_bytes(checkpoint[0].read_bytes()[:300])  # truncated
    r = cli("--checkpoint", bad, checkpoint[-1])
    message = r.stderr.decode()
    assert r.returncode == 2 and str(bad) in message and "cannot be read" in message, message
    assert "Traceback" not in message


def test_input_is_utf8_without_byte_order_mark(checkpoint):
    r = cli("--checkpoint", checkpoint[-1], stdin=b"3 4\n5 \xff 6\n")
    message = r.stderr.decode()
    assert r.returncode == 2 and "standard input: line 2 is not valid UTF-8" in message, message
    assert "Traceback" not in message
    r = cli("--checkpoint", checkpoint[-1], stdin="\ufeff3 4 5\n6 7\n".encode())
    assert r.returncode == 0, r.stderr.decode()  # the mark is not read as part of "3"
    assert len(r.stdout.decode().splitlines()) == 2


@pytest.mark.parametrize(
    "flags",
    [
        ("--batch-size", "0"),
        ("--alpha", "nan"),
        ("--alpha", "-1"),
        ("--alpha", "1e308"),
        ("--beam", "0"),
    ],  # --alpha 1e308 was an IndexError's traceback
)
def test_meaningless_search_settings_are_refused(checkpoint, flags):
    said = refused("--checkpoint", checkpoint[-1], *flags, command="translate")
    assert "--beam and --batch-size must be at least 1, --alpha from 0 to 5" in said, said


def test_ctrl_c_gives_a_message_not_a_traceback(checkpoint, monkeypatch, capsys):
    import importlib
    import io

    # the module; annotated.translate is the function
    cli = importlib.import_module("annotated.cli.translate")

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "translate", interrupted)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"3 4\n")))
    assert cli.main(["--checkpoint", str(checkpoint[-1])]) == 130
    assert "interrupted: the translations of the lines read so far" in capsys.readouterr().err


def test_lines_are_translated_as_they_arrive_through_a_pipe(checkpoint):
    """A person typing: each line's translation comes back while the input is still open."""
    cmd = [sys.executable, "-m", "annotated.cli.translate", "--checkpoint", str(checkpoint[-1])]
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        answers = []
        for line in ["3 4 5", "", "6 7"]:
            proc.stdin.write(line + "\n")
            proc.stdin.flush()
            ready, _, _ = select.select([proc.stdout], [], [], 60)
            assert ready, f"no translation of {line!r} while the input stayed open"
            answers.append(proc.stdout.readline())
        proc.stdin.close()
        assert proc.wait(timeout=60) == 0 and proc.stdout.read() == ""
    finally:
        proc.kill()
    assert answers[1] == "\n" and all(a.endswith("\n") for a in answers)
    whole = cli("--checkpoint", checkpoint[-1], stdin=b"3 4 5\n\n6 7\n")
    assert "".join(answers) == whole.stdout.decode()  # the same translations, read at once


def test_files_in_and_out_and_an_nbest_list(checkpoint, tmp_path):
    from annotated.evaluation.translation import translate

    lines = [" ".join(str(3 + (i * 7 + j) % 10) for j in range(1 + i % 6)) for i in range(150)]
    source = tmp_path / "in.txt"
    source.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out.txt"
    r = cli("--checkpoint", checkpoint[-1], "--input", source, "--output", out, "--batch-size", 16)
    assert r.returncode == 0 and r.stdout == b"", r.stderr.decode()
    model, tokenizer, _ = load_model([checkpoint[-1]])
    expected = translate(model, tokenizer, lines, batch_size=16)  # the function, all at once
    assert out.read_text().splitlines() == expected
    assert cli("--checkpoint", checkpoint[-1], stdin=source.read_bytes()).stdout.decode() == (
        out.read_text()
    )
    r = cli("--checkpoint", checkpoint[-1], "--nbest", 3, stdin=b"3 4 5\n\n6 7\n")
    rows = [row.split("\t") for row in r.stdout.decode().splitlines()]
    assert [row[0] for row in rows] == ["1", "1", "1", "2", "3", "3", "3"], rows
    first = [float(row[1]) for row in rows[:3]]
    assert first == sorted(first, reverse=True) and rows[3][1:] == ["0.0000", ""]
    best = cli("--checkpoint", checkpoint[-1], stdin=b"3 4 5\n").stdout.decode().strip()
    assert rows[0][2] == best  # the first of the list is the translation


@pytest.mark.parametrize(
    "flags, said",
    [
        (("--nbest", "5"), "--nbest 5: a beam of 4 holds 1 to 4"),
        (("--device", "toaster"), "--device toaster: not a device name"),
        (("--device", "cuda:7"), "--device cuda:7: this machine has no such device"),
        (("--input", "/no/such/file"), "--input /no/such/file: no such file"),
        (("--output", "{tmp}/a-file/out.txt"), "is a file, not a folder"),
        (("--output", "{tmp}"), "is a folder; give the file to write"),
        (("--input", "{tmp}"), "is a folder; give the file of sentences"),
        (("--input", "{tmp}/a-file", "--output", "{tmp}/../{name}/a-file"), "is the --input file"),
    ],
)
def test_bad_files_devices_and_lists_are_refused(checkpoint, tmp_path, flags, said):
    (tmp_path / "a-file").write_text("a file where a folder should be")
    given = [f.format(tmp=tmp_path, name=tmp_path.name) for f in flags]
    message = refused("--checkpoint", checkpoint[-1], *given, command="translate")
    assert said in message, message
    assert (tmp_path / "a-file").read_text() == "a file where a folder should be"  # kept


def test_a_reader_that_stops_reading_ends_translate_as_it_ends_any_writer(checkpoint):
    """`... | translate | head -1`: from a pipe, translations come in chunks of at most 1,000
    lines, so the first arrive soon even when the input never ends; when the reader goes away,
    translate ends with 141 (128 + SIGPIPE), as `yes` does, and no error message."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "annotated.cli.translate", "--checkpoint", str(checkpoint[-1]),
         "--beam", "1", "--device", "cpu"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    proc.stdin.write(b"3 4\n" * 2_500)  # more than one chunk, and the pipe stays open
    proc.stdin.flush()
    assert select.select([proc.stdout], [], [], 240)[0], "no translation came"
    proc.stdout.readline()
    proc.stdout.close()  # the reader leaves
    try:
        err = proc.communicate(timeout=240)[1].decode()
    finally:
        proc.kill()
    assert proc.returncode == 141 and "error" not in err and "Traceback" not in err, err[-2000:]


def test_translate_streams_without_select_as_on_windows(checkpoint):
    """The streaming reader needs no `select` (Windows has none for pipes): with the module made
    unavailable, a pipe's lines are translated as with it, and --threads is honoured."""
    script = (  # torch needs `select` to import; translate, once imported, may not use it
        "import sys, select\n"
        "from annotated.cli import translate\n"
        "from annotated.cli.translate import main\n"
        "import torch\n"
        "assert 'select' not in vars(translate)\n"
        "for name in ('select', 'poll', 'epoll', 'devpoll', 'kqueue'):\n"
        "    if hasattr(select, name): delattr(select, name)\n"
        "code = main(sys.argv[1:])\n"
        "print(torch.get_num_threads(), file=sys.stderr)\n"
        "sys.exit(code)\n"
    )
    lines = b"3 4 5\n\n6 7\n4 4"  # the last line without its newline
    done = subprocess.run(
        [sys.executable, "-c", script, "--checkpoint", str(checkpoint[-1]), "--threads", "1"],
        input=lines,
        capture_output=True,
    )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert done.stderr.decode().split()[-1] == "1"
    whole = cli("--checkpoint", checkpoint[-1], stdin=lines)
    assert done.stdout == whole.stdout and len(done.stdout.splitlines()) == 4


@pytest.mark.parametrize("threads", ["0", "-2", "x"])
def test_threads_below_one_or_not_a_number_are_refused(checkpoint, threads):
    done = cli("--checkpoint", checkpoint[-1], "--threads", threads)
    assert done.returncode == 2 and b"--threads" in done.stderr


def test_an_output_that_is_a_device_or_a_link_is_written_through(checkpoint, tmp_path):
    """--output /dev/null stays the device; --output LINK writes the file the link points to and
    leaves the link a link (a rename would have replaced either with a regular file)."""
    import os
    import stat
    from pathlib import Path

    device = Path("/dev/null")
    if os.geteuid() == 0:  # root could replace /dev/null itself: a null device of the test's own
        device = tmp_path / "null"
        os.mknod(device, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    r = cli("--checkpoint", checkpoint[-1], "--output", device, stdin=b"3 4\n5 6\n")
    assert r.returncode == 0, r.stderr.decode()
    assert stat.S_ISCHR(os.stat(device).st_mode)  # still the device, not a file of translations
    target, link = tmp_path / "target.txt", tmp_path / "link.txt"
    target.write_text("old")
    link.symlink_to(target)
    r = cli("--checkpoint", checkpoint[-1], "--output", link, stdin=b"3 4\n5 6\n")
    assert r.returncode == 0, r.stderr.decode()
    assert link.is_symlink() and len(target.read_text().splitlines()) == 2
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


TRANSLATE_MODULES = 18  # what translating needs: see chapter 20's "A model to translate with"


@pytest.mark.parametrize("task", ["copy", "multi30k", "wmt14"])
def test_translating_imports_only_what_it_needs(checkpoint, tmp_path, task):
    """The translate command, after reading a checkpoint of the copy task, Multi30k or WMT14,
    has imported at most TRANSLATE_MODULES of the package's modules, and neither the training
    configuration nor the registry nor any task or data pipeline."""
    from annotated.data.multi30k_corpus import load_multi30k
    from annotated.data.tokenizer import tokenizer_bytes, train_tokenizer
    from annotated.model import make_model

    path, line = checkpoint[-1], "3 4"
    if task != "copy":
        state = torch.load(checkpoint[-1], weights_only=True)
        tokenizer = train_tokenizer(load_multi30k("val")[:300], tmp_path / "bpe", 120)
        model = make_model(120, 120, **state["config"]["model"])
        data = {"vocab": 120} if task == "multi30k" else {"pair": "en-de", "scale": "sample"}
        state["config"] |= {"task": task, "data": data}
        state |= {"model": model.state_dict(), "tokenizer": tokenizer.fingerprint}
        state["tokenizer_model"] = tokenizer_bytes(tokenizer)
        path, line = tmp_path / f"{task}.pt", "A dog runs."
        torch.save(state, path)
    probe = (
        "import runpy, sys\n"
        f"sys.argv = ['translate', '--checkpoint', {str(path)!r}]\n"
        "try:\n    runpy.run_module('annotated.cli.translate', run_name='__main__')\n"
        "except SystemExit as e:\n    assert not e.code, e.code\n"
        "mine = (m for m, v in sys.modules.items() if not hasattr(v, '__path__'))\n"
        "print(sorted(m for m in mine if m.startswith('annotated.')), file=sys.stderr)"
    )
    done = subprocess.run([sys.executable, "-c", probe], input=line + "\n", capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0 and len(done.stdout.splitlines()) == 1, done.stderr[-2000:]
    loaded = eval(done.stderr.strip().splitlines()[-1])
    assert len(loaded) <= TRANSLATE_MODULES, loaded
    heavy = [m for m in loaded if m.startswith(("annotated.training.", "annotated.data."))]
    assert heavy == ["annotated.data.tokenizer"], heavy


@pytest.mark.parametrize(
    "damage, says",
    [
        ({"config": "multi30k"}, "holds config of the wrong kind"),
        ({"config": {"model": {"d_model": "16"}}}, "wrong kind (d_model='16')"),
        ({"config": {"model": {"N": 1.5, "norm_first": 0}}}, "wrong kind (N=1.5, norm_first=0)"),
        ({"config": {"model": {"newer": 1}}}, "does not know (newer=1)"),
        ({"tokenizer": 5}, "holds tokenizer of the wrong kind"),
        ({"tokenizer_model": 5}, "carries a damaged tokenizer"),
    ],
)
def test_a_checkpoint_whose_record_has_the_wrong_kinds_is_refused_by_translate(
    checkpoint, tmp_path, damage, says
):
    """Every field translate reads from a checkpoint, given a value of the wrong kind: one
    paragraph naming it, exit 2, no traceback."""
    state = torch.load(checkpoint[-1], weights_only=True)
    for key, value in damage.items():
        state[key] = {**state[key], **value} if isinstance(value, dict) else value
    bad = tmp_path / "damaged.pt"
    torch.save(state, bad)
    assert says in refused("--checkpoint", bad, command="translate")
