"""Where a run's curves go besides metrics.jsonl (appendix A3, training/reporting.py):
TensorBoard by default, Weights & Biases and MLflow on request, here through stand-ins of the
two packages that write each call into a log (tests/stand_ins)."""

import json
from pathlib import Path

from helpers import run_trainer, sets

STAND_INS = Path(__file__).parent / "stand_ins"
SHORT = sets("max_steps=20", "log_every=10", "checkpoint_every=10")


def copy_run(out: Path, *more: str, check: bool = True, **env):
    return run_trainer("--config", "copy", *SHORT, *more, "--out", str(out), check=check, **env)


def test_tensorboard_is_on_by_default_and_off_on_request(tmp_path):
    copy_run(tmp_path / "default")
    events = list((tmp_path / "default" / "tensorboard").glob("events.out.tfevents.*"))
    assert len(events) == 1 and events[0].stat().st_size > 0
    copy_run(tmp_path / "off", "--no-tensorboard")
    assert not (tmp_path / "off" / "tensorboard").exists()
    copy_run(tmp_path / "there", "--tensorboard", str(tmp_path / "board"))
    assert list((tmp_path / "board").glob("events.out.tfevents.*"))
    assert not (tmp_path / "there" / "tensorboard").exists()


def test_the_curves_go_to_weights_and_biases_and_mlflow(tmp_path):
    """Both writers get every logged point under TensorBoard's tags; the Weights & Biases run
    is named for the folder and keeps its id when the run resumes; MLflow gets the settings."""
    log, out = tmp_path / "calls.jsonl", tmp_path / "mine"
    env = dict(PYTHONPATH=str(STAND_INS), STAND_IN_LOG=str(log))
    reports = ["--report-to", "wandb", "--report-to", "mlflow", "--no-tensorboard"]
    copy_run(out, *reports, **env)
    copy_run(out, *reports, "--resume", "--max-steps", "30", **env)
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    inits = [c for c in calls if c[0] == "wandb.init"]
    assert len(inits) == 2 and inits[0] == inits[1]  # the same run, resumed
    options, config = inits[0][1], inits[0][2]
    assert options["name"] == "mine" and options["resume"] == "allow" and len(options["id"]) == 16
    assert config == {"task": "copy", "N": 2}
    wandb_loss = [(c[2], c[1]["train/loss"]) for c in calls if c[0] == "wandb.log"
                  and "train/loss" in c[1]]  # fmt: skip
    mlflow_loss = [
        (c[3], c[2]) for c in calls if c[0] == "mlflow.log_metric" and c[1] == "train/loss"
    ]
    assert [s for s, _ in wandb_loss] == [10, 20, 30] and wandb_loss == mlflow_loss
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["loss"]) for r in metrics] == wandb_loss  # the log's own numbers
    params = next(c[1] for c in calls if c[0] == "mlflow.log_params")
    assert params["model.N"] == 2 and params["task"] == "copy" and params["max_steps"] == 20
    names = [c[0] for c in calls]
    assert names.count("wandb.finish") == 2 and names.count("mlflow.end_run") == 2
    assert [c[1] for c in calls if c[0] == "mlflow.start_run"] == ["mine", "mine"]


def test_a_missing_package_is_a_message_before_anything_is_set_up(tmp_path):
    r = copy_run(tmp_path / "run", "--report-to", "wandb", check=False)
    assert r.returncode == 2 and "pip install 'annotated-transformer-book[wandb]'" in r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "run").exists()
    r = copy_run(tmp_path / "run", "--report-to", "comet", check=False)
    assert r.returncode == 2 and "invalid choice: 'comet'" in r.stderr


def test_a_writer_that_never_closes_does_not_keep_the_run_alive(monkeypatch):
    """A writer interrupted by Ctrl-C while it held its lock never closes: Writers.close waits
    CLOSE_SECONDS for it, then goes on (the thread is a daemon, so the process can end)."""
    import threading
    import time

    from annotated.training import reporting

    closed, stuck = [], threading.Event()

    class Stuck:
        def close(self):
            stuck.wait()  # never set: as a lock that is never released

    class Fine:
        def close(self):
            closed.append(True)

    monkeypatch.setattr(reporting, "CLOSE_SECONDS", 0.2)
    start = time.time()
    reporting.Writers([Stuck(), Fine()]).close()
    assert time.time() - start < 2 and closed == [True]
