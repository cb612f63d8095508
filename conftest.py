"""Settings for every pytest run, including `pytest --nbval notebooks/` on its own."""

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent
os.environ.setdefault("ANNOTATED_BOOK", "1")  # notebooks store charts as the book renders them
_shared = ROOT.parent / "shared" / "data"
if _shared.is_dir():  # tests and CI read the offline copies; nothing is downloaded
    os.environ.setdefault("ANNOTATED_DATA", str(_shared))


# Notebooks under another CPU's kernels: with ANNOTATED_NOTEBOOK_CPU=other (`make test` sets it),
# each notebook's kernel starts under tools/other_cpu.py's settings and two threads, so that CI
# executes every notebook once, and under kernels other than the machine's best: a stored output
# that depends on them fails there. The unit tests, and their subprocesses, keep the machine's own.
_notebook_env: dict[str, str] = {}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    """nbval starts a notebook's kernel while its first cell is set up: it inherits os.environ."""
    if os.environ.get("ANNOTATED_NOTEBOOK_CPU") != "other" or item.path.suffix != ".ipynb":
        yield
        return
    if not _notebook_env:
        import sys

        sys.path.insert(0, str(ROOT / "tools"))
        from other_cpu import settings

        _notebook_env.update(settings(), OMP_NUM_THREADS="2", OMP_WAIT_POLICY="PASSIVE")
    saved = {k: os.environ.get(k) for k in _notebook_env}
    os.environ.update(_notebook_env)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


# After a full run of the suite (`make test`: every test path, nothing selected or deselected, no
# failure), its wall time and its 15 slowest tests are kept in results/test-runs/, one file per
# kind of CPU, with their provenance (README's table of times reads them).
_SLOWEST = 15
_durations: list[tuple[float, str, str]] = []
_started = []


def pytest_sessionstart(session):
    import time

    _started.append(time.perf_counter())


def pytest_runtest_logreport(report):
    _durations.append((report.duration, report.nodeid, report.when))


def _full_run(config) -> bool:
    option = config.option
    selected = option.keyword or option.markexpr or getattr(option, "deselect", None)
    return config.args_source == config.ArgsSource.TESTPATHS and not selected


def pytest_sessionfinish(session, exitstatus):
    if hasattr(session.config, "workerinput") or exitstatus != 0 or not _full_run(session.config):
        return
    import json
    import re
    import sys
    import time

    sys.path.insert(0, str(ROOT / "tools"))
    from timed import cpu

    from annotated.files import write_text_atomic
    from annotated.provenance import provenance

    machine = cpu()
    slowest = sorted(_durations, reverse=True)[:_SLOWEST]
    record = provenance("make test", "cpu") | {"cpu": machine, "cpus": os.cpu_count()}
    record |= {
        "wall_s": round(time.perf_counter() - _started[0], 1),
        "tests": session.testscollected,
        "slowest": [{"test": n, "phase": w, "seconds": round(d, 1)} for d, n, w in slowest],
    }
    name = re.sub(r"[^a-z0-9]+", "-", machine["model"].lower()).strip("-") or "cpu"
    out = ROOT / "results" / "test-runs" / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out, json.dumps(record, indent=1) + "\n")
