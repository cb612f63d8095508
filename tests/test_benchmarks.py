"""The benchmark runs end to end in its short mode (timings are reported, never asserted)."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_train_step_benchmark_quick(tmp_path):
    out = tmp_path / "bench.json"
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "train_step.py"), "--quick", "--json", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    report = json.loads(out.read_text())
    assert set(report["results"]) == {"reference", "fast", "torch.nn.Transformer"}
    assert report["results"]["reference"]["speed_vs_reference"] == 1.0
    assert all(v["target_tokens_per_s"] > 0 for v in report["results"].values())
    assert {"command", "commit", "date", "device"} <= set(report)
