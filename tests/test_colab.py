"""Every chapter opens in Colab: a badge, and a first code cell that sets Colab up.

The setup cell is run here in a simulated Colab: a `google.colab` module is present, the
commands it runs are recorded instead of run, and the clone is a folder with the
repository's pyproject.toml.
"""

import json
import shutil
import subprocess
import sys
import types
from pathlib import Path

import colab
import pytest
import torch

from helpers import ROOT


def setup_cell() -> str:
    nb = json.loads((ROOT / "notebooks" / "01_attention.ipynb").read_text(encoding="utf-8"))
    return next("".join(c["source"]) for c in nb["cells"] if c["id"] == colab.SETUP_ID)


def test_every_notebook_has_the_badge_and_the_setup_cell_first():
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        assert [c["id"] for c in cells[1:3]] == [colab.BADGE_ID, colab.SETUP_ID], path.name
        code = [c for c in cells if c["cell_type"] == "code"]
        assert code[0]["id"] == colab.SETUP_ID, f"{path.name}: setup is not the first code cell"
        badge = "".join(cells[1]["source"])
        assert f"blob/main/notebooks/{path.name})" in badge, path.name
        wanted = [colab.essence(c) for c in colab.wanted_cells(path)]
        assert [colab.essence(c) for c in cells[1:3]] == wanted, f"{path.name}: run tools/colab.py"


class FakeColab:
    """Records the commands the cell runs; a `git clone` makes a folder like the clone."""

    def __init__(self):
        self.commands = []

    def run(self, command, check=False, **kwargs):
        self.commands.append(list(command))
        if command[:2] == ["git", "clone"]:
            book = command[-1]
            (Path(book) / "notebooks").mkdir(parents=True)
            shutil.copy(ROOT / "pyproject.toml", book)
        return subprocess.CompletedProcess(command, 0)


@pytest.fixture
def fake_colab(monkeypatch, tmp_path):
    fake = FakeColab()
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(subprocess, "run", fake.run)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Tesla T4")
    monkeypatch.setattr(sys, "path", list(sys.path))
    return fake


def test_on_colab_it_installs_everything_but_torch_and_uses_the_gpu(
    fake_colab, monkeypatch, tmp_path, capsys
):
    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    exec(setup_cell(), {})
    book = tmp_path / "annotated-transformer-book"
    clone, package, dependencies = fake_colab.commands
    assert clone == ["git", "clone", "--depth", "1", colab.repository(), str(book)]
    assert package[-3:] == ["--no-deps", "--editable", str(book)]
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = project["dependencies"] + project["optional-dependencies"]["book"]  # + notebooks'
    assert {"pandas>=2.1", "matplotlib>=3.8"} <= set(declared)
    installed = dependencies[dependencies.index("--quiet") + 1 :]
    assert installed == [r for r in declared if not r.startswith("torch")]
    assert len(installed) == len(declared) - 1  # torch, and only torch, is left to Colab
    assert dependencies[:3] == package[:3] == [sys.executable, "-m", "pip"]
    assert Path.cwd() == book / "notebooks"  # the chapters' relative paths work
    assert str(book) in sys.path
    assert capsys.readouterr().out.strip() == "GPU: Tesla T4"

    exec(setup_cell(), {})  # run again: no second clone
    assert [c[:2] for c in fake_colab.commands].count(["git", "clone"]) == 1


def test_without_a_gpu_it_says_how_to_get_one(fake_colab, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    exec(setup_cell(), {})
    assert "Change runtime type" in capsys.readouterr().out


def test_outside_colab_it_does_nothing(fake_colab, monkeypatch, tmp_path, capsys):
    monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    exec(setup_cell(), {})
    assert fake_colab.commands == []
    assert capsys.readouterr().out == ""
    assert Path.cwd() == tmp_path
