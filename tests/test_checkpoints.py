"""One owner of checkpoints (chapter 19): their names, their one reader, run identity; and the
one tokenizer check (chapter 23) that every pairing of ids with a tokenizer goes through."""

import sys
from pathlib import Path

import pytest
import torch

from annotated.checkpoints import (
    CHECKPOINT_NAME,
    average_checkpoints,
    check_same_run,
    checkpoint_name,
    checkpoint_paths,
    checkpoint_step,
    identity_differences,
    load_checkpoint,
)
from annotated.cli import translate as translate_cli
from annotated.data.tokenizer import TokenizerMismatch, check_fingerprint
from annotated.errors import DataError, TrainingError
from annotated.training.registry import build_config
from annotated.training.run_folder import run_identity
from annotated.training.saving import save_checkpoint
from annotated.training.trainer import train

TINY = ["model.N=1", "model.d_model=16", "model.d_ff=32", "model.h=2", "data.batch_sentences=8"]


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory) -> tuple[Path, Path]:
    """Two tiny copy-task runs, alike but for their seed, with checkpoints at steps 1 and 2."""
    runs = tmp_path_factory.mktemp("runs")
    for seed in (0, 1):
        cfg = build_config("copy", [*TINY, "max_steps=2", "checkpoint_every=1", f"seed={seed}"])
        train(cfg, runs / f"seed{seed}", progress=False, command="test")
    return runs / "seed0", runs / "seed1"


def test_checkpoint_names_round_trip(tmp_path):
    for step in (0, 1, 7, 300_000, 99_999_999):
        name = checkpoint_name(step)
        assert CHECKPOINT_NAME.fullmatch(name) and checkpoint_step(Path(name)) == step
    assert checkpoint_name(7) == "ckpt_00000007.pt"
    written = save_checkpoint(tmp_path, {"step": 42, "model": {}}, keep_last=2)
    assert written == tmp_path / "checkpoints" / checkpoint_name(42)
    assert [checkpoint_step(p) for p in checkpoint_paths(tmp_path)] == [42]


def test_a_damaged_checkpoint_gets_one_message_from_every_reader(two_runs, tmp_path):
    folder = tmp_path / "run" / "checkpoints"
    folder.mkdir(parents=True)
    for path in checkpoint_paths(two_runs[0]):
        (folder / path.name).write_bytes(path.read_bytes())
    newest = folder / checkpoint_name(2)
    newest.write_bytes(newest.read_bytes()[:100])
    with pytest.raises(TrainingError) as read:
        load_checkpoint(newest)
    with pytest.raises(TrainingError) as averaged:
        average_checkpoints([folder / checkpoint_name(1), newest])
    assert str(read.value) == str(averaged.value)
    assert str(read.value).startswith(f"checkpoint {newest} cannot be read: ")
    assert str(read.value) == (
        f"checkpoint {newest} cannot be read: it is cut short or damaged, as an interrupted copy "
        f"or save leaves a file; move it aside: the newest other checkpoint of its run, "
        f"ckpt_00000001.pt, is the one --resume and averaging then use."
    )
    for damage, said in [
        (b"", "it is empty, as a copy or a save that never finished leaves a file"),
        (bytes(range(256)) * 4, "it is not a PyTorch checkpoint"),
    ]:
        newest.write_bytes(damage)
        with pytest.raises(TrainingError, match=said):
            load_checkpoint(newest)
    with pytest.raises(TrainingError) as folder_given:
        load_checkpoint(folder)
    assert str(folder_given.value).endswith(
        "it is a folder, not a checkpoint file; name a checkpoint file in it, such as "
        "ckpt_00000002.pt."
    )


def test_averaging_refuses_a_checkpoint_of_another_run(two_runs, monkeypatch, capsys):
    mine, theirs = (checkpoint_paths(run)[-1] for run in two_runs)
    with pytest.raises(TrainingError) as refused:
        average_checkpoints([mine, theirs])
    assert str(refused.value) == (
        f"{theirs} was written by another run than {mine}: its seed is 1, not 0. Average only "
        f"checkpoints of one run."
    )
    average_checkpoints(checkpoint_paths(two_runs[0]))  # one run: averaged
    monkeypatch.setattr(sys, "stdin", open("/dev/null"))
    assert translate_cli.main(["--checkpoint", str(mine), str(theirs)]) == 2  # an expected error
    assert "was written by another run than" in capsys.readouterr().err


def test_run_identity_is_task_data_model_seed_and_the_tokenizer_where_recorded(two_runs):
    state = load_checkpoint(checkpoint_paths(two_runs[0])[-1])
    recorded = run_identity(state["config"], state["tokenizer"])
    assert set(recorded) == {"task", "data", "model", "seed", "tokenizer"}
    longer = build_config("copy", [*TINY, "max_steps=500", "checkpoint_every=7"])
    assert identity_differences(recorded, run_identity(longer)) == []  # not its length: resumable
    wider = run_identity(build_config("copy", [*TINY, "model.d_ff=64", "seed=3"]), "ids-99")
    assert identity_differences(recorded, wider) == [
        "model.d_ff is 32, not 64",
        "seed is 0, not 3",
        f"tokenizer is {state['tokenizer']}, not ids-99",
    ]
    with pytest.raises(TrainingError, match=r"^x\.pt was written by another run than y: its "):
        check_same_run(recorded, wider, what="x.pt", than="y", fix="Fix it.")
    check_same_run(recorded, run_identity(longer), what="x.pt", than="y", fix="")  # the same run


def test_the_tokenizer_check_has_one_error_and_one_wording():
    check_fingerprint("ids-13", "ids-13", what="unused", fix="unused")  # equal: nothing to say
    with pytest.raises(TokenizerMismatch) as err:
        check_fingerprint("ids-13", "ids-99", what="ckpt.pt was trained", fix="Use ids-13.")
    assert isinstance(err.value, DataError) and isinstance(err.value, TrainingError)
    assert str(err.value) == (
        "ckpt.pt was trained with tokenizer ids-13, but the tokenizer in use is ids-99: the same "
        "ids would mean other words. Use ids-13."
    )


def test_averaging_still_reads_plain_state_dicts(tmp_path):
    weights = {"w": torch.ones(2)}
    torch.save(weights, tmp_path / "plain.pt")
    torch.save({"model": {"w": torch.zeros(2)}, "step": 3}, tmp_path / "wrapped.pt")
    avg = average_checkpoints([tmp_path / "plain.pt", tmp_path / "wrapped.pt"])
    torch.testing.assert_close(avg["w"], torch.full((2,), 0.5))


def test_a_pipe_or_a_device_named_as_a_checkpoint_is_refused_at_once(tmp_path):
    """A checkpoint is a file: a FIFO would make torch.load wait for a writer forever, so every
    reader (translate here) refuses a pipe or a device before reading it, exit 2, in seconds."""
    import os
    import subprocess

    fifo = tmp_path / "ckpt.pt"
    os.mkfifo(fifo)
    for path in (fifo, Path("/dev/zero")):
        with pytest.raises(TrainingError, match="is not a file but a pipe or a device"):
            load_checkpoint(path)
    command = [sys.executable, "-m", "annotated.cli.translate", "--checkpoint", str(fifo)]
    done = subprocess.run(command, input="3 4\n", capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "pipe or a device" in done.stderr, done.stderr[-2000:]
    assert "Traceback" not in done.stderr


def test_every_reader_refuses_a_checkpoint_whose_fields_have_the_wrong_kind(tmp_path):
    """Each field of a real checkpoint, and each setting and part of its recorded configuration,
    replaced by a value of another kind: loading it for translation and resuming from it both end
    in a message (before, a part turned into text or a number raised a TypeError inside PyTorch)."""
    from annotated.errors import ExpectedError, fits
    from annotated.evaluation.translation import load_model

    tiny = ["model.N=1", "model.d_model=16", "model.d_ff=16", "model.h=2", "log_every=1",
            "data.batch_sentences=4", "checkpoint_every=1"]  # fmt: skip
    train(build_config("copy", [*tiny, "max_steps=1"]), tmp_path / "run", progress=False)
    path = checkpoint_paths(tmp_path / "run")[-1]
    state = torch.load(path, weights_only=True)
    fields = [(state, k) for k in state] + [(state["config"], k) for k in state["config"]]
    reads = 0
    for holder, key in fields:
        for wrong in ["text", 3, None, [1, 2], 1.5]:
            if fits(wrong, holder[key]):
                continue  # a value of the right kind: the edge tests try those
            saved = holder[key]
            holder[key] = wrong
            run = tmp_path / f"resume{reads}"
            (run / "checkpoints").mkdir(parents=True)
            (run / "run.json").write_bytes((tmp_path / "run" / "run.json").read_bytes())
            torch.save(state, run / "checkpoints" / path.name)
            holder[key] = saved
            for reader in ("translate", "resume"):
                if reader == "resume" and key == "tokenizer_model":
                    continue  # the trainer rebuilds its tokenizer; it checks the fingerprint
                reads += 1
                with pytest.raises(ExpectedError):
                    if reader == "translate":
                        load_model([run / "checkpoints" / path.name])
                    else:
                        cfg = build_config("copy", [*tiny, "max_steps=2"])
                        train(cfg, run, resume=True, progress=False)
    # one level deeper: each key of the optimiser's, the schedule's, the generators' and the
    # precision's state removed in turn resumes (a key the trainer rebuilds) or is a message
    # naming the file; before, four of them were a KeyError inside PyTorch
    parts = [(part, key) for part in ("optimizer", "scheduler", "rng", "precision")
             for key in state[part]]  # fmt: skip
    refused = set()
    for part, key in parts:
        run = tmp_path / f"inner-{part}-{key}"
        (run / "checkpoints").mkdir(parents=True)
        (run / "run.json").write_bytes((tmp_path / "run" / "run.json").read_bytes())
        saved = state[part].pop(key)
        torch.save(state, run / "checkpoints" / path.name)
        state[part][key] = saved
        try:
            train(build_config("copy", [*tiny, "max_steps=2"]), run, resume=True, progress=False)
        except ExpectedError as e:
            assert "cannot be resumed" in str(e) and str(path.name) in str(e), e
            refused.add(f"{part}.{key}")
    reads += len(parts)
    print(f"{len(fields) + len(parts)} fields of a checkpoint and its record walked: "
          f"{reads} reads refused or resumed")  # fmt: skip
    four = {"optimizer.param_groups", "scheduler.lr_lambdas", "rng.torch", "precision.name"}
    assert four <= refused, refused
    assert len(fields) > 20 and len(parts) >= 8 and reads > 150


def test_a_record_asking_for_a_billion_layers_is_refused_before_any_is_built(two_runs, tmp_path):
    """`translate` on a checkpoint whose record was edited to model.N=10**9 built layers for
    minutes (until the machine gave out); the weights' own layers are counted first."""
    import time

    from annotated.evaluation.translation import read_model

    state = torch.load(checkpoint_paths(two_runs[0])[-1], weights_only=True)
    state["config"]["model"]["N"] = 2_000  # enough to tell; 10**9 would hang an unfixed reader
    edited = tmp_path / "ckpt_00000002.pt"
    torch.save(state, edited)
    start = time.perf_counter()
    with pytest.raises(TrainingError, match="holds 1 encoder layers, but its record says model.N"):
        read_model(edited)
    assert time.perf_counter() - start < 10
    assert read_model(checkpoint_paths(two_runs[0])[-1])[0] is not None  # the unedited one reads
