"""Settings for every pytest run, including `pytest --nbval notebooks/` on its own."""

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent
os.environ.setdefault("ANNOTATED_BOOK", "1")  # notebooks store charts as the book renders them
_shared = ROOT.parent / "shared" / "data"
if _shared.is_dir():  # tests and CI read the offline copies; nothing is downloaded
    os.environ.setdefault("ANNOTATED_DATA", str(_shared))
