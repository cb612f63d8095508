"""The book builds with warnings as errors and its pages load nothing from the internet.

The `built_book` fixture (tests/conftest.py) builds from the notebooks' stored outputs
(execution off) so that it stays fast; the main job (`make book`) executes every notebook.
nbval checks that the stored outputs are what the code produces today. tests/test_browser.py
opens the same build in a browser.
"""

import json
import re
from pathlib import Path

import glue_prose
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


def parts() -> dict[str, list[str]]:
    """The table of contents: part caption -> its pages."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    return {p["caption"]: [c["file"] for c in p["chapters"]] for p in toc["parts"]}


def chapters(kind: str) -> list[Path]:
    """The notebooks of the reading parts ("reading") or of the appendix ("appendix")."""
    captions = list(parts())
    appendix = captions[-1]
    chosen = [appendix] if kind == "appendix" else captions[:-1]
    files = [f for c in chosen for f in parts()[c] if f.startswith("notebooks/")]
    return [ROOT / f"{f}.ipynb" for f in files]


def exported_cells(notebook: dict) -> list[str]:
    return [
        "".join(c["source"])
        for c in notebook["cells"]
        if c["cell_type"] == "code" and re.search(r"^#\|\s*export", "".join(c["source"]), re.M)
    ]


PAPER_PARTS = [
    "The model (paper sections 1-4)",
    "Training (paper section 5)",
    "Decoding and evaluation (paper section 6)",
    "Translating real data (Multi30k)",
]
ENGINEER = "The engineer's part"  # the captions of the parts after the paper's path start so


def test_the_book_reads_in_parts_and_ends_with_the_machinery():
    captions = list(parts())
    assert captions[: len(PAPER_PARTS)] == PAPER_PARTS
    rest = captions[len(PAPER_PARTS) : -2]
    assert rest and all(c.startswith(ENGINEER) for c in rest), rest
    assert captions[-2] == "Back matter"
    assert captions[-1].startswith("Appendix: the machinery")
    assert all(p.name.startswith("A") for p in chapters("appendix"))
    assert not any(p.name.startswith("A") for p in chapters("reading"))


def paper_path() -> list[Path]:
    """The chapters a reader of the paper reads in one sitting: the parts before the engineer's."""
    files = [f for c in PAPER_PARTS for f in parts()[c] if f.startswith("notebooks/")]
    return [ROOT / f"{f}.ipynb" for f in files]


WORDS_PER_MINUTE = 230
LIMITS = {"chapter_minutes": 12, "chapter_lines": 250, "path_minutes": 60}


def reading_minutes_and_lines(notebook: dict) -> tuple[float, int]:
    """Minutes of prose (words of the markdown cells as rendered: fenced code and HTML tags
    left out, at 230 a minute) and exported lines (non-blank lines of `#| export` cells, the
    directives left out): tools/path_report.py's count, one copy."""
    import path_report

    return path_report.minutes_and_lines(notebook)


def test_reading_time_is_measured_as_documented():
    notebook = {
        "cells": [
            {"cell_type": "markdown", "source": ["Two <span a='1'>words</span>\n", "```\nx\n```"]},
            {"cell_type": "code", "source": ["#| export\n", "def f():\n", "\n", "    return 1"]},
            {"cell_type": "code", "source": ["y = 2  # not exported"]},
        ]
    }
    assert reading_minutes_and_lines(notebook) == (2 / WORDS_PER_MINUTE, 2)


def test_the_papers_path_reads_in_one_sitting():
    """Every chapter of the paper's path within 12 minutes of prose and 250 exported lines, and
    the whole path within 70 minutes; the engineer's chapters within 12 minutes each. The table
    is printed (pytest -s shows it)."""
    path = paper_path()
    over, total = [], 0.0
    print(f"\n{'chapter':34} {'minutes':>7} {'lines':>6}")
    for nb in chapters("reading"):
        minutes, lines = reading_minutes_and_lines(json.loads(nb.read_text(encoding="utf-8")))
        on_path = nb in path
        total += minutes if on_path else 0.0
        print(f"{nb.stem:34} {minutes:7.1f} {lines:6d}{'' if on_path else '  (engineer)'}")
        if minutes > LIMITS["chapter_minutes"]:
            over.append(f"{nb.stem}: {minutes:.1f} minutes of prose")
        if on_path and lines > LIMITS["chapter_lines"]:
            over.append(f"{nb.stem}: {lines} exported lines")
    print(f"{'the paper path':34} {total:7.1f}")
    assert total <= LIMITS["path_minutes"], f"the paper's path takes {total:.1f} minutes"
    assert not over, over


# Where the paper's path stands on its own (tools/path_report.py): imports of names that a later
# chapter defines, and mentions of a later chapter outside the closing "where this goes next".
# Both only go down: each restructure lowers the limit to what it reached (the goal is 0).
STANDS_ALONE = {"forward_imports": 0, "forward_references": 0}


def test_the_papers_path_stands_alone():
    """The report of tools/path_report.py, printed (pytest -s), and its totals within limits."""
    import path_report

    rows = path_report.report()
    assert [r["chapter"] for r in rows] == [nb.stem for nb in paper_path()]
    path_report.main([])
    for key, limit in STANDS_ALONE.items():
        total = sum(len(r[key]) for r in rows)
        worst = {r["chapter"]: r[key] for r in rows if r[key]}
        assert total <= limit, f"{key}: {total} on the path (at most {limit}): {worst}"


def test_chapters_are_numbered_in_reading_order_and_mentioned_as_links():
    """Each chapter's title starts with its number, the numbers rise in the table of contents'
    order (the appendix's letters after them), and on the paper's path every mention of a
    chapter by its number is a link to it."""
    import path_report

    numbers = []
    for nb in path_report.reading_order():
        cells = json.loads(nb.read_text(encoding="utf-8"))["cells"]
        title = next("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
        label = path_report.label(nb)
        assert title.startswith(f"# {label}. "), (nb.name, title.splitlines()[0])
        numbers.append(label)
    reading = [n for n in numbers if not n.startswith("A")]
    assert [int(n) for n in reading] == list(range(len(reading))), numbers
    appendix = numbers[len(reading) :]
    assert all(n.startswith("A") for n in appendix) and appendix == sorted(appendix), numbers
    unlinked = {r["chapter"]: r["unlinked"] for r in path_report.report() if r["unlinked"]}
    assert not unlinked, unlinked


def test_the_path_report_finds_forward_imports_and_references():
    """A chapter that imports a later chapter's name and mentions a later chapter is counted;
    the same mention inside its closing "where this goes next" section is not."""
    import path_report

    notebook = {
        "cells": [
            {"cell_type": "markdown", "source": ["As chapter 13 shows, and Figure 9.1 too.\n"]},
            {"cell_type": "code", "source": ["from annotated.fast import make_fast\n"]},
            {"cell_type": "markdown", "source": ["## Where this goes next\n", "Chapter 15.\n"]},
        ]
    }
    assert path_report.mentions(notebook) == ["13", "9"]
    assert path_report.imports_of(notebook) == [("fast", "make_fast")]
    assert path_report.defining_chapters()["fast", "make_fast"] == "16_fast_path"
    assert path_report.unlinked(notebook) == ["chapter 13", "Chapter 15"]
    linked = {
        "cells": [{"cell_type": "markdown", "source": ["[chapter 4](04_x.ipynb), `chapter 5`"]}]
    }
    assert path_report.unlinked(linked) == []


def chapter_label(nb: Path) -> str:
    """How figures of a chapter are numbered: 00 -> 0, 05b -> 5b, A6 -> A6."""
    prefix = nb.stem.split("_")[0]
    return prefix if prefix.startswith("A") else (prefix.lstrip("0") or "0")


def is_chart(cell: dict) -> bool:
    for output in cell.get("outputs", []):
        data = output.get("data", {})
        html = "".join(data.get("text/html", ""))
        if {"image/png", "image/svg+xml"} & set(data) or "vegaEmbed" in html or "<svg" in html:
            return True
    return False


CAPTION = re.compile(r"\*\*Figure ([0-9A-Za-z]+)\.(\d+)\.\*\* \S")


def captions_of(nb: Path) -> list[str]:
    """The problems with a chapter's figures: every chart must be followed by a markdown cell
    that starts `**Figure X.N.** ` and a caption; the captions (a figure may also be a widget
    or an image the detector does not see) are numbered X.1, X.2, ... in the chapter."""
    cells, problems = json.loads(nb.read_text(encoding="utf-8"))["cells"], []
    label, numbers = chapter_label(nb), []
    for i, cell in enumerate(cells):
        text = "".join(cell["source"])
        if cell["cell_type"] == "markdown" and (m := CAPTION.match(text)):
            numbers.append((m[1], int(m[2])))
            if len(text) < 40:
                problems.append(f"{nb.name}: figure {m[2]} has no caption to speak of")
        if cell["cell_type"] == "code" and is_chart(cell):
            after = cells[i + 1] if i + 1 < len(cells) else {"cell_type": "code", "source": []}
            if after["cell_type"] != "markdown" or not CAPTION.match("".join(after["source"])):
                problems.append(f"{nb.name}: the chart of cell {i} needs a caption after it")
    want = [(label, n) for n in range(1, len(numbers) + 1)]
    if numbers != want:
        problems.append(f"{nb.name}: figures numbered {numbers}, expected {want}")
    return problems


def test_every_figure_has_a_number_and_a_caption():
    problems = [p for nb in sorted((ROOT / "notebooks").glob("*.ipynb")) for p in captions_of(nb)]
    assert not problems, problems


def test_the_caption_check_finds_a_missing_caption(tmp_path):
    chart = {"cell_type": "code", "source": ["c"], "outputs": [{"data": {"image/png": "x"}}]}
    caption = {"cell_type": "markdown", "source": ["**Figure 5b.1.** " + "a caption " * 4]}
    nb = tmp_path / "05b_x.ipynb"
    nb.write_text(json.dumps({"cells": [chart, caption, chart]}))
    assert captions_of(nb) == ["05b_x.ipynb: the chart of cell 2 needs a caption after it"]
    nb.write_text(json.dumps({"cells": [chart, caption, chart, caption]}))
    assert captions_of(nb) == [
        "05b_x.ipynb: figures numbered [('5b', 1), ('5b', 1)], expected [('5b', 1), ('5b', 2)]"
    ]


def sections(notebook: dict) -> list[str]:
    return [
        line
        for cell in notebook["cells"]
        if cell["cell_type"] == "markdown"
        for line in "".join(cell["source"]).splitlines()
        if line.startswith("## ")
    ]


def test_every_reading_chapter_ends_with_a_summary_and_the_papers_path_with_exercises():
    """A summary in every reading chapter; on the paper's path, two or three exercises after it,
    each with a worked solution: a code cell shown as a dropdown (`hide-cell`), starting
    `# Solution to exercise N`, whose assertion nbval runs."""
    problems = []
    for nb in chapters("reading"):
        notebook = json.loads(nb.read_text(encoding="utf-8"))
        heads = sections(notebook)
        if "## Summary" not in heads:
            problems.append(f"{nb.name}: no '## Summary'")
        if nb not in paper_path():
            continue
        if heads[-2:] != ["## Summary", "## Exercises"]:
            problems.append(f"{nb.name}: must end with '## Summary' then '## Exercises'")
            continue
        exercises = next(
            "".join(c["source"])
            for c in notebook["cells"]
            if "".join(c["source"]).startswith("## Exercises")
        )
        asked = re.findall(r"^(\d)\. ", exercises, re.M)
        solutions = [
            c
            for c in notebook["cells"]
            if c["cell_type"] == "code"
            and "".join(c["source"]).startswith("# Solution to exercise")
        ]
        answered = [
            re.match(r"# Solution to exercise (\d)", "".join(c["source"]))[1] for c in solutions
        ]
        if not 2 <= len(asked) <= 3 or answered != asked:
            problems.append(f"{nb.name}: exercises {asked}, solutions {answered}")
        for c in solutions:
            if "hide-cell" not in c["metadata"].get("tags", []) or "assert" not in "".join(
                c["source"]
            ):
                problems.append(f"{nb.name}: a solution must be tagged hide-cell and assert")
    assert not problems, problems


# What no reading chapter may export: the mechanisms of file locks, atomic writes and fsyncs,
# HTTP resumption, argument parsing and command-line mains, subprocesses, NCCL and SLURM. A
# reading chapter may call the appendix's helpers (`atomic_path`, `lock_out_dir`, `launch`).
PLUMBING = {
    "a file lock": r"\bfcntl\b|\bflock\(",
    "an atomic rename or fsync": r"\bos\.replace\(|\bos\.rename\(|\bfsync\(",
    "HTTP downloads": r"\burllib\b|\bhttp\.client\b|[\"']Range[\"']|\.part\b",
    "argument parsing or a command-line main": r"\bargparse\b|^def main\(|__main__",
    "a subprocess": r"\bsubprocess\b|\bPopen\b",
    "NCCL or SLURM settings": r"\bNCCL_|\bSLURM|#SBATCH|\bsbatch\b|\bsrun\b",
}


def plumbing_in(notebook: dict) -> list[str]:
    found = []
    for code in exported_cells(notebook):
        for what, pattern in PLUMBING.items():
            if re.search(pattern, code, re.M):
                found.append(f"{what} in {code.splitlines()[1][:60]!r}")
    return found


def test_the_plumbing_check_finds_plumbing():
    cell = {"cell_type": "code", "source": ["#| export\n", "import subprocess\n", "x = 1"]}
    assert plumbing_in({"cells": [cell]}) == ["a subprocess in 'import subprocess'"]
    cell["source"] = ["#| export\n", "def main(argv=None):\n", "    return 0"]
    assert plumbing_in({"cells": [cell]}) == [
        "argument parsing or a command-line main in 'def main(argv=None):'"
    ]


def test_no_reading_chapter_exports_plumbing():
    found = {
        p.name: hits
        for p in chapters("reading")
        if (hits := plumbing_in(json.loads(p.read_text(encoding="utf-8"))))
    }
    assert not found, found


def test_each_reading_chapter_explains_more_than_it_exports():
    """A book, not a code listing: every reading chapter's prose is at least as long as the code
    it adds to the package."""
    short = []
    for path in chapters("reading"):
        prose, code = prose_and_exported_code(json.loads(path.read_text(encoding="utf-8")))
        if prose < code:
            short.append(f"{path.name}: {prose} characters of prose for {code} of exported code")
    assert not short, short


def test_each_piece_of_the_appendix_has_its_paragraph():
    """The appendix is literate too: a paragraph before each piece of exported code (a run of
    exported cells with no other code between them)."""
    bare = []
    for path in chapters("appendix"):
        said = False  # a paragraph since the last code that was not exported
        for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
            text = "".join(cell["source"])
            if cell["cell_type"] == "markdown":
                said = said or len(text) > 80
            elif re.search(r"^#\|\s*export", text, re.M):
                if not said:
                    bare.append(f"{path.name}: {text.splitlines()[1][:60]!r}")
            elif "remove-cell" not in cell["metadata"].get("tags", []):
                said = False  # the Colab cells and the default_exp line are not shown
    assert not bare, bare


HISTORY = re.compile(
    r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b"  # a commit hash
    r"|\b(?:19|20)\d\d-\d\d-\d\d\b"  # a date
    r"|\b(?:was|were|since|been) (?:fixed|overwritten|re-run)\b|\bnot re-run\b"
)


def test_no_history_in_the_prose():
    """Provenance lives in results/ and in the appendix page "How these numbers were made"; the
    chapters' prose and the README hold no commit hashes, dates or lab-log language."""
    found = []
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
            if cell["cell_type"] == "markdown":
                found += [f"{path.name}: {m}" for m in HISTORY.findall("".join(cell["source"]))]
    found += [f"README.md: {m}" for m in HISTORY.findall((ROOT / "README.md").read_text())]
    assert not found, found
    assert HISTORY.findall("at commit 7372c41, on 2026-11-24, tests since fixed") == [
        "7372c41",
        "2026-11-24",
        "since fixed",
    ]


def test_every_figure_in_prose_is_a_filled_glue_span():
    """Prose cites a computed figure as a span that tools/glue_prose.py fills from the chapter's
    own glued outputs, so that JupyterLab and Colab show the number, not markup: no myst-nb
    glue role is left, every span names an output the chapter holds, and every stored notebook
    shows the figures of its stored outputs. The chapters that quote measured figures glue them."""
    stale, roles, citing = [], [], set()
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        notebook = json.loads(path.read_text(encoding="utf-8"))
        prose = "".join(
            "".join(c["source"]) for c in notebook["cells"] if c["cell_type"] == "markdown"
        )
        roles += [f"{path.name}: {m.group(0)}" for m in glue_prose.ROLE.finditer(prose)]
        citing |= {path.name[:3]} if glue_prose.SPAN.search(prose) else set()
        before = json.dumps(notebook)
        try:
            glue_prose.fill(notebook, path.name)
        except glue_prose.GlueError as e:
            stale.append(str(e))
            continue
        if json.dumps(notebook) != before:
            stale.append(f"{path.name}: run `python tools/glue_prose.py {path.relative_to(ROOT)}`")
    assert not roles, roles
    assert not stale, stale
    assert {"05_", "16_", "11_", "13_", "24_", "25_", "26_"} <= citing, citing


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
