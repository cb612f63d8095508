import os
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
os.environ.setdefault("ANNOTATED_BOOK", "1")   # notebooks under nbval store charts as the book does


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield
_shared = ROOT.parent / "shared" / "data"
if _shared.is_dir():                            # tests and CI read the offline copies; nothing is downloaded
    os.environ.setdefault("ANNOTATED_DATA", str(_shared))
