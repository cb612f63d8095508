"""A stand-in for the mlflow package in the tests: each call is a line of JSON in $STAND_IN_LOG."""

import json
import os


def _note(*call) -> None:
    with open(os.environ["STAND_IN_LOG"], "a", encoding="utf-8") as log:
        log.write(json.dumps(call) + "\n")


def start_run(run_name: str | None = None) -> None:
    _note("mlflow.start_run", run_name)


def log_params(params: dict) -> None:
    _note("mlflow.log_params", params)


def log_metric(key: str, value: float, step: int | None = None) -> None:
    _note("mlflow.log_metric", key, value, step)


def end_run() -> None:
    _note("mlflow.end_run")
