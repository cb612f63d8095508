"""Configurations in files (chapter 18): `--print-config` writes one, `--config FILE` reads it back
to the same run, and a file with a mistake is refused with its name."""

import json
import subprocess
import sys

import pytest

from annotated.errors import ConfigError
from annotated.training.config_files import config_text
from annotated.training.registry import build_config
from annotated.training.run_folder import read_metrics

from helpers import TINY, final_weights, refused, run_here, run_trainer, sets

STEPS = sets("max_steps=30", "log_every=1", "checkpoint_every=0")


def printed(*args: str) -> str:
    r = run_here("train", *args, "--print-config")
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


def test_a_printed_configuration_fed_back_trains_the_same_run(tmp_path):
    text = printed("--config", "copy", *TINY, *STEPS, "--set", "optim.warmup=20")
    assert json.loads(text)["model"]["d_model"] == 16  # TINY's width, resolved
    config = tmp_path / "mine.json"
    config.write_text(text)
    run_trainer("--config", "copy", *TINY, *STEPS, "--set", "optim.warmup=20", "--out",
                str(tmp_path / "named"))  # fmt: skip
    run_trainer("--config", str(config), "--out", str(tmp_path / "from-file"))
    named = read_metrics(tmp_path / "named" / "metrics.jsonl")[0]
    again = read_metrics(tmp_path / "from-file" / "metrics.jsonl")[0]
    assert [r["loss"] for r in named] == [r["loss"] for r in again] and len(named) == 30
    a, b = final_weights(tmp_path / "named"), final_weights(tmp_path / "from-file")
    assert all((a[k] == b[k]).all() for k in a)
    # the run's own run.json is a configuration too: the same run again
    recorded = tmp_path / "named" / "run.json"
    assert build_config(str(recorded)) == build_config(str(config))


def test_yaml_round_trip_and_overrides_after_the_file(tmp_path):
    cfg = build_config("multi30k-cpu", ["model.N=2", "optim.lr_factor=0.5"])
    path = tmp_path / "mine.yaml"
    path.write_text(config_text(cfg, yaml_format=True))
    assert "lr_factor: 0.5" in path.read_text()
    assert build_config(str(path)) == cfg
    assert build_config(str(path), ["seed=7"]).seed == 7  # --set still applies on top
    yaml_again = printed("--config", str(path))
    assert yaml_again == path.read_text()  # a YAML file is printed back as YAML
    as_json = printed("--config", str(path), "--format", "json")  # unless asked otherwise
    assert json.loads(as_json)["optim"]["lr_factor"] == 0.5
    as_yaml = printed("--config", "multi30k-cpu", "--set", "model.N=2", "--set",
                      "optim.lr_factor=0.5", "--format", "yaml")  # fmt: skip
    assert as_yaml == path.read_text()
    alone = subprocess.run([sys.executable, "-m", "annotated.cli.train", "--config", "copy",
                            "--format", "yaml"], capture_output=True, text=True)  # fmt: skip
    assert alone.returncode == 2 and "--print-config" in alone.stderr


def test_a_hand_written_yaml_file_may_write_numbers_as_people_do(tmp_path):
    """PyYAML reads YAML 1.1, where 1e-9 without a dot is text: a float setting takes it."""
    path = tmp_path / "mine.yaml"
    path.write_text("task: copy\noptim:\n  adam_eps: 1e-9\n  lr_factor: 2\n  warmup: 10\n")
    cfg = build_config(str(path))
    assert cfg.optim.adam_eps == 1e-9 and cfg.optim.lr_factor == 2.0 and cfg.optim.warmup == 10
    path.write_text("task: copy\noptim:\n  adam_eps: tiny\n")
    with pytest.raises(
        ConfigError, match="adam_eps=tiny: optim.adam_eps expects a value of type float"
    ):
        build_config(str(path))


@pytest.mark.parametrize(
    "content, said",
    [
        ('{"task": "copy", "model": {"layers": 2}}', "model.layers: unknown key"),
        (
            '{"task": "copy", "model": {"N": "six"}}',
            "N=six: model.N expects a value of type int",
        ),
        ('{"task": "copy", "fast": 1}', "fast=1: fast expects a value of type bool"),
        ('{"task": "copy", "modle": {}}', "modle: unknown key"),
        ('{"model": {"N": 2}}', "no task"),
        ('{"task": "copy", "model": {"N": 2},}', "cannot be read"),
        ("[1, 2]", "holds no configuration"),
        ('{"task": "no_such_task"}', "no_such_task"),
    ],
)
def test_a_file_with_a_mistake_is_refused_with_its_name(tmp_path, content, said):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ConfigError) as caught:
        build_config(str(path))
    assert said in str(caught.value), str(caught.value)
    assert said in refused("--config", path, "--out", tmp_path / "run")  # the command's words
    assert not (tmp_path / "run").exists()  # nothing was trained


def test_a_missing_file_and_bad_yaml_are_messages(tmp_path):
    said = refused("--config", tmp_path / "none.yaml", "--out", tmp_path / "r")
    assert "cannot be read" in said and "none.yaml" in said
    (tmp_path / "bad.yaml").write_text("task: copy\nmodel: [unclosed\n")
    with pytest.raises(ConfigError, match="is not valid YAML"):
        build_config(str(tmp_path / "bad.yaml"))


BILLION_LAUGHS = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{n}: &{n} [{', '.join(['*' + p] * 9)}]\n" for p, n in zip("abcdefgh", "bcdefghi")
)


@pytest.mark.parametrize(
    "text, said",
    [
        ("task: copy\nseed: &s 1\nmax_steps: *s\n", "alias"),  # any alias
        ("task: copy\nmodel: &m\n  N: 1\n  again: *m\n", "alias"),  # one that refers to itself
        (
            "task: copy\nseed:\n"
            + "".join("  " + line for line in BILLION_LAUGHS.splitlines(True)),
            "alias",
        ),  # fmt: skip
        ("task: copy\nmax_steps: 010\n", "octal"),  # YAML 1.1 would read 8
        ("task: copy\nmax_steps: 1:20\n", "line 2, column 12: .* base 60"),  # it would read 80
        ("task: copy\noptim:\n  lr_factor: 1:30.5\n", "base 60"),  # and 90.5
        ("task: copy\nseed: " + "[" * 5000 + "]" * 5000 + "\n", "nest"),
        ("task: copy\nseed: 1\nseed: 2\n", "mine.yaml: seed is given twice"),  # the last won
        ("task: copy\nmodel: {N: 1, N: 2}\n", "mine.yaml: N is given twice"),
    ],
)
def test_a_configuration_file_cannot_hang_or_crash_a_command(tmp_path, text, said):
    """Aliases, which can expand a small file past any bound or refer to themselves, are refused;
    a number with a leading zero is not read as octal, nor one with colons in base 60; nesting
    past Python's recursion is a message. Each in well under a second, on one line, with no
    traceback."""
    import time

    path = tmp_path / "mine.yaml"
    path.write_text(text)
    start = time.perf_counter()
    with pytest.raises(ConfigError, match=said) as refused:
        build_config(str(path))
    assert time.perf_counter() - start < 5
    assert "\n" not in str(refused.value), str(refused.value)  # one paragraph, where in the file


def test_a_json_key_given_twice_is_refused_not_read_as_the_last(tmp_path):
    path = tmp_path / "mine.json"
    path.write_text('{"task": "copy", "optim": {"warmup": 10, "warmup": 20}}')
    with pytest.raises(ConfigError, match="mine.json: warmup is given twice"):
        build_config(str(path))


def test_a_fifo_a_folder_or_a_huge_file_is_refused_before_it_is_read(tmp_path):
    import os

    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)  # reading it would wait for a writer forever
    with pytest.raises(ConfigError, match="not a file"):
        build_config(str(fifo))
    folder = tmp_path / "folder.json"
    folder.mkdir()
    with pytest.raises(ConfigError, match="a folder"):
        build_config(str(folder))
    huge = tmp_path / "huge.json"
    huge.write_text('{"task": "copy", "x": "' + "y" * (1 << 20) + '"}')
    with pytest.raises(ConfigError, match="more than any"):
        build_config(str(huge))
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ConfigError, match="too deeply|nests"):
        build_config(str(deep))


def test_the_command_line_ends_a_fifo_config_with_a_message(tmp_path):
    import os

    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    r = subprocess.run([sys.executable, "-m", "annotated.cli.train", "--config", str(fifo),
                        "--out", str(tmp_path / "run")], capture_output=True, text=True,
                       timeout=120)  # fmt: skip
    assert r.returncode == 2 and "not a file" in r.stderr and "Traceback" not in r.stderr
