"""Chapter 6: Table 1 measured. Counted work and memory follow the table; the toy task shows
each layer type's reach."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from annotated.experiments.charts import layer_costs_figure
from annotated.experiments.table1 import (
    LAYERS,
    dependency_accuracy,
    layer_costs,
    multiply_adds,
    saved_bytes,
)

ROOT = Path(__file__).resolve().parent.parent


def test_work_of_attention_equals_an_lstm_at_twice_the_width():
    d = 64
    for n in (d, 2 * d, 4 * d):
        attention, recurrent = (
            multiply_adds("self-attention", n, d),
            multiply_adds("recurrent", n, d),
        )
        assert (attention < recurrent, attention == recurrent) == (n < 2 * d, n == 2 * d)
    assert multiply_adds("convolutional", 10, 4, k=5) == 5 * 10 * 16


def test_saved_bytes_counts_activations_and_leaves_out_weights():
    x = torch.randn(2, 12, 8, requires_grad=True)
    conv = LAYERS["convolutional"](8)
    assert saved_bytes(conv, x) == x.numel() * 4  # a convolution keeps its input, nothing else
    linear = torch.nn.Linear(8, 8)
    assert saved_bytes(linear, x) == x.numel() * 4  # its weight is not counted
    attention = LAYERS["self-attention"](8)
    small, large = (saved_bytes(attention, torch.randn(1, n, 8)) for n in (64, 128))
    assert 3.5 < large / small <= 4  # n x n weights per head dominate once n >> d


def test_layer_costs_and_the_figure():
    rows = layer_costs([8, 16], 8, batch=2)
    assert [(r["layer"], r["n"]) for r in rows] == [(k, n) for k in LAYERS for n in (8, 16)]
    assert all(r["seconds"] > 0 and r["saved MB"] > 0 for r in rows)
    assert rows[0]["multiply-adds"] == 2 * multiply_adds("self-attention", 8, 8)
    fig = layer_costs_figure(rows, 8)
    assert len(fig.axes) == 3
    assert all(len(ax.lines) == len(LAYERS) + 1 for ax in fig.axes)  # a line each, and n = d


def test_reach_of_each_layer_type():
    assert dependency_accuracy("self-attention", 16, steps=150) > 0.9
    assert dependency_accuracy("convolutional", 1, layers=1, steps=150) > 0.9
    assert dependency_accuracy("convolutional", 3, layers=1, steps=150) < 0.3  # out of sight


@pytest.mark.parametrize("bad", [["--d", "6"], ["--max-n", "8"]])
def test_benchmark_refuses_bad_sizes(tmp_path, bad):
    command = [sys.executable, str(ROOT / "benchmarks" / "layer_costs.py"), "--out", str(tmp_path)]
    r = subprocess.run(command + bad, capture_output=True, text=True)
    assert r.returncode == 2 and "error:" in r.stderr and "Traceback" not in r.stderr


def test_benchmark_writes_json_with_provenance_and_the_figure(tmp_path):
    command = [sys.executable, str(ROOT / "benchmarks" / "layer_costs.py"), "--out", str(tmp_path)]
    r = subprocess.run(command + ["--d", "8", "--max-n", "32"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    report = json.loads((tmp_path / "cpu.json").read_text())
    assert {"command", "commit", "date", "device", "torch"} <= set(report)
    assert sorted({row["n"] for row in report["rows"]}) == [16, 32] and report["d"] == 8
    assert (tmp_path / "cpu.png").read_bytes()[:4] == b"\x89PNG"
    assert not list(tmp_path.glob("*.tmp"))
