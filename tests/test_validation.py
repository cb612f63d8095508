"""Validation while training (chapter 21): the dev loss and BLEU logged at a checkpoint on an
interval of their own, the best checkpoint kept and used, early stopping by either measure, and
a resumed run that stays exact."""

import json

import pytest
import torch

from annotated.cli import prepare
from annotated.evaluation.runs import evaluate_run
from annotated.training.run_folder import read_metrics

from helpers import final_weights, refused, run_here, run_trainer, sets

TINY = sets("model.N=1", "model.d_model=32", "model.d_ff=64", "model.h=2", "log_every=5")
STEPS = sets("checkpoint_every=10", "valid_sentences=40", "valid_every=0")  # every checkpoint


def corpus(root, pairs):
    for side, lang in enumerate(("en", "de")):
        (root / f"{pairs}.{lang}").write_text("".join(p[side] + "\n" for p in PAIRS[pairs]))
    return [str(root / f"{pairs}.{lang}") for lang in ("en", "de")]


PAIRS = {
    "train": [(f"a dog number {i} runs", f"ein Hund Nummer {i} rennt") for i in range(300)]
    + [(f"a cat number {i} sleeps", f"eine Katze Nummer {i} schläft") for i in range(300)],
    "valid": [(f"a dog number {i} sleeps", f"ein Hund Nummer {i} schläft") for i in range(60)],
}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("valid")
    train, valid = corpus(root, "train"), corpus(root, "valid")
    args = ["--src", train[0], "--tgt", train[1], "--valid", ",".join(valid)]
    assert prepare.main([*args, "--out", str(root / "data"), "--vocab", "120"]) == 0
    assert prepare.main([*args[:4], "--out", str(root / "no-valid"), "--vocab", "120"]) == 0
    return root


def train(data, out, *more, check=True):
    return run_trainer("--config", "parallel", *sets(f"data.path={data / 'data'}"), *TINY,
                       *more, "--out", str(out), check=check)  # fmt: skip


def test_each_checkpoint_is_validated_and_the_best_is_kept_and_used(data, tmp_path):
    out = tmp_path / "run"
    frozen = sets("optim.lr_factor=1e-9", "keep_last=1", "max_steps=30")  # the same BLEU each time
    train(data, out, *STEPS, *frozen)
    records = read_metrics(out / "metrics.jsonl")[0]
    dev = [r for r in records if "dev_bleu" in r]
    assert [r["step"] for r in dev] == [10, 20, 30], dev
    assert all(r["dev_sentences"] == 40 and r["dev_loss"] > 0 for r in dev)
    assert len({r["dev_bleu"] for r in dev}) == 1  # a model that does not change
    best = json.loads((out / "best.json").read_text())
    assert best["step"] == 10 and best["checkpoint"] == "ckpt_00000010.pt"  # ties do not replace
    kept = sorted(p.name for p in (out / "checkpoints").glob("ckpt_*.pt"))
    assert kept == ["ckpt_00000010.pt", "ckpt_00000030.pt"]  # keep_last=1, and the best
    evaluate = ["--run", out, "--best"]
    results = tmp_path / "results"  # the metrics log ends with a validation's record
    scored = [
        *evaluate,
        "--limit",
        "5",
        "--results",
        str(results),
        "--plot",
        str(tmp_path / "p.png"),
    ]
    r = run_here("evaluate", *scored)
    assert r.returncode == 0 and "valid (5 of 60 sentences)" in r.stdout, r.stderr[-2000:]
    written = json.loads((results / "results.json").read_text())["training"]
    assert written["steps"] == 30 and written["seconds"] > 0 and (tmp_path / "p.png").is_file()
    again = run_here("evaluate", *scored)  # the same run
    assert again.returncode == 0, again.stderr[-2000:]
    assert evaluate_run(out, best=True, limit=5)["checkpoints"] == ["ckpt_00000010.pt"]
    r = run_here("evaluate", *evaluate, "--last", "2")
    assert r.returncode == 2 and "give one of them" in r.stderr


def test_patience_stops_the_run_when_the_dev_bleu_stalls(data, tmp_path):
    out = tmp_path / "run"
    frozen = sets("optim.lr_factor=1e-9", "max_steps=100", "patience=2")
    r = train(data, out, *STEPS, *frozen)
    steps = [r["step"] for r in read_metrics(out / "metrics.jsonl")[0] if "dev_bleu" in r]
    assert steps == [10, 20, 30], steps  # the best at 10, then two without a better one
    assert sorted(p.name for p in (out / "checkpoints").glob("ckpt_*.pt"))[-1] == "ckpt_00000030.pt"
    said = (
        "(stopped early: the dev BLEU has not improved by more than 0 for 2 validations; the best"
    )
    assert said in r.stdout and "at step 10, is in best.json)" in r.stdout, r.stdout
    assert "done: step 30/100" in r.stdout and "s validating" in r.stdout


def test_validation_changes_no_weight_and_a_resumed_run_stays_exact(data, tmp_path):
    # fp32 named: precision=auto times both formats on the first batch, which a busy machine
    # can tip either way from one run to the next; this test is about validation alone
    args = sets("max_steps=40", "precision=fp32")
    train(data, tmp_path / "plain", *args, *sets("checkpoint_every=10"))
    train(data, tmp_path / "validated", *args, *STEPS)
    train(data, tmp_path / "resumed", *STEPS, *sets("max_steps=20", "precision=fp32"))
    train(data, tmp_path / "resumed", *args, *STEPS, "--resume")
    plain, validated = final_weights(tmp_path / "plain"), final_weights(tmp_path / "validated")
    resumed = final_weights(tmp_path / "resumed")
    assert all(torch.equal(plain[k], validated[k]) for k in plain)
    assert all(torch.equal(plain[k], resumed[k]) for k in plain)
    dev = [
        [
            {k: v for k, v in r.items() if k != "dev_s"}
            for r in read_metrics(f)[0]
            if "dev_bleu" in r
        ]
        for f in (tmp_path / "validated" / "metrics.jsonl", tmp_path / "resumed" / "metrics.jsonl")
    ]
    assert dev[0] == dev[1] and len(dev[0]) == 4


def test_a_task_or_folder_without_a_validation_set_is_a_message(data, tmp_path):
    said = refused("--config", "copy", *sets("valid_sentences=10", "max_steps=5"), "--out",
                   tmp_path / "copy")  # fmt: skip
    assert "the copy task has no validation set" in said, said
    r = run_trainer("--config", "parallel", *sets(f"data.path={data / 'no-valid'}"), *TINY,
                    *STEPS, *sets("max_steps=10"), "--out", str(tmp_path / "own"))  # fmt: skip
    assert "does not validate; prepare it again with --valid SRC,REF" in r.stderr, r.stderr
    assert not (tmp_path / "own" / "best.json").exists()  # it trained, without validating
    run_trainer("--config", "parallel", *sets(f"data.path={data / 'no-valid'}", "max_steps=2"),
                *TINY, "--out", str(tmp_path / "own2"))  # fmt: skip
    r = run_here("evaluate", "--run", tmp_path / "own2")
    assert r.returncode == 2 and "was prepared without --valid or --test" in r.stderr, r.stderr
    assert "patience" in refused("--config", "copy", *sets("patience=3"), "--out", tmp_path / "p")


def test_best_json_names_a_checkpoint_of_its_own_run_or_nothing(tmp_path):
    """best.json naming a checkpoint of another folder (by ../ or an absolute path) is refused,
    even where that file exists: evaluate --best scores this run's checkpoints only."""
    from annotated.errors import TrainingError
    from annotated.training.validation import best_checkpoint

    own, other = tmp_path / "run", tmp_path / "other"
    for folder in (own, other):
        (folder / "checkpoints").mkdir(parents=True)
        (folder / "checkpoints" / "ckpt_00000040.pt").write_bytes(b"x")
    for named in ("../../other/checkpoints/ckpt_00000040.pt",
                  str(other / "checkpoints" / "ckpt_00000040.pt"), 40, None):  # fmt: skip
        (own / "best.json").write_text(json.dumps({"step": 40, "checkpoint": named}))
        with pytest.raises(TrainingError, match="no readable best.json"):
            best_checkpoint(own)
    (own / "best.json").write_text(json.dumps({"step": 40, "checkpoint": "ckpt_00000040.pt"}))
    assert best_checkpoint(own) == own / "checkpoints" / "ckpt_00000040.pt"


def test_a_resumed_run_validates_what_ctrl_c_cut_short_and_rewrites_a_lost_best_json(
    data, tmp_path
):
    """A run stopped while it validated a checkpoint (its record missing from the log) and
    whose best.json was deleted: the resumed run validates that checkpoint first, and writes
    best.json again from the log before anything is pruned."""
    out = tmp_path / "run"
    frozen = sets("optim.lr_factor=1e-9", "keep_last=1", "precision=fp32")  # one BLEU throughout
    train(data, out, *STEPS, *frozen, *sets("max_steps=20"))
    log = out / "metrics.jsonl"
    lines = log.read_text().splitlines(keepends=True)
    cut = [line for line in lines if not ('"dev_bleu"' in line and '"step": 20' in line)]
    assert len(cut) == len(lines) - 1  # the validation of step 20, as if Ctrl-C had stopped it
    log.write_text("".join(cut))
    (out / "best.json").unlink()
    train(data, out, *STEPS, *frozen, *sets("max_steps=30"), "--resume")
    dev = [r["step"] for r in read_metrics(log)[0] if "dev_bleu" in r]
    assert dev == [10, 20, 30], dev
    best = json.loads((out / "best.json").read_text())
    assert best["checkpoint"] == "ckpt_00000010.pt"  # the first of equal scores, kept from pruning
    assert (out / "checkpoints" / "ckpt_00000010.pt").is_file()


def test_validation_has_an_interval_of_its_own_and_a_measure_and_margin_of_choice(data, tmp_path):
    """valid_every: at the first checkpoint that many steps after the last validation; with
    best_metric=dev_loss and a margin, a model that does not change never improves, so patience
    stops it, naming the measure."""
    out = tmp_path / "every"
    frozen = sets("optim.lr_factor=1e-9", "precision=fp32", "checkpoint_every=10")
    train(data, out, *frozen, *sets("valid_sentences=20", "valid_every=25", "max_steps=60"))
    steps = [r["step"] for r in read_metrics(out / "metrics.jsonl")[0] if "dev_bleu" in r]
    assert steps == [30, 60], steps
    settings = sets("valid_sentences=20", "valid_every=0", "best_metric=dev_loss",
                    "min_improvement=0.01", "patience=2", "max_steps=100")  # fmt: skip
    r = train(data, tmp_path / "loss", *frozen, *settings)
    assert "(stopped early: the dev loss has not improved by more than 0.01 for 2" in r.stdout
    assert "done: step 30/100" in r.stdout, r.stdout
    said = refused("--config", "copy", *sets("best_metric=dev_ppl"), "--out", tmp_path / "bad")
    assert "best_metric" in said and "dev_bleu or dev_loss" in said


def test_a_validation_is_shown_and_left_out_of_the_training_time(tmp_path):
    """Progress.paused: the bar names the pause, and its seconds leave the run's training clock
    (so max_minutes and elapsed_s), the tokens-per-second window and tqdm's rate."""
    import time

    from annotated.training.progress import Progress
    from annotated.training.registry import build_config

    log = Progress(tmp_path, build_config("copy"), 0, 0.0, writes=True, bar=True)
    start, window, bar_start = log.start, log.window_start, log.bar.start_t
    with log.paused("validating"):
        assert log.bar.desc.startswith("validating")
        time.sleep(0.3)
    assert log.start - start >= 0.3 and log.window_start - window >= 0.3
    assert log.paused_s >= 0.3 and log.bar.start_t - bar_start >= 0.3 and not log.bar.desc
    log.close()
