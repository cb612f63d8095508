"""`python -m annotated.cli.translate`: model rebuilt from the checkpoint, bad checkpoints and
inputs."""

import subprocess
import sys

import pytest
import torch

from annotated.errors import TrainingError
from annotated.evaluation.translation import load_model
from annotated.training.registry import build_config
from annotated.training.tasks.copy import IdTokenizer
from annotated.training.trainer import train


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
    state = torch.load(checkpoint[-1], weights_only=True)
    assert state["tokenizer"] == IdTokenizer(13).fingerprint  # written by the trainer
    state["tokenizer"] = "ids-99"  # as if trained on other ids
    bad = tmp_path / "other_tokenizer.pt"
    torch.save(state, bad)
    with pytest.raises(
        TrainingError, match="trained with tokenizer ids-99, but the tokenizer in use is ids-13"
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
    "flags", [("--batch-size", "0"), ("--alpha", "nan"), ("--alpha", "-1"), ("--beam", "0")]
)
def test_meaningless_search_settings_are_refused(checkpoint, flags):
    r = cli("--checkpoint", checkpoint[-1], *flags)
    message = r.stderr.decode()
    assert r.returncode == 2 and "error:" in message and "Traceback" not in message, message


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
    assert "interrupted: no translation was written" in capsys.readouterr().err
