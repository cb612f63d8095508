"""Chapter 13: scoring a run (averaged checkpoints, beam search, two BLEUs) and writing its
results."""

import json

import pytest

from annotated.cli import evaluate
from annotated.errors import TrainingError
from annotated.evaluation import runs as evaluation
from annotated.training.registry import build_config
from annotated.training.tasks.copy import CopyTask
from annotated.training.trainer import train

from helpers import run_here


@pytest.fixture(scope="module")
def copy_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "copy"
    cfg = build_config("copy", ["max_steps=400", "checkpoint_every=100", "model.max_len=64"])
    train(cfg, out, progress=False, command="python -m annotated.cli.train --config copy (test)")
    return out


def test_evaluate_and_write_results(copy_run, tmp_path, monkeypatch):
    pairs = [
        ("3 4 5 6", "3 4 5 6"),
        ("7 8 9", "7 8 9"),
        ("10 11 12 3 4", "10 11 12 3 4"),
        ("5 5 6", "5 5 6"),
    ]
    monkeypatch.setattr(CopyTask, "test_sets", staticmethod(lambda cfg: {"toy": lambda: pairs}))
    report = evaluation.evaluate_run(copy_run, last=3)
    assert report["checkpoints"] == ["ckpt_00000200.pt", "ckpt_00000300.pt", "ckpt_00000400.pt"]
    toy = report["tests"]["toy"]
    assert (
        toy["sentences"] == 4 and toy["sacrebleu"] >= 90 and "nrefs:1" in toy["sacrebleu_signature"]
    )
    assert [t["source"] for t in report["translations"]["toy"]] == [s for s, _ in pairs]
    for bleu in ("sacrebleu", "tokenized_bleu", "compound_split_bleu", "tokenized_lowercased_bleu"):
        assert toy[bleu] >= 90 and toy[f"{bleu}_signature"]
    assert "##AT##" in toy["compound_split_bleu_signature"] and toy["of"] == 4
    every = evaluation.evaluate_run(copy_run, limit=2)  # the paper's window, two sentences
    kept = sorted(p.name for p in (copy_run / "checkpoints").glob("ckpt_*.pt"))
    assert len(kept) == 4  # steps 100 to 400: only 400 lies in the last 7% of the run
    assert every["checkpoints"] == ["ckpt_00000400.pt"] and "section 6.1" in every["chosen"]
    assert (every["tests"]["toy"]["sentences"], every["tests"]["toy"]["of"]) == (2, 4)
    assert [t["source"] for t in every["translations"]["toy"]] == [s for s, _ in pairs[:2]]
    out = tmp_path / "results"
    path = evaluation.write_results(
        out, copy_run, report, command="python -m annotated.cli.evaluate (test)"
    )
    results = json.loads(path.read_text())
    assert results["provenance"]["training_command"].startswith(
        "python -m annotated.cli.train --config copy"
    )
    # "cpu" or the GPU's name
    trained_on = json.loads((copy_run / "run.json").read_text())["device"]
    assert (
        results["provenance"]["device"] == trained_on
        and trained_on
        and results["provenance"]["commit"]
    )
    assert (
        results["training"]["steps"] == 400
        and results["evaluation"]["tests"]["toy"]["sentences"] == 4
    )
    assert (out / "toy.hyp").read_text().splitlines() == [
        t["hypothesis"] for t in report["translations"]["toy"]
    ]
    assert (out / "samples.tsv").read_text().splitlines()[0] == "source\treference\thypothesis"
    assert (out / "metrics.jsonl").read_text() == (copy_run / "metrics.jsonl").read_text()
    assert not list(out.glob("*.tmp"))


def test_a_checkpoint_pruned_while_scoring_each_is_skipped_not_an_error(
    copy_run, monkeypatch, tmp_path
):
    """--plot on a run still training: a checkpoint listed, then pruned by the trainer before
    it is read, is left out of the per-checkpoint curve; one that exists but is damaged is not."""
    pairs = [("3 4 5", "3 4 5"), ("7 8 9", "7 8 9")]
    monkeypatch.setattr(CopyTask, "test_sets", staticmethod(lambda cfg: {"toy": lambda: pairs}))
    listed = evaluation.checkpoint_paths(copy_run)
    pruned = listed[0].with_name("ckpt_00000050.pt")  # listed, gone by the time it is read
    monkeypatch.setattr(evaluation, "checkpoint_paths", lambda run: [pruned, *listed])
    scores = evaluation.bleu_per_checkpoint(copy_run, beam_size=1)
    assert sorted(scores) == [100, 200, 300, 400]
    damaged = tmp_path / "ckpt_00000050.pt"
    damaged.write_bytes(b"not a checkpoint")
    monkeypatch.setattr(evaluation, "checkpoint_paths", lambda run: [damaged, *listed])
    with pytest.raises(TrainingError):
        evaluation.bleu_per_checkpoint(copy_run, beam_size=1)


def test_evaluate_refuses_runs_it_cannot_score(copy_run, tmp_path):
    with pytest.raises(TrainingError, match="no checkpoints in"):
        evaluation.evaluate_run(tmp_path)
    with pytest.raises(TrainingError, match="task 'copy' has no test sets"):
        evaluation.evaluate_run(copy_run)
    with pytest.raises(TrainingError, match="run.json is missing"):
        evaluation.write_results(tmp_path / "r", tmp_path, {"translations": {}})


def test_cli_reports_a_missing_run(tmp_path):
    r = run_here("evaluate", "--run", tmp_path / "nope")
    assert r.returncode == 2 and "no checkpoints in" in r.stderr and "train first" in r.stderr


def test_inputs_are_checked_before_any_decoding(copy_run, tmp_path, monkeypatch):
    run = tmp_path / "run"
    run.mkdir()
    (run / "checkpoints").symlink_to(copy_run / "checkpoints")
    (run / "run.json").write_text((copy_run / "run.json").read_text())
    good = (copy_run / "metrics.jsonl").read_text()
    (run / "metrics.jsonl").write_text(good + '{"step": 401, "lo')  # cut short by a kill
    run_info, metrics, text = evaluation.read_run(run)
    assert text == good and metrics[-1]["step"] == 400
    (run / "metrics.jsonl").write_text('{"step": 1, "lo\n' + good)  # damaged in the middle
    with pytest.raises(TrainingError, match="line 1 is not JSON"):
        evaluation.read_run(run)
    decoded = []
    monkeypatch.setattr(evaluate, "evaluate_run", lambda *a, **k: decoded.append(1))
    assert evaluate.main(["--run", str(run), "--results", str(tmp_path / "res")]) == 2
    assert decoded == []
    (run / "run.json").write_text("")
    with pytest.raises(TrainingError, match="cannot be read"):
        evaluation.read_run(run)


@pytest.mark.parametrize(
    "flag",
    [["--last", "0"], ["--limit", "0"], ["--beam", "0"], ["--alpha", "nan"], ["--alpha", "inf"]],
)
def test_cli_refuses_meaningless_search_settings(tmp_path, flag):
    r = run_here("evaluate", "--run", tmp_path, *flag)
    assert r.returncode == 2 and "must be at least 1" in r.stderr and "Traceback" not in r.stderr


def test_bleu_cli_strips_a_byte_order_mark_and_names_bad_bytes(tmp_path):
    ref, hyp, bad = tmp_path / "ref.txt", tmp_path / "hyp.txt", tmp_path / "bad.txt"
    ref.write_text("Ein Hund läuft über die Wiese.\nZwei Katzen schlafen.\n", encoding="utf-8")
    hyp.write_bytes(b"\xef\xbb\xbf" + ref.read_bytes())
    bad.write_bytes(b"Ein Hund\xff\nZwei\n")

    def cli(h):
        return run_here("bleu", "--hyp", h, "--ref", ref)

    assert "sacreBLEU            100.00" in cli(hyp).stdout
    r = cli(bad)
    assert (
        r.returncode == 2
        and f"{bad}: line 1 is not valid UTF-8" in r.stderr
        and "Traceback" not in r.stderr
    )


def test_cli_turns_missing_data_and_ctrl_c_into_messages(copy_run, monkeypatch, capsys):
    from annotated.errors import DataError

    def missing():
        raise DataError("toy.de not found: looked for /nowhere/toy.de")

    monkeypatch.setattr(CopyTask, "test_sets", staticmethod(lambda cfg: {"toy": missing}))
    assert evaluate.main(["--run", str(copy_run)]) == 2
    assert "error: toy.de not found" in capsys.readouterr().err

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(evaluate, "evaluate_run", interrupted)
    assert evaluate.main(["--run", str(copy_run)]) == 130
    assert "interrupted: nothing was written" in capsys.readouterr().err


PNG = b"\x89PNG\r\n\x1a\n"


def test_plot_scores_each_checkpoint_and_draws_the_run(copy_run, tmp_path, monkeypatch, capsys):
    pairs = [("3 4 5 6", "3 4 5 6"), ("7 8 9 10", "7 8 9 10"), ("11 12 3", "11 12 3")]
    monkeypatch.setattr(CopyTask, "test_sets", staticmethod(lambda cfg: {"toy": lambda: pairs}))
    scores = evaluation.bleu_per_checkpoint(copy_run)
    assert sorted(scores) == [100, 200, 300, 400]  # the step of every kept checkpoint
    # the run learned between its first and last kept checkpoints (with one thread or two, the
    # last writes one of the three sentences with a token too many, or none: 82 or 100)
    assert scores[400] >= scores[100] + 20 and all(0 <= s <= 100 + 1e-9 for s in scores.values())
    png = tmp_path / "plots" / "summary.png"
    assert evaluate.main(["--run", str(copy_run), "--plot", str(png), "--limit", "2"]) == 0
    assert png.read_bytes()[:8] == PNG and png.stat().st_size > 10_000
    assert not list(png.parent.glob("*.tmp"))
    assert f"wrote {png}" in capsys.readouterr().out
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    assert evaluate.main(["--run", str(copy_run), "--plot", str(blocked / "x.png")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --plot") and "a-file is a file, not a folder" in err, err
    assert "Traceback" not in err


def test_the_figure_has_four_panels_and_says_when_bleu_is_missing():
    from annotated.experiments.plots import run_figure

    metrics = [{"step": s, "loss": 5 / s, "lr": 1e-3, "target_tokens_per_s": 1e4} for s in (10, 20)]
    fig = run_figure(metrics, bleu={20: 30.5}, averaged=31.0, title="t")
    loss, lr, speed, bleu = fig.axes
    assert list(loss.lines[0].get_ydata()) == [0.5, 0.25]
    assert list(bleu.lines[0].get_xdata()) == [20] and bleu.lines[1].get_ydata()[0] == 31.0
    assert [ax.get_ylabel() for ax in fig.axes][3] == "sacreBLEU"
    bare = run_figure(metrics).axes[3]
    assert not bare.lines and "evaluate the run" in bare.texts[0].get_text()


# `score`: the one place where the book translates a test set and scores it (issue #48).
SCORED = [  # the copy model copies; the references differ, so that each BLEU is its own number
    ("3 4 5 6", "3 4 5 6"),
    ("7 8 9 10", "7 8 10 9"),
    ("10 11 12 3 4", "10 11 3 4"),
    ("5 5 6", "5 6 6"),
]


def test_score_is_translate_then_every_bleu_of_the_book(copy_run, monkeypatch):
    """`score` translates the sources with `translate` under the search settings it is given and
    reports, for those translations against the references, exactly what annotated.bleu_scores
    computes, every BLEU with its signature, in the target language it is given."""
    import inspect

    from annotated.bleu_scores import score_translations
    from annotated.checkpoints import checkpoint_paths
    from annotated.evaluation import translation
    from annotated.evaluation.translation import load_model, translate

    model, tokenizer, _ = load_model(checkpoint_paths(copy_run)[-1:])
    searched = []

    def spy(*args, **kwargs):
        bound = inspect.signature(translate).bind(*args, **kwargs)
        bound.apply_defaults()
        searched.append((bound.arguments["sentences"], bound.arguments["beam_size"],
                         bound.arguments["alpha"]))  # fmt: skip
        return translate(*args, **kwargs)

    monkeypatch.setattr(translation, "translate", spy)
    scored = translation.score(model, tokenizer, SCORED, beam_size=2, alpha=1.5, lang="en")
    hyps = scored.pop("translations")
    assert searched == [([s for s, _ in SCORED], 2, 1.5)]
    assert hyps == translate(model, tokenizer, [s for s, _ in SCORED], beam_size=2, alpha=1.5)
    assert scored.pop("decode_seconds") >= 0
    assert scored == score_translations(hyps, [r for _, r in SCORED], "en")
    assert 0 < scored["sacrebleu"] < 100 and "moses-tok:en" in scored["tokenized_bleu_signature"]
    assert list(scored) == [  # every BLEU the book defines, and nothing else
        f"{b}{s}"
        for b in ("sacrebleu", "tokenized_bleu", "compound_split_bleu", "tokenized_lowercased_bleu")
        for s in ("", "_signature")
    ]


def marking_score(monkeypatch, module) -> list:
    """Replace `module.score` by the real one whose results are marked: every number plus 1000,
    every string and translation prefixed, so that a caller's report shows whether it came from
    `score`. Returns the list of its calls: (pairs, search settings, result), as they come."""
    import inspect

    real, calls = evaluation.score, []

    def marked(*args, **kwargs):
        bound = inspect.signature(real).bind(*args, **kwargs)
        bound.apply_defaults()
        result = real(*args, **kwargs)
        result = {
            k: [f"marked {h}" for h in v] if k == "translations"
            else f"marked {v}" if isinstance(v, str) else v + 1000
            for k, v in result.items()
        }  # fmt: skip
        search = {k: bound.arguments[k] for k in ("beam_size", "alpha", "lang")}
        calls.append((bound.arguments["pairs"], search, dict(result)))  # as it was returned
        return result

    monkeypatch.setattr(module, "score", marked)
    return calls


PAPER = {"beam_size": 4, "alpha": 0.6, "lang": "de"}  # what each scorer has always searched with


@pytest.fixture
def scored_test2016(monkeypatch):
    """The copy task given SCORED as its test2016."""
    tests = {"test2016": lambda: SCORED}
    monkeypatch.setattr(CopyTask, "test_sets", staticmethod(lambda cfg: tests))


def test_evaluate_run_and_bleu_per_checkpoint_report_what_score_returns(
    copy_run, scored_test2016, monkeypatch
):
    calls = marking_score(monkeypatch, evaluation)
    report = evaluation.evaluate_run(copy_run, last=2, limit=3)
    [(pairs, search, result)] = calls
    assert pairs == SCORED[:3] and search == PAPER
    scores = {k: v for k, v in result.items() if k != "translations"}
    assert report["tests"]["test2016"] == {"sentences": 3, "of": 4, **scores}
    rows = report["translations"]["test2016"]
    assert [r["hypothesis"] for r in rows] == result["translations"]
    calls.clear()
    per_checkpoint = evaluation.bleu_per_checkpoint(copy_run, limit=2)
    assert len(calls) == len(per_checkpoint) == 4
    assert list(per_checkpoint.values()) == [r["sacrebleu"] for _, _, r in calls]
    assert all(p == SCORED[:2] and s == PAPER for p, s, _ in calls)


def test_table3_dev_scores_reports_what_score_returns(copy_run, monkeypatch):
    from annotated.experiments import table3

    monkeypatch.setattr(table3, "load_multi30k", lambda split: SCORED)
    calls = marking_score(monkeypatch, table3)
    dev = table3.dev_scores(copy_run, sentences=3)
    [(pairs, search, result)] = calls
    assert pairs == SCORED[:3] and search == PAPER
    assert dev["bleu"] == result["sacrebleu"] and dev["perplexity"] > 1


def test_the_sweep_and_the_browser_model_report_what_score_returns(
    copy_run, scored_test2016, monkeypatch
):
    from annotated.checkpoints import checkpoint_paths
    from annotated.evaluation.translation import load_model

    from helpers import ROOT

    monkeypatch.syspath_prepend(str(ROOT / "tools"))
    import browser_model
    import sweep_multi30k

    calls = marking_score(monkeypatch, sweep_multi30k)
    plain = sweep_multi30k.bleu_on_test2016(copy_run, last=2)
    every = sweep_multi30k.bleu_on_test2016(copy_run, last=2, every_bleu=True)
    (pairs, search, first), (_, _, second) = calls
    assert pairs == SCORED and search == PAPER
    assert plain == {k: first[k] for k in ("sacrebleu", "decode_seconds")} | {"sentences": 4}
    assert every == {k: v for k, v in second.items() if k != "translations"} | {"sentences": 4}

    calls = marking_score(monkeypatch, browser_model)
    model, tokenizer, cfg = load_model(checkpoint_paths(copy_run))
    reference = browser_model.reference(model, tokenizer, cfg)
    assert [search for _, search, _ in calls] == [{**PAPER, "beam_size": k} for k in (1, 4)]
    assert reference == {
        "test_set": "test2016",
        "sources": [s for s, _ in SCORED],
        "beam 1": calls[0][2]["translations"],
        "beam 4": calls[1][2]["translations"],
    }


def test_evaluate_scores_the_papers_window_or_the_best_validation(tmp_path):
    """By default `evaluate` averages the kept checkpoints of the last 7% of the steps, as the
    paper averaged its last five of twelve hours; a run that validated is scored at its best
    validation; --last and --best ask for either. The command says which it scored."""
    from annotated.evaluation.runs import PAPER_WINDOW, chosen_checkpoints

    out = tmp_path / "run"
    (out / "checkpoints").mkdir(parents=True)
    for step in range(20, 401, 20):  # a run that checkpointed every 20 steps, keeping them all
        (out / "checkpoints" / f"ckpt_{step:08d}.pt").write_bytes(b"")
    paths, why = chosen_checkpoints(out)
    steps = [int(p.stem[5:]) for p in paths]
    assert steps == [380, 400] and steps[0] >= 400 * (1 - PAPER_WINDOW) > 360, (steps, why)
    assert [int(p.stem[5:]) for p in chosen_checkpoints(out, last=5)[0]] == list(
        range(320, 401, 20)
    )
    with pytest.raises(TrainingError, match="did not validate"):
        chosen_checkpoints(out, best=True)
    (out / "best.json").write_text(json.dumps({"step": 240, "checkpoint": "ckpt_00000240.pt"}))
    paths, why = chosen_checkpoints(out)  # it validated: its best
    assert [p.name for p in paths] == ["ckpt_00000240.pt"] and "best.json" in why
    assert len(chosen_checkpoints(out, best=False)[0]) == 2  # the window, asked for


def test_the_evaluate_command_says_which_checkpoints_it_scored(copy_run, monkeypatch, capsys):
    pairs = [("3 4 5 6", "3 4 5 6")]
    monkeypatch.setattr(CopyTask, "test_sets", staticmethod(lambda cfg: {"toy": lambda: pairs}))
    assert evaluate.main(["--run", str(copy_run), "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "scored ckpt_00000400.pt: the kept checkpoints of the last 7% of training" in out, out
