"""`pip install .` into an empty virtual environment gives a package that imports and whose command
lines start. torch is there first, the version requirements.txt pins: a reader chooses the torch
build for their machine, and any other specifier here would fetch gigabytes of CUDA wheels. The
test links this environment's copy of that torch (and what it requires) into the new one rather
than unpacking the same wheel again, which took most of its time; pip then sees torch installed,
as it would on a reader's machine, and installs everything else."""

import re
import shutil
import subprocess
import venv
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
COMMANDS = ["train", "translate", "bleu", "evaluate", "prepare", "ablate", "export", "launch"]


def torch_pin() -> str:
    pins = [
        line.strip()
        for line in (ROOT / "requirements.txt").read_text().splitlines()
        if re.match(r"torch==", line.strip())
    ]
    assert pins, "requirements.txt pins torch exactly"
    return pins[0]


def link_distributions(name: str, site: Path) -> list[str]:
    """Distribution `name` and every one it requires (extras aside), linked from this
    environment's site-packages into `site`: what pip would unpack, without unpacking it."""
    todo, linked = [name], []
    while todo:
        try:
            dist = distribution(todo.pop())
        except PackageNotFoundError:  # a requirement for another platform (CUDA's, Windows')
            continue
        key = re.sub(r"[-_.]+", "-", dist.metadata["Name"]).lower()
        if key in linked:
            continue
        linked.append(key)
        where = Path(dist.locate_file(""))
        for top in {f.parts[0] for f in dist.files or []} - {"..", "__pycache__"}:
            if not (site / top).exists():
                (site / top).symlink_to(where / top)
        needs = [r for r in dist.requires or [] if "extra" not in r]
        todo += [re.match(r"[A-Za-z0-9_.-]+", r)[0] for r in needs]
    return linked


@pytest.mark.slow
def test_pip_install_into_an_empty_environment(tmp_path):
    venv.create(tmp_path / "env", with_pip=True)
    py = str(tmp_path / "env" / "bin" / "python")

    def run(*args, cwd=tmp_path):
        r = subprocess.run([py, *args], cwd=cwd, capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, " ".join(args) + "\n" + r.stdout[-2000:] + r.stderr[-3000:]
        return r.stdout

    site = Path(run("-c", "import sysconfig; print(sysconfig.get_path('purelib'))").strip())
    assert "torch" in link_distributions("torch", site)
    pinned = run("-m", "pip", "install", "--quiet", "--dry-run", "--report", "-", torch_pin())
    assert '"install": []' in pinned, "the linked torch is not the version requirements.txt pins"
    src = tmp_path / "src"  # a copy: pip's build folders never land in the checkout
    shutil.copytree(
        ROOT / "annotated", src / "annotated", ignore=shutil.ignore_patterns("__pycache__")
    )
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, src / name)
    run("-m", "pip", "install", "--quiet", str(src))
    # from tmp_path, not the checkout: the installed copy is what is imported
    where = run(
        "-c", "import annotated; print(annotated.__file__); print(annotated.make_model(11, 11))"
    )
    assert "site-packages" in where and "EncoderDecoder" in where
    # each command line, run as `python -m` runs it, in one process (torch imported once)
    helps = run("-c", "import runpy, sys\n"
                      f"for name in {COMMANDS!r}:\n"
                      "    sys.argv = [name, '--help']\n"
                      "    try: runpy.run_module(f'annotated.cli.{name}', run_name='__main__')\n"
                      "    except SystemExit as e: print(name, 'exit', e.code)\n")  # fmt: skip
    assert [f"{name} exit 0" for name in COMMANDS] == re.findall(r"^\w+ exit \S+$", helps, re.M)
    assert helps.count("usage:") == len(COMMANDS), helps
    # the notebooks' libraries are the `book` extra: without them the command lines still train
    absent = run("-c", "import importlib.util as u; print([u.find_spec(m) for m in "
                       "('pandas', 'altair', 'matplotlib')])")  # fmt: skip
    assert absent.strip() == "[None, None, None]", absent
    tiny = ["model.N=1", "model.d_model=16", "model.d_ff=32", "model.h=2", "max_steps=3"]
    sets = [arg for item in tiny for arg in ("--set", item)]
    run("-m", "annotated.cli.train", "--config", "copy", *sets, "--out", str(tmp_path / "run"),
        "--no-progress")  # fmt: skip
    assert (tmp_path / "run" / "checkpoints" / "ckpt_00000003.pt").is_file()
    # the licence travels with the package, as an SPDX expression and as the file itself, and
    # the distribution's version is the package's own
    meta = run(
        "-c",
        "import annotated; from importlib.metadata import distribution as d; "
        "m = d('annotated-transformer-book'); print(m.metadata['License-Expression']); "
        "print(any(f.name == 'LICENSE' for f in m.files)); print(m.version, annotated.__version__)",
    )
    licence, licence_file, version, own = meta.split()
    assert [licence, licence_file] == ["MIT", "True"], meta
    assert version == own, meta


def test_the_project_addresses_follow_the_book_s_repository():
    """pyproject.toml names the addresses that `repository.url` in _config.yml gives the book
    and its repository, as the README and the Colab badges do."""
    import tomllib
    import yaml

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    url = yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]["url"]
    owner, name = url.rstrip("/").split("/")[-2:]
    book = f"https://{owner}.github.io/{name}/"  # where GitHub Pages serves the book
    assert project["urls"] == {
        "Homepage": book,
        "Source": url,
        "Issues": f"{url}/issues",
    }


def test_each_command_line_runs_main_after_defining_everything():
    """`python -m annotated.cli.X` executes the module top to bottom: a function defined below
    the `if __name__ == "__main__"` block would not exist yet when main() calls it."""
    import ast

    for path in sorted((ROOT / "annotated" / "cli").glob("*.py")):
        body = ast.parse(path.read_text()).body
        if not any(isinstance(node, ast.FunctionDef) and node.name == "main" for node in body):
            continue  # not a command: the package's __init__, the shared epilogue
        guards = [i for i, node in enumerate(body) if "__main__" in ast.unparse(node)]
        assert guards == [len(body) - 1], f"{path.name}: the __main__ block must come last"
