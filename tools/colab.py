"""Give every chapter an "Open in Colab" badge and a first code cell that sets Colab up.

    python tools/colab.py            write the two cells into every notebook (after its title)
    python tools/colab.py --check    exit 1 if a notebook's cells differ from what this writes

Both cells are tagged `remove-cell`: the built book has launch buttons instead, and a badge
image would be a request to another site. The setup cell does nothing outside Colab. On Colab
it clones the repository named in `_config.yml`, the address where the book will be published
(the repository is not on GitHub yet, so until then it uses a copy the reader has put in
`~/annotated-transformer-book`, and clones nothing), installs the package without its
dependencies, then installs the dependencies and the `book` extra except torch, so Colab's
own CUDA build of torch stays; pip leaves alone whatever already satisfies a requirement. It
then moves into the clone's `notebooks/` folder, so the chapters' relative paths work, and
says which device the chapters will use. `tests/test_colab.py` runs it in a simulated Colab.
"""

import argparse
import json
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
BADGE_ID, SETUP_ID = "colab-badge", "colab-setup"

SETUP = """\
# On Colab only: fetch the book, install what Colab lacks (keeping Colab's own torch), use its GPU.
import os
import subprocess
import sys

if "google.colab" in sys.modules:
    import tomllib
    import torch

    # Where the book will be published (repository.url in _config.yml). It is not on GitHub yet:
    # until it is, put a copy of the repository in ~/annotated-transformer-book and this uses it.
    repository = "{url}"
    book = os.path.expanduser("~/annotated-transformer-book")
    if not os.path.isdir(book):
        subprocess.run(["git", "clone", "--depth", "1", repository, book], check=True)
    with open(os.path.join(book, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    needed = project["dependencies"] + project["optional-dependencies"]["book"]
    pip = [sys.executable, "-m", "pip", "install", "--quiet"]
    subprocess.run([*pip, "--no-deps", "--editable", book], check=True)
    subprocess.run([*pip, *[r for r in needed if not r.startswith("torch")]], check=True)
    sys.path.insert(0, book)
    os.chdir(os.path.join(book, "notebooks"))
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    print(f"GPU: {{gpu}}" if gpu else "No GPU: Runtime > Change runtime type adds one.")"""


def repository() -> str:
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    return config["repository"]["url"].rstrip("/")


def wanted_cells(notebook: Path) -> list[dict]:
    url = repository()
    colab = url.replace("https://github.com/", "https://colab.research.google.com/github/")
    link = f"{colab}/blob/main/notebooks/{notebook.name}"
    badge = f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]({link})"
    meta = {"tags": ["remove-cell"]}
    return [
        {"cell_type": "markdown", "id": BADGE_ID, "metadata": meta, "source": lines(badge)},
        {
            "cell_type": "code",
            "execution_count": None,
            "id": SETUP_ID,
            "metadata": meta,
            "outputs": [],
            "source": lines(SETUP.format(url=url)),
        },
    ]


def lines(text: str) -> list[str]:
    parts = text.split("\n")
    return [p + "\n" for p in parts[:-1]] + [parts[-1]]


def essence(cell: dict) -> dict:
    """What the tool writes of a cell; its execution count and (empty) outputs may differ."""
    return {k: cell[k] for k in ("cell_type", "id", "metadata", "source")}


def with_colab_cells(notebook: Path) -> dict:
    """The notebook with its badge and setup cells right after its title: kept as they are when
    their text is current, written afresh otherwise."""
    nb = json.loads(notebook.read_text(encoding="utf-8"))
    wanted = wanted_cells(notebook)
    if [essence(c) for c in nb["cells"][1:3]] == [essence(c) for c in wanted]:
        return nb
    cells = [c for c in nb["cells"] if c.get("id") not in (BADGE_ID, SETUP_ID)]
    nb["cells"] = cells[:1] + wanted + cells[1:]
    return nb


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="only report notebooks to update")
    args = parser.parse_args()
    stale = []
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        nb = with_colab_cells(path)
        text = json.dumps(nb, indent=1, ensure_ascii=False) + "\n"
        if text != path.read_text(encoding="utf-8"):
            stale.append(path.name)
            if not args.check:
                path.write_text(text, encoding="utf-8")
    if args.check and stale:
        print("Colab cells out of date (run python tools/colab.py):", *stale, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
