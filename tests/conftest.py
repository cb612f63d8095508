import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
# torchrun gives a process it asks to stop 30 s before it kills it. On a CI machine busy with
# other tests, finishing a step and fsyncing its checkpoint can take longer than that; the tests
# check what the trainers say when they stop, not how fast a loaded disk is.
os.environ.setdefault("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "150")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


@pytest.fixture(scope="session")
def built_book(tmp_path_factory):
    """The book built from the notebooks' stored outputs (execution off), with warnings as
    errors: the folder of its HTML pages. `make book` is the build that executes them."""
    import yaml  # here: the GPU suite runs the CUDA tests with only torch installed

    vendor = ROOT / "book" / "vendor" / "MANIFEST.json"
    assert vendor.exists(), (
        "book/vendor is missing: run `python tools/vendor_js.py` (make does this)"
    )
    tmp = tmp_path_factory.mktemp("book")
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    config["execute"]["execute_notebooks"] = "off"
    # Paths in a configuration file are read relative to it: this copy lives elsewhere.
    extensions = config["sphinx"]["local_extensions"]
    config["sphinx"]["local_extensions"] = {k: str(ROOT / v) for k, v in extensions.items()}
    cfg = tmp / "_config.yml"
    cfg.write_text(yaml.safe_dump(config))
    jb = shutil.which("jupyter-book", path=str(Path(sys.executable).parent)) or "jupyter-book"
    command = [jb, "build", str(ROOT), "--config", str(cfg), "--path-output", str(tmp)]
    command += ["--warningiserror", "--keep-going", "--quiet"]
    result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    return tmp / "_build" / "html"
