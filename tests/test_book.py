"""The book builds with warnings as errors and its pages load nothing from the internet.

The `built_book` fixture (tests/conftest.py) builds from the notebooks' stored outputs
(execution off) so that it stays fast; the main job (`make book`) executes every notebook.
nbval checks that the stored outputs are what the code produces today. tests/test_browser.py
opens the same build in a browser.
"""

import json
import re
from pathlib import Path

import yaml

from helpers import toc_files

ROOT = Path(__file__).resolve().parent.parent


def test_every_notebook_is_in_the_toc():
    listed = set(toc_files())
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        assert f"notebooks/{nb.stem}" in listed, f"{nb.name} is missing from _toc.yml"


def test_pages_exist(built_book):
    for f in toc_files():
        assert (built_book / f"{f}.html").exists(), f


def test_nothing_loads_from_the_internet(built_book):
    external = re.compile(r'<(?:script|link|img|iframe)[^>]*(?:src|href)="(https?:)?//[^"]+"', re.I)
    for page in built_book.rglob("*.html"):
        hits = external.findall(page.read_text(encoding="utf-8"))
        assert not hits, f"{page.relative_to(built_book)} loads remote resources"
        assert "cdn.jsdelivr" not in page.read_text(encoding="utf-8"), page


def test_mathjax_and_vega_are_served_locally(built_book):
    page = (built_book / "notebooks" / "01_attention.html").read_text(encoding="utf-8")
    for script in [
        "_static/mathjax/tex-mml-chtml.js",
        "_static/vega/vega.min.js",
        "_static/vega-lite/vega-lite.min.js",
        "_static/vega-embed/vega-embed.min.js",
    ]:
        assert script in page, script
        assert (built_book / script.split("?")[0]).exists(), script
    assert page.count("tex-mml-chtml.js") == 1, "MathJax must be loaded exactly once"
    assert 'vegaEmbed("#vega-' in page  # charts are embedded, not images or CDN loaders
    assert r"\sqrt{d_k}" in page  # equations reach the page for MathJax


def prose_and_exported_code(notebook: dict) -> tuple[int, int]:
    """Characters of prose (markdown cells, fenced code blocks left out) and of exported code
    (cells with an `#| export` directive; directives, blank lines and indentation left out)."""
    prose = code = 0
    for cell in notebook["cells"]:
        text = "".join(cell["source"])
        if cell["cell_type"] == "markdown":
            prose += len(re.sub(r"```.*?```", "", text, flags=re.S))
        elif cell["cell_type"] == "code" and re.search(r"^#\|\s*export", text, re.M):
            lines = [line.strip() for line in text.splitlines()]
            code += len("\n".join(s for s in lines if s and not s.startswith("#|")))
    return prose, code


def test_prose_and_code_are_measured_as_documented():
    notebook = {
        "cells": [
            {"cell_type": "markdown", "source": ["Two words.\n", "```python\nx = 1\n```"]},
            {"cell_type": "code", "source": ["#| export\n", "def f():\n", "\n", "    return 1"]},
            {"cell_type": "code", "source": ["y = 2  # not exported"]},
        ]
    }
    assert prose_and_exported_code(notebook) == (len("Two words.\n"), len("def f():\nreturn 1"))


def test_each_chapter_explains_more_than_it_exports():
    """A book, not a code listing: every chapter's prose is at least as long as the code it
    adds to the package."""
    short = []
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        prose, code = prose_and_exported_code(json.loads(path.read_text(encoding="utf-8")))
        if prose < code:
            short.append(f"{path.name}: {prose} characters of prose for {code} of exported code")
    assert not short, short


def test_the_publishing_workflow_builds_the_book_and_deploys_it():
    workflow = yaml.safe_load((ROOT / ".github" / "workflows" / "book.yml").read_text())
    assert workflow[True]["push"]["branches"] == ["main"]  # YAML reads the key `on` as True
    build, deploy = workflow["jobs"]["build"], workflow["jobs"]["deploy"]
    runs = [step.get("run", "") for step in build["steps"]]
    assert any(r.strip() == "make book" for r in runs)
    assert any("torch==2.13.0" in r and "whl/cpu" in r for r in runs)
    upload = next(s for s in build["steps"] if "upload-pages-artifact" in s.get("uses", ""))
    built = re.search(r"The book is in (\S+)/index.html", (ROOT / "Makefile").read_text())
    assert upload["with"]["path"] == built.group(1)
    assert deploy["needs"] == "build"
    assert any("deploy-pages" in s.get("uses", "") for s in deploy["steps"])
    assert workflow["permissions"] == {"contents": "read", "pages": "write", "id-token": "write"}


def test_the_book_links_to_its_repository_and_opens_in_colab(built_book):
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    url = config["repository"]["url"]
    page = (built_book / "notebooks" / "01_attention.html").read_text(encoding="utf-8")
    assert f'href="{url}"' in page
    colab = url.replace("https://github.com/", "https://colab.research.google.com/github/")
    assert f"{colab}/blob/main/notebooks/01_attention.ipynb" in page
    owner, name = url.rstrip("/").split("/")[-2:]
    published = f"https://{owner}.github.io/{name}/"  # where GitHub Pages serves the book
    assert published in (ROOT / "README.md").read_text()
    assert published in (ROOT / ".github" / "workflows" / "book.yml").read_text()
