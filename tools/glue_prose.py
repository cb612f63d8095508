"""Figures in prose that every reader sees as numbers: the book, JupyterLab and Colab alike.

A chapter stores a figure it computes with `glue(name, value)` (myst-nb's glue: a cell output
named `name`). Its prose cites the figure as a marked span, `<span data-glue="NAME:SPEC">TEXT
</span>` (without the line break): an inline HTML element that every markdown renderer shows
as TEXT alone. SPEC is a Python format specification, as in myst-nb's {glue:text} role (`.1f`,
`,.0f`, `.1%`); a `data-glue-md="NAME"` span takes the output's markdown instead. (An HTML
comment would hide the mark as well, but one that starts a line begins an HTML block, which
the book's renderer drops.) `fill` rewrites each span's TEXT from the
notebook's own glued outputs, so the prose shows the figures of the run stored beside it.
`tools/run_notebooks.py` calls it after every execution (the book build's too), and
`tests/test_book.py` checks that every stored notebook is filled.

    python tools/glue_prose.py notebooks/*.ipynb            # fill the spans in place
    python tools/glue_prose.py --check notebooks/*.ipynb    # exit 1 if a span is stale
    python tools/glue_prose.py --convert notebooks/*.ipynb  # myst-nb glue roles -> spans
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from ast import literal_eval
from pathlib import Path

SPAN = re.compile(r'<span data-glue(-md)?="([A-Za-z0-9_.-]+)(?::([^"]*))?">(.*?)</span>', re.S)
ROLE = re.compile(r"\{glue:(text|md)\}`([A-Za-z0-9_.-]+)(?::([^`]*))?`")


class GlueError(ValueError):
    """A span names a figure that the notebook's outputs do not hold."""


def glued(notebook: dict) -> dict[str, dict]:
    """name -> the mime bundle of every glue() output in the notebook."""
    found = {}
    for cell in notebook["cells"]:
        for output in cell.get("outputs", []):
            name = output.get("metadata", {}).get("scrapbook", {}).get("name")
            if name:
                data = output.get("data", {})
                found[name] = {k.split("papermill.record/")[-1]: v for k, v in data.items()}
    return found


def formatted(text: str, spec: str) -> str:
    """The figure as myst-nb's {glue:text} role writes it: the stored repr, formatted."""
    try:
        value = literal_eval(text)
    except (SyntaxError, ValueError):
        value = text
    return format(value, spec) if spec else str(value)


def _value(bundles: dict[str, dict], kind: str, name: str, spec: str, where: str) -> str:
    if name not in bundles:
        raise GlueError(f"{where}: the prose cites {name!r}, which no glue() output holds")
    data = bundles[name]
    if kind == "md":
        return "".join(data.get("text/markdown", "")).strip()
    return formatted("".join(data.get("text/plain", "")), spec or "")


def _rewrite(notebook: dict, pattern: re.Pattern, where: str) -> dict:
    bundles = glued(notebook)
    for cell in notebook["cells"]:
        if cell["cell_type"] != "markdown":
            continue
        source = "".join(cell["source"])

        def span(m: re.Match) -> str:
            kind = "md" if m.group(1) in ("md", "-md") else "text"
            name, spec = m.group(2), m.group(3)
            value = _value(bundles, kind, name, spec, where)
            head = f"{name}:{spec}" if spec is not None else name
            return f'<span data-glue{"-md" if kind == "md" else ""}="{head}">{value}</span>'

        new = pattern.sub(span, source)
        if new != source:  # a list of lines in a file, one string in nbformat's objects
            cell["source"] = new if isinstance(cell["source"], str) else new.splitlines(True)
    return notebook


def fill(notebook: dict, where: str = "notebook") -> dict:
    """Every span's text rewritten from the notebook's glued outputs (in place; returned)."""
    return _rewrite(notebook, SPAN, where)


def convert(notebook: dict, where: str = "notebook") -> dict:
    """Every myst-nb {glue:text} or {glue:md} role replaced by a filled span."""
    return _rewrite(notebook, ROLE, where)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="+", type=Path)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="change nothing; exit 1 if stale")
    mode.add_argument("--convert", action="store_true", help="turn glue roles into spans")
    args = parser.parse_args(argv)
    stale = []
    for path in args.notebooks:
        text = path.read_text(encoding="utf-8")
        notebook = json.loads(text)
        before = json.dumps(notebook["cells"])
        try:
            (convert if args.convert else fill)(notebook, path.name)
        except GlueError as e:
            print(e, file=sys.stderr)
            return 2
        if json.dumps(notebook["cells"]) == before:
            continue
        stale.append(path.name)
        if not args.check:
            path.write_text(json.dumps(notebook, indent=1, ensure_ascii=False) + "\n")
    if stale:
        print(("stale: " if args.check else "filled: ") + ", ".join(stale))
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
