"""A stand-in for the wandb package in the tests: each call is a line of JSON in $STAND_IN_LOG."""

import json
import os


def _note(*call) -> None:
    with open(os.environ["STAND_IN_LOG"], "a", encoding="utf-8") as log:
        log.write(json.dumps(call) + "\n")


class _Run:
    def log(self, values: dict, step: int | None = None) -> None:
        _note("wandb.log", values, step)

    def finish(self) -> None:
        _note("wandb.finish")


def init(**options) -> _Run:
    config = options.pop("config", {})
    _note("wandb.init", options, {"task": config.get("task"), "N": config["model"]["N"]})
    return _Run()
