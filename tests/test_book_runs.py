"""Appendix A9's shared runs: `book_run` trains a run once, reuses it when a later chapter asks
for the same one, resumes it when it was interrupted, and starts again when asked for another."""

import json

from annotated.checkpoints import checkpoint_paths
from annotated.experiments.book_runs import book_run, finished

TINY = ["model.N=1", "model.d_model=16", "model.d_ff=32", "model.h=2", "data.batch_sentences=4"]


def test_a_run_is_trained_once_reused_resumed_and_replaced(tmp_path):
    out = tmp_path / "runs" / "copy"
    settings = [*TINY, "max_steps=6", "checkpoint_every=2"]
    assert book_run("copy", out, settings, minutes=5) == out and finished(out)
    first = {p.name: p.stat().st_mtime_ns for p in checkpoint_paths(out)}
    assert max(int(name[5:13]) for name in first) == 6
    book_run("copy", out, settings, minutes=5)  # asked again: reused, nothing trained
    assert {p.name: p.stat().st_mtime_ns for p in checkpoint_paths(out)} == first
    # interrupted after step 4: the newest checkpoint gone, the run resumes from step 4
    newest = checkpoint_paths(out)[-1]
    newest.unlink()
    assert not finished(out)
    book_run("copy", out, settings, minutes=5)
    assert finished(out) and checkpoint_paths(out)[-1].name == newest.name
    history = json.loads((out / "run.json").read_text())["history"]
    assert [h["until_step"] for h in history] == [4]  # one earlier segment, to step 4
    # another run asked for in the same folder: the old one is replaced, not resumed
    book_run("copy", out, [*TINY, "max_steps=4", "checkpoint_every=2"], minutes=5)
    record = json.loads((out / "run.json").read_text())
    assert record["config"]["max_steps"] == 4 and record["history"] == []
    assert [p.name for p in checkpoint_paths(out)][-1] == "ckpt_00000004.pt"
