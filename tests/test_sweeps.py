"""The sweep tool's trials: every one is a configuration the trainer accepts, so that no trial
of a sweep (minutes of a GPU lent for a short while) fails on a misspelt setting."""

import subprocess
import sys
from pathlib import Path

import pytest

from annotated.errors import ConfigError
from annotated.training.config import apply_overrides
from annotated.training.registry import build_config

ROOT = Path(__file__).resolve().parent.parent


def tool():
    sys.path.insert(0, str(ROOT / "tools"))
    import sweep_multi30k

    return sweep_multi30k


def sweeps():
    return tool().SWEEPS


@pytest.mark.parametrize("config", ["multi30k-cpu", "multi30k"])
def test_every_trial_of_a_sweep_is_a_valid_configuration(config):
    trials, _ = sweeps()[config]
    assert trials
    base = build_config(config)
    for name, overrides in trials.items():
        cfg = apply_overrides(build_config(config), overrides)  # raises ConfigError if not
        # each trial changes what it says, but the one that became the profile
        assert (cfg != base or not overrides) != (name == tool().PROFILE_TRIAL.get(config)), name
    with pytest.raises(ConfigError):  # what the check relies on: a misspelt key is refused
        apply_overrides(build_config(config), ["optim.max_tokenz=3"])


def test_the_sweep_lists_its_trials_and_what_each_changes():
    tool = str(ROOT / "tools" / "sweep_multi30k.py")
    r = subprocess.run(
        [sys.executable, tool, "--list", "--config", "multi30k"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    trials, _ = sweeps()["multi30k"]
    listed = [line.split()[0] for line in r.stdout.splitlines() if line.strip()]
    assert listed == list(trials), r.stdout


def test_a_gpu_trial_with_a_time_budget_trains_for_minutes_not_steps(tmp_path):
    """--minutes M: each trial's command sets max_minutes and leaves the profile's max_steps."""
    cmd = tool().train_command("multi30k", "N3-d256", 0, tmp_path, False, 6.0)
    sets = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--set"]
    assert "max_minutes=6.0" in sets and not any(s.startswith("max_steps=") for s in sets)
    assert cmd[cmd.index("--out") + 1] == str(tmp_path / "N3-d256")
    cmd = tool().train_command("multi30k", "N3-d256", 1000, tmp_path, False)
    assert "max_steps=1000" in cmd and not any("max_minutes" in a for a in cmd)
