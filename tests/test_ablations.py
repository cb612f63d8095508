"""Chapter 15: Table 3's rows as overrides of multi30k-small, trained and scored by one
command. The sweep here runs the `ci` grid for a few steps; the data is the local copy that
ANNOTATED_DATA names (CI's ../shared/data)."""

import json

import pytest

from annotated.experiments.table3 import GRIDS, VARIATIONS
from annotated.training.config import settings_of
from annotated.training.registry import build_config

from helpers import run_here

BASE = "multi30k-small"


def changed(name: str) -> dict:
    """The fields of the configuration that a row changes, with their new values."""
    base, row = settings_of(build_config(BASE)), settings_of(build_config(BASE, VARIATIONS[name]))
    return {k: v for k, v in row.items() if base[k] != v}


def test_each_row_changes_what_its_name_says():
    assert changed("base") == {}
    for name in VARIATIONS:
        if name.startswith("(A)"):
            h = int(name.split("=")[1])
            assert changed(name) == {"model.h": h}  # d_k = d_v = 128 / h: constant compute
        if name.startswith("(B)"):
            assert changed(name) == {"model.d_k": int(name.split("=")[1])}
    # the paper kept d_ff at 2,048 in its wider and narrower rows; the base keeps its 512
    assert changed("(C) d_model=256") == {"model.d_model": 256}
    assert changed("(C) d_model=64") == {"model.d_model": 64}
    assert changed("(D) smoothing=0") == {"loss.label_smoothing": 0.0}
    assert changed("(D) dropout=0.2") == {"model.dropout": 0.2}
    assert changed("(E) learned positions") == {"model.learned_positions": True}
    assert GRIDS["full"] == list(VARIATIONS) and set(GRIDS["ci"]) <= set(VARIATIONS)


def ablate(*args):
    return run_here("ablate", *args)


def test_the_ci_grid_trains_scores_and_resumes(tmp_path):
    options = ["--grid", "ci", "--steps", 3, "--dev-sentences", 5]
    options += ["--runs", tmp_path / "runs", "--results", tmp_path / "results"]
    options += ["--set", "precision=fp32"]
    first = ablate(*options)
    assert first.returncode == 0, first.stderr[-3000:]
    files = sorted((tmp_path / "results").glob("*.json"))
    assert [f.name for f in files] == ["a-h-1.json", "base.json", "d-smoothing-0.json"]
    results = {json.loads(f.read_text())["row"]: json.loads(f.read_text()) for f in files}
    for row, r in results.items():
        assert {"command", "commit", "device", "date", "torch"} <= r.keys()
        assert r["steps"] == 3 and r["dev_sentences"] == 5 and r["perplexity"] > 1
        assert "precision=fp32" in r["overrides"] and r["command"].startswith("python -m")
        assert row in first.stdout
    before = {f.name: f.read_text() for f in files}
    again = ablate(*options)  # every row has its result: nothing is trained or rewritten
    assert again.returncode == 0 and again.stdout == first.stdout
    assert {f.name: f.read_text() for f in files} == before


@pytest.mark.parametrize(
    "args, says",
    [
        (["--steps", 0], "--steps and --dev-sentences must be at least 1"),
        (["--set", "model.h=3"], "model.h"),  # 128 is not divisible by 3 heads
    ],
)
def test_bad_settings_are_refused_with_a_message(tmp_path, args, says):
    r = ablate("--runs", tmp_path / "r", "--results", tmp_path / "s", *args)
    assert r.returncode == 2 and says in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "s").exists()


def test_a_file_given_for_a_folder_is_refused_before_any_row_trains(tmp_path):
    (tmp_path / "notes").write_text("mine")
    for flag in ("--runs", "--results"):
        folders = {"--runs": tmp_path / "r", "--results": tmp_path / "s", flag: tmp_path / "notes"}
        r = ablate(*[x for item in folders.items() for x in item])
        assert r.returncode == 2 and f"{flag} {tmp_path / 'notes'} is a file" in r.stderr
        assert not (tmp_path / "r").exists() and (tmp_path / "notes").read_text() == "mine"


def test_a_row_stopped_half_way_continues_from_its_checkpoint(tmp_path):
    """An interrupted sweep leaves a row's folder with checkpoints and no result; the same
    command then resumes that row instead of refusing its folder."""
    from annotated.experiments.table3 import run_variation
    from annotated.training.trainer import train

    common = ["precision=fp32"]
    first = build_config(BASE, [*common, *VARIATIONS["base"], "max_steps=2"])
    train(first, tmp_path / "runs" / "base", progress=False)  # the row, stopped at step 2
    row = run_variation(
        "base", config=BASE, steps=4, runs=tmp_path / "runs", results=tmp_path / "results",
        sentences=5, common=common,
    )  # fmt: skip
    record = json.loads((tmp_path / "runs" / "base" / "run.json").read_text())
    assert row["steps"] == 4 and record["from_step"] == 2, record
    assert (tmp_path / "results" / "base.json").exists()


def test_the_warmup_grid_reaches_the_peaks_its_names_give():
    """Each warm-up row peaks, at the end of its warm-up, at `times` the peak of the paper's
    schedule for width 128 (warm-up 4,000), with the arrangement and depth its name gives."""
    from annotated.experiments.table3 import ROWS, WARMUP
    from annotated.schedule import rate

    paper_peak = rate(4000, 128)  # lr_factor 1, warm-up 4,000: section 5.3 at this width
    assert GRIDS["warmup"] == list(WARMUP) and set(WARMUP) <= set(ROWS)
    assert len(WARMUP) == len(set(map(tuple, WARMUP.values())))  # no row twice
    for name, overrides in WARMUP.items():
        norm, depth, times, warmup = name.split()
        cfg = build_config(BASE, overrides)
        assert cfg.model.norm_first == (norm == "pre") and f"N={cfg.model.N}" == depth
        assert f"w{cfg.optim.warmup}" == warmup
        peak = rate(cfg.optim.warmup, cfg.model.d_model, cfg.optim.lr_factor, cfg.optim.warmup)
        assert peak == pytest.approx(float(times[1:]) * paper_peak, rel=1e-5)
        before = rate(cfg.optim.warmup - 1, 128, cfg.optim.lr_factor, cfg.optim.warmup)
        after = rate(cfg.optim.warmup + 1, 128, cfg.optim.lr_factor, cfg.optim.warmup)
        assert before < peak and after < peak  # the peak is where the warm-up ends


def test_parts_share_a_grid_between_processes(monkeypatch, tmp_path):
    """--part K/N: N processes train every row of the grid once between them."""
    from annotated.cli import ablate as cli

    trained = []

    def fake_run(name, **options):
        trained.append(name)
        return {"perplexity": 1.0, "bleu": 0.0}

    monkeypatch.setattr(cli, "run_variation", fake_run)
    folders = ["--runs", str(tmp_path / "r"), "--results", str(tmp_path / "s")]
    parts = []
    for k in (1, 2, 3):
        trained.clear()
        assert cli.main(["--grid", "warmup", "--part", f"{k}/3", *folders]) == 0
        parts.append(list(trained))
    assert sorted(sum(parts, [])) == sorted(GRIDS["warmup"])  # each row once
    assert all(abs(len(a) - len(b)) <= 1 for a in parts for b in parts)
    for bad in ("0/2", "3/2", "1/0", "one"):
        r = ablate("--grid", "warmup", "--part", bad, *folders)
        assert r.returncode == 2 and "--part" in r.stderr and "Traceback" not in r.stderr


def test_a_row_that_diverges_is_a_result_not_a_crash(tmp_path):
    """A learning rate a million times too large makes the loss non-finite within a few steps:
    the row is recorded with the step where it diverged, unscored, and not trained again."""
    from annotated.experiments.table3 import run_variation

    options = dict(config=BASE, steps=6, runs=tmp_path / "runs", results=tmp_path / "results")
    common = ["precision=fp32", "optim.lr_factor=1e6", "optim.warmup=1"]
    row = run_variation("base", sentences=3, common=common, **options)
    assert 1 <= row["diverged_at"] <= 6 and row["bleu"] is None and row["perplexity"] is None
    saved = (tmp_path / "results" / "base.json").read_text()
    assert json.loads(saved)["diverged_at"] == row["diverged_at"]
    assert run_variation("base", sentences=3, common=common, **options) == row


def test_a_result_made_with_other_steps_is_refused_not_reported(tmp_path):
    """The same --results folder with another --steps: the row kept there is not passed off as
    the new one; the command says which file holds what, and exits 2, before training."""
    results = tmp_path / "results"
    results.mkdir()
    kept = {"row": "base", "overrides": ["precision=fp32", "max_steps=2"], "dev_sentences": 3}
    (results / "base.json").write_text(json.dumps(kept))
    options = ["--grid", "ci", "--dev-sentences", 3, "--set", "precision=fp32"]
    options += ["--runs", tmp_path / "runs", "--results", results]
    again = ablate(*options, "--steps", 3)
    assert again.returncode == 2 and "Traceback" not in again.stderr, again.stderr[-2000:]
    assert "max_steps=2" in again.stderr and "max_steps=3" in again.stderr
    assert json.loads((results / "base.json").read_text()) == kept
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("content", ["", "{not json", "[1, 2]", "\udcff"])
def test_a_damaged_result_file_is_refused_with_a_message(tmp_path, content):
    """An empty, cut-short or foreign file where a row's result should be: one paragraph that
    names it, exit 2, the file left as it was."""
    results = tmp_path / "results"
    results.mkdir()
    damaged = results / "base.json"  # the ci grid's first row: refused before anything trains
    damaged.write_bytes(content.encode("utf-8", "surrogateescape"))
    r = ablate("--grid", "ci", "--steps", 2, "--dev-sentences", 3, "--runs", tmp_path / "runs",
               "--results", results)  # fmt: skip
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert str(damaged) in r.stderr and "is empty or damaged (not a JSON record)" in r.stderr
    assert damaged.read_bytes() == content.encode("utf-8", "surrogateescape")
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("recorded", [{"config": "multi30k"}, {"command": "... --config multi30k"}])
def test_a_result_made_from_another_config_is_refused_not_reused(tmp_path, recorded):
    """The same --results folder with another --config: a row trained from another base is
    not passed off as this one (its file names the base, or an older file's command does)."""
    results = tmp_path / "results"
    results.mkdir()
    settings = ["precision=fp32", "max_steps=2"]
    kept = {"row": "base", "overrides": settings, "dev_sentences": 3, **recorded}
    (results / "base.json").write_text(json.dumps(kept))
    options = ["--grid", "ci", "--dev-sentences", 3, "--set", "precision=fp32", "--steps", 2]
    r = ablate(*options, "--runs", tmp_path / "runs", "--results", results)  # multi30k-small
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert "--config multi30k with" in r.stderr and "from multi30k-small" in r.stderr
    assert json.loads((results / "base.json").read_text()) == kept
    assert not (tmp_path / "runs").exists()


def test_the_committed_rows_counted_the_parameters_their_settings_build():
    """Chapter 15 reads each row's parameter count from its committed run: the model the row's
    settings build now has exactly that many."""
    import json
    from dataclasses import asdict
    from pathlib import Path

    from annotated.data.multi30k_corpus import MULTI30K_VOCAB
    from annotated.model import count_parameters, make_model

    committed = sorted(Path(__file__).parent.parent.glob("results/ablations/*/*.json"))
    records = {json.loads(f.read_text())["row"]: json.loads(f.read_text()) for f in committed}
    assert set(records) == set(VARIATIONS)
    for name, record in records.items():
        cfg = build_config(BASE, VARIATIONS[name])
        assert cfg.data.vocab == MULTI30K_VOCAB
        model = make_model(MULTI30K_VOCAB, MULTI30K_VOCAB, **asdict(cfg.model))
        assert count_parameters(model) == record["parameters"], name
