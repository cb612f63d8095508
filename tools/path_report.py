"""How well the paper's path stands alone: one row per chapter of the path.

    python tools/path_report.py          # the table
    python tools/path_report.py --json   # the same, for a program

For each chapter of the paper's path (the parts of `_toc.yml` before the engineer's part):
minutes of prose (words of the markdown cells as rendered, at 230 a minute), exported lines,
**forward imports** (names a code cell imports from the package that are defined by a chapter
read later, charts from the appendix aside) and **forward references** (mentions of a later
chapter, or of one off the path, outside the chapter's closing "where this goes next" section).
`tests/test_book.py` prints it and holds the totals to their limits.
"""

from __future__ import annotations

import argparse
import ast
import functools
import json
import re
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
WORDS_PER_MINUTE = 230
PATH_PARTS = 4  # the paper's path: the first four parts of the table of contents
CLOSING = re.compile(r"^#+ *Where this goes next", re.I | re.M)
# "chapter 16", "chapters 17 to 22", "chapters 8 and 9"; the book's "Figure 6.1" (the
# paper's figures, "Figure 1", have no dot)
ONE = r"A?\d{1,2}[a-h]?"
MENTION = re.compile(
    rf"\b[Cc]hapters?\s+({ONE}(?:(?:,\s*|\s+(?:and|or|to)\s+){ONE})*)\b"
    rf"|\b[Ff]igures?\s+({ONE})\.\d+"
)
LABEL = re.compile(ONE)
LINK = re.compile(r"!?\[[^\]]*\]\([^)]*\)")
TARGET = re.compile(r"\]\(([^)\s#]+?)\.ipynb(?:#[^)]*)?\)")
# The appendix's chart and figure helpers (chapter A6), and `glue` and `committed_run`, which
# store a figure and read a committed run (A9), may serve any chapter.
EXEMPT = {"A6_charts_and_figures"}
EXEMPT_NAMES = {("experiments.book_runs", "glue"), ("experiments.book_runs", "committed_run")}


@functools.cache
def root_names() -> dict[str, str]:
    """name -> module for `from annotated import name`: the generated __init__'s `_MODULE_OF`."""
    tree = ast.parse((ROOT / "annotated" / "__init__.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "_MODULE_OF":
            return ast.literal_eval(node.value)
    raise LookupError("annotated/__init__.py has no _MODULE_OF table: run tools/export.py")


def reading_order() -> list[Path]:
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))
    files = [c["file"] for part in toc["parts"] for c in part["chapters"]]
    return [ROOT / f"{f}.ipynb" for f in files if f.startswith("notebooks/")]


def paper_path() -> list[Path]:
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))
    files = [c["file"] for part in toc["parts"][:PATH_PARTS] for c in part["chapters"]]
    return [ROOT / f"{f}.ipynb" for f in files if f.startswith("notebooks/")]


def label(nb: Path) -> str:
    """The label prose uses for a chapter: 00 -> 0, 05b -> 5b, A6 -> A6."""
    prefix = nb.stem.split("_")[0]
    return prefix if prefix.startswith("A") else (prefix.lstrip("0") or "0")


def defining_chapters() -> dict[tuple[str, str], str]:
    """(module, name) -> stem of the notebook whose exported cell defines the name, read from
    the generated modules' `# %% ../notebooks/NB.ipynb #cell` markers."""
    found = {}
    for path in (ROOT / "annotated").rglob("*.py"):
        module = ".".join(path.relative_to(ROOT / "annotated").with_suffix("").parts)
        text = path.read_text(encoding="utf-8")
        markers = [
            (m.start(), Path(m[1]).stem)
            for m in re.finditer(r"^# %% [./]*notebooks/(\S+)\.ipynb", text, re.M)
        ]
        if not markers:
            continue
        offsets = [0]
        for line in text.splitlines(keepends=True):
            offsets.append(offsets[-1] + len(line))
        for node in ast.parse(text).body:
            names = []
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names = [node.name]
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names = [t.id for t in targets if isinstance(t, ast.Name)]
            start = offsets[node.lineno - 1]
            owner = [stem for at, stem in markers if at <= start]
            for name in names:
                if owner:
                    found[(module, name)] = owner[-1]
    return found


def imports_of(notebook: dict) -> list[tuple[str, str]]:
    """(module, name) for every `from annotated.X import name` in the notebook's code cells, and
    for every `from annotated import name`, the module the package's root takes it from."""
    found = []
    for cell in notebook["cells"]:
        if cell["cell_type"] != "code":
            continue
        source = "\n".join(
            line for line in "".join(cell["source"]).splitlines() if not line.startswith(("%", "!"))
        )
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "annotated":
                found += [(root_names().get(alias.name, ""), alias.name) for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("annotated."):
                module = node.module.removeprefix("annotated.")
                found += [(module, alias.name) for alias in node.names]
    return found


def mentions(notebook: dict) -> list[str]:
    """The chapter labels the prose mentions or links to outside the closing section."""
    found = []
    for cell in notebook["cells"]:
        if cell["cell_type"] != "markdown":
            continue
        text = "".join(cell["source"])
        if (closing := CLOSING.search(text)) is not None:
            text = text[: closing.start()]
        text = re.sub(r"```.*?```", "", text, flags=re.S)
        found += [label(Path(m[1])) for m in TARGET.finditer(text)]  # links to a chapter
        for m in MENTION.finditer(LINK.sub("", text)):  # and mentions by number alone
            found += LABEL.findall(m[1] or m[2])
    return found


UNLINKED = re.compile(rf"\b[Cc]hapters?\s+{ONE}\b")


def unlinked(notebook: dict) -> list[str]:
    """Mentions of a chapter by its number in the prose that are not links: "chapter 7" where
    "[chapter 7](06_...ipynb)" belongs (code, inline code and glue spans aside)."""
    found = []
    for cell in notebook["cells"]:
        if cell["cell_type"] == "markdown":
            text = re.sub(
                r"```.*?```|`[^`\n]*`|<span[^>]*>.*?</span>",
                "",
                "".join(cell["source"]),
                flags=re.S,
            )
            found += UNLINKED.findall(LINK.sub("", text))
    return found


def minutes_and_lines(notebook: dict) -> tuple[float, int]:
    words = lines = 0
    for cell in notebook["cells"]:
        text = "".join(cell["source"])
        if cell["cell_type"] == "markdown":
            prose = re.sub(r"```.*?```", "", text, flags=re.S)
            words += len(re.sub(r"<[^>]+>", "", prose).split())
        elif cell["cell_type"] == "code" and re.search(r"^#\|\s*export", text, re.M):
            lines += sum(1 for s in text.splitlines() if s.strip() and not s.startswith("#|"))
    return words / WORDS_PER_MINUTE, lines


def report() -> list[dict]:
    path = paper_path()
    labels = {label(nb): nb.stem for nb in reading_order()}
    owners = defining_chapters()
    rows = []
    for nb in path:
        notebook = json.loads(nb.read_text(encoding="utf-8"))
        read = {p.stem for p in path[: path.index(nb) + 1]}  # this chapter and those before
        forward_imports = sorted(
            {
                f"{module}.{name} ({owners[module, name]})"
                for module, name in imports_of(notebook)
                if (module, name) not in EXEMPT_NAMES
                and owners.get((module, name), nb.stem) not in read | EXEMPT
            }
        )
        forward_refs = [x for x in mentions(notebook) if x in labels and labels[x] not in read]
        minutes, lines = minutes_and_lines(notebook)
        rows.append(
            {
                "chapter": nb.stem,
                "minutes": round(minutes, 1),
                "exported_lines": lines,
                "forward_imports": forward_imports,
                "forward_references": forward_refs,
                "unlinked": unlinked(notebook),
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = parser.parse_args(argv)
    rows = report()
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    head = f"{'chapter':32} {'minutes':>7} {'lines':>6} {'fwd imports':>11} {'fwd refs':>8}"
    print(f"{head} {'unlinked':>8}")
    for r in rows:
        print(
            f"{r['chapter']:32} {r['minutes']:7.1f} {r['exported_lines']:6d} "
            f"{len(r['forward_imports']):11d} {len(r['forward_references']):8d} "
            f"{len(r['unlinked']):8d}"
        )
    print(
        f"{'the paper path':32} {sum(r['minutes'] for r in rows):7.1f} "
        f"{sum(r['exported_lines'] for r in rows):6d} "
        f"{sum(len(r['forward_imports']) for r in rows):11d} "
        f"{sum(len(r['forward_references']) for r in rows):8d} "
        f"{sum(len(r['unlinked']) for r in rows):8d}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
