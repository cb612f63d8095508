"""tools/glue_prose.py: the prose's figures written out from the chapter's glued outputs."""

import json

import pytest
from glue_prose import GlueError, convert, fill, formatted, main
from myst_nb.core.variables import format_plain_text


def glue_output(name: str, plain: str, markdown: str | None = None) -> dict:
    """A cell output as myst-nb's glue(name, value, display=False) stores it."""
    prefix = "application/papermill.record/"
    data = {prefix + "text/plain": plain}
    if markdown is not None:
        data[prefix + "text/markdown"] = markdown
    return {
        "data": data,
        "metadata": {"scrapbook": {"mime_prefix": prefix, "name": name}},
        "output_type": "display_data",
    }


def notebook(prose: str, *outputs: dict) -> dict:
    return {
        "cells": [
            {"cell_type": "code", "source": ["glue(...)"], "outputs": list(outputs)},
            {"cell_type": "markdown", "source": prose.splitlines(keepends=True)},
        ]
    }


def prose_of(nb: dict) -> str:
    return "".join(nb["cells"][1]["source"])


@pytest.mark.parametrize(
    "plain, spec",
    [("0.2234", ".1%"), ("40665.69980506822", ",.0f"), ("3", ""), ("'a word'", ""), ("12", "d")],
)
def test_a_figure_is_written_as_myst_nb_writes_it(plain, spec):
    assert formatted(plain, spec) == format_plain_text(plain, spec or "")


def test_fill_rewrites_a_stale_figure_and_keeps_the_rest():
    nb = notebook(
        'It scored <span data-glue="bleu:.1f">0.0</span> BLEU\n'
        'on <span data-glue="n">?</span> pairs.',
        glue_output("bleu", "36.7749"),
        glue_output("n", "1000"),
    )
    fill(nb)
    want = (
        'It scored <span data-glue="bleu:.1f">36.8</span> BLEU\n'
        'on <span data-glue="n">1000</span> pairs.'
    )
    assert prose_of(nb) == want
    again = json.loads(json.dumps(nb))
    assert fill(again) == nb  # filled twice: the same


def test_convert_turns_myst_nb_roles_into_spans():
    nb = notebook(
        "A gap of {glue:text}`gap:.1%`, and {glue:md}`table`.",
        glue_output("gap", "0.0022"),
        glue_output("table", "'x'", markdown="**bold**"),
    )
    convert(nb)
    assert prose_of(nb) == (
        'A gap of <span data-glue="gap:.1%">0.2%</span>, and '
        '<span data-glue-md="table">**bold**</span>.'
    )


def test_a_figure_no_output_holds_is_an_error():
    nb = notebook('<span data-glue="missing:.1f">1.0</span>', glue_output("other", "2"))
    with pytest.raises(GlueError, match="'missing'"):
        fill(nb, "ch.ipynb")


def test_the_command_line_checks_and_fills(tmp_path, capsys):
    path = tmp_path / "ch.ipynb"
    path.write_text(json.dumps(notebook('<span data-glue="n">0</span>', glue_output("n", "7"))))
    assert main(["--check", str(path)]) == 1
    assert ">0<" in path.read_text()  # --check writes nothing
    assert main([str(path)]) == 0
    assert main(["--check", str(path)]) == 0
    assert prose_of(json.loads(path.read_text())) == '<span data-glue="n">7</span>'
    path.write_text(json.dumps(notebook('<span data-glue="gone">0</span>')))
    assert main([str(path)]) == 2
    assert "'gone'" in capsys.readouterr().err
