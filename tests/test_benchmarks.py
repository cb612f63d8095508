"""The benchmark runs end to end in its short mode (timings are reported, never asserted)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from annotated.batching import PAD, Batch
from annotated.experiments.throughput import model_flops
from annotated.model import make_model
from annotated.precision import BF16_MARGIN

ROOT = Path(__file__).resolve().parent.parent


def test_train_step_benchmark_quick(tmp_path):
    out = tmp_path / "bench.json"
    # as on a GPU machine with only torch: the package's other dependencies cannot be imported
    blocked = ["tqdm", "sentencepiece", "sacrebleu", "sacremoses", "pandas", "altair", "matplotlib"]
    code = (
        f"import runpy, sys; sys.modules.update(dict.fromkeys({blocked!r})); "
        f"sys.argv = ['train_step.py', '--quick', '--json', {str(out)!r}]; "
        f"runpy.run_path({str(ROOT / 'benchmarks' / 'train_step.py')!r}, run_name='__main__')"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    report = json.loads(out.read_text())
    # a CPU times fp32, and bf16 beside it where bf16 matrix multiplies pass the trainer's test
    pays = report["bf16_matmul_speedup"] >= BF16_MARGIN
    assert list(report["training"]) == (["fp32", "bf16"] if pays else ["fp32"])
    res = report["training"]["fp32"]["results"]
    assert list(res) == [
        "reference",
        "+ fused attention",
        "+ fused loss",
        "+ cheap dropout",
        "fast path (+ fused Adam)",
        "torch.nn.Transformer",
    ]
    assert res["reference"]["speed_vs_reference"] == 1.0
    assert all(v["target_tokens_per_s"] > 0 and 0 < v["mfu"] < 1 for v in res.values())
    assert {"command", "commit", "date", "device", "torch"} <= set(report)
    cpu = report["cpu"]  # what the figures depend on besides the code
    assert cpu["kind"] in ("bf16 units", "AVX-512", "AVX2", "other") and cpu["threads"] >= 1
    assert cpu["pytorch_kernels"] and isinstance(report["busy"], bool)
    for training in report["training"].values():  # each path's spread, and which were unsteady
        spreads = {k: r["spread"] for k, r in training["results"].items()}
        assert all(s >= 0 for s in spreads.values())
        assert training["unsteady"] == [k for k, s in spreads.items() if s > 0.10]
        assert len(training["fast_vs_torch_by_round"]) == report["training"]["fp32"]["rounds"]
    if pays:
        assert list(report["training"]["bf16"]["results"]) == list(res)
    dec = report["decoding"]
    assert dec["output_tokens"] == 10 and dec["sentences"] == 4
    for beam in ("beam 1", "beam 4"):
        assert list(dec[beam]) == [
            "book, cached",
            "book, uncached",
            "torch.nn.Transformer, uncached",
        ]
        assert all(r["sentences_per_s"] > 0 for r in dec[beam].values())


def test_gpu_suite_without_a_gpu_says_so_and_runs_nothing(tmp_path):
    out = tmp_path / "suite.json"
    r = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_suite.py"), "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )
    assert r.returncode == 0 and "no CUDA device" in r.stdout, r.stderr
    assert not out.exists()


def test_gpu_suite_trains_the_gpu_profile_then_scores_it_only_if_training_succeeded(
    tmp_path, monkeypatch
):
    """The multi30k part: the profile's own budget (no overrides), then evaluate's scores into
    the report; a failed training is reported and not evaluated."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_suite

    calls = []

    def fake_run(cmd, timeout, code=0):
        calls.append(cmd)
        if "annotated.cli.evaluate" in cmd:
            results = Path(cmd[cmd.index("--results") + 1])
            results.mkdir(parents=True)
            tests = {"test2016": {"tokenized_lowercased_bleu": 40.5}}
            (results / "results.json").write_text(json.dumps({"evaluation": {"tests": tests}}))
        return {"command": " ".join(cmd), "returncode": code}

    monkeypatch.setattr(gpu_suite, "run", fake_run)
    part = gpu_suite.multi30k(tmp_path, tmp_path / "res")
    train, evaluate = calls
    assert train[train.index("--config") + 1] == "multi30k" and "--set" not in train
    assert evaluate[evaluate.index("--run") + 1] == train[train.index("--out") + 1]
    assert part["scores"]["test2016"]["tokenized_lowercased_bleu"] == 40.5

    calls.clear()
    monkeypatch.setattr(gpu_suite, "run", lambda cmd, timeout: fake_run(cmd, timeout, code=1))
    part = gpu_suite.multi30k(tmp_path / "again", None)
    assert len(calls) == 1 and "evaluate" not in part and part["train"]["returncode"] == 1


def test_model_flops_counts_real_tokens_only():
    cfg = dict(vocab=50, N=2, d_model=8, d_ff=16)
    src = torch.tensor([[5, 6, 7, PAD], [5, 6, PAD, PAD]])
    tgt = torch.tensor([[1, 5, 6, 2, PAD], [1, 5, 2, PAD, PAD]])
    b = Batch(src, tgt, PAD)
    s, t = [3, 2], [3, 2]  # real source tokens; real target tokens (tgt_y)
    d, dff, V, N = 8, 16, 50, 2
    linear = 6 * (
        N * (4 * d * d + 2 * d * dff) * sum(s)
        + N * ((6 * d * d + 2 * d * dff) * sum(t) + 2 * d * d * sum(s))
        + d * V * sum(t)
    )
    pairs = N * sum(si * si + ti * (ti + 1) / 2 + ti * si for si, ti in zip(s, t))
    assert model_flops(b, **cfg) == linear + 12 * d * pairs
    wider = Batch(
        torch.cat([src, torch.full((2, 3), PAD)], 1),
        torch.cat([tgt, torch.full((2, 3), PAD)], 1),
        PAD,
    )
    # padding costs no model FLOPs
    assert model_flops(wider, **cfg) == model_flops(b, **cfg)


@pytest.mark.parametrize("d_k", [0, 2, 6])
def test_model_flops_counts_the_weights_of_the_model_it_describes(d_k):
    """6 FLOPs per weight of every linear layer and per token it meets (sources for the encoder
    and the cross-attention's keys and values, targets for the rest), for any d_k."""
    shape = dict(N=2, d_model=8, d_ff=16, h=2, d_k=d_k)
    model = make_model(50, 50, **shape)
    src = torch.tensor([[5, 6, 7, PAD], [5, 6, PAD, PAD]])
    tgt = torch.tensor([[1, 5, 6, 2, PAD], [1, 5, 2, PAD, PAD]])
    b = Batch(src, tgt, PAD)
    s, t = [3, 2], [3, 2]
    linear = 0
    for name, layer in model.named_modules():
        if isinstance(layer, torch.nn.Linear):
            meets_sources = name.startswith("encoder") or ".src_attn.w_k" in name
            meets_sources = meets_sources or ".src_attn.w_v" in name
            linear += 6 * layer.weight.numel() * sum(s if meets_sources else t)
    q = 2 * (d_k or 4)  # h d_k: the width of a query or key
    pairs = 2 * sum(si * si + ti * (ti + 1) / 2 + ti * si for si, ti in zip(s, t))
    assert model_flops(b, vocab=50, **shape) == linear + 6 * (q + 8) * pairs


def test_a_cpu_is_filed_under_the_kind_its_kernels_make_it(monkeypatch):
    """An older CPU's kernels asked for with ATEN_CPU_CAPABILITY are named, as emulation."""
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import machine

    monkeypatch.setattr(machine, "cpu_flags", lambda: {"avx2", "avx512f", "avx512_bf16"})
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    assert machine.describe_cpu()["kind"] == "bf16 units"
    monkeypatch.setattr(machine, "cpu_flags", lambda: {"avx2", "fma"})
    assert machine.describe_cpu()["kind"] == "AVX2"
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    monkeypatch.setattr(machine, "cpu_flags", lambda: {"avx2", "avx512f"})
    cpu = machine.describe_cpu()
    assert cpu["kind"] == "avx2 kernels emulated on AVX-512" and cpu["limits"]
    assert machine.file_name(cpu, "multi30k-cpu") == (
        "cpu-avx2-kernels-emulated-on-avx-512-multi30k-cpu.json"
    )


# A stand-in for harvardnlp's the_annotated_transformer.py, written for this test: the same names
# and calling conventions, built from this book's modules, after top-level imports that are not
# installed here (as spaCy, torchtext and GPUtil are not), which the loader must skip.
STAND_IN = """
import spacy_is_not_installed_here
from GPUtil_neither import showUtilization


def make_model(src_vocab, tgt_vocab, N=6, d_model=512, d_ff=2048, h=8, dropout=0.1):
    from annotated.model import make_model as book_model

    return book_model(src_vocab, tgt_vocab, N=N, d_model=d_model, d_ff=d_ff, h=h,
                      dropout=dropout, norm_first=True)


class Batch:
    def __init__(self, src, tgt=None, pad=2):
        from annotated.batching import Batch as BookBatch

        b = BookBatch(src, tgt, pad)
        self.src, self.src_mask, self.tgt, self.tgt_mask = b.src, b.src_mask, b.tgt, b.tgt_mask
        self.tgt_y = b.tgt_y


class LabelSmoothing(nn.Module):
    def __init__(self, size, padding_idx, smoothing=0.0):
        super().__init__()
        from annotated.loss import LabelSmoothing as BookLoss

        self.book = BookLoss(size, padding_idx, smoothing)

    def forward(self, x, target):
        return self.book(x, target)


class SimpleLossCompute:
    def __init__(self, generator, criterion):
        self.generator, self.criterion = generator, criterion

    def __call__(self, x, y, norm):
        x = self.generator(x)
        loss = self.criterion(x.reshape(-1, x.size(-1)), y.reshape(-1)) / norm
        return loss.data * norm, loss


def unused_helper():
    return showUtilization()
""" + "".join(
    f"\n\ndef {name}():\n    pass\n"
    for name in (
        "EncoderDecoder Generator clones Encoder LayerNorm SublayerConnection EncoderLayer "
        "Decoder DecoderLayer subsequent_mask attention MultiHeadedAttention "
        "PositionwiseFeedForward Embeddings PositionalEncoding"
    ).split()
)


def train_step_cli(*args: str) -> subprocess.CompletedProcess:
    script = str(ROOT / "benchmarks" / "train_step.py")
    return subprocess.run([sys.executable, script, *args], capture_output=True, text=True,
                          timeout=300)  # fmt: skip


def test_the_annotated_transformers_code_is_timed_from_a_checkout(tmp_path):
    """--annotated-transformer FILE adds harvardnlp's step, from the definitions it needs alone,
    records which file was timed (its sha256) and no path of this machine, and gives the ratio
    the speed goals name, round by round."""
    import hashlib

    checkout = tmp_path / "checkout"
    checkout.mkdir()
    code = checkout / "the_annotated_transformer.py"
    code.write_text(STAND_IN)
    out = tmp_path / "bench.json"
    args = ["--quick", "--no-decode", "--no-data", "--precision", "fp32", "--json", str(out)]
    r = train_step_cli(*args, "--annotated-transformer", str(code))
    assert r.returncode == 0, r.stderr[-2000:]
    report = json.loads(out.read_text())
    assert str(tmp_path / "checkout") not in report["command"]
    assert "CHECKOUT/the_annotated_transformer.py" in report["command"]
    origin = report["annotated_transformer"]
    assert origin["sha256"] == hashlib.sha256(STAND_IN.encode()).hexdigest()
    assert origin["git_commit"] is None  # not a git checkout
    training = report["training"]["fp32"]
    assert "Annotated Transformer (harvardnlp)" in training["results"]
    by_round = training["fast_vs_annotated_transformer_by_round"]
    assert len(by_round) == training["rounds"] and all(x > 0 for x in by_round)
    assert report["best"]["fast path vs Annotated Transformer"] > 0
    assert "fast path vs the Annotated Transformer's code" in r.stdout


def test_a_file_that_is_not_the_annotated_transformer_is_refused(tmp_path):
    """Exit code 2 and a message naming what is missing and where to get the real file."""
    wrong = tmp_path / "the_annotated_transformer.py"
    wrong.write_text("def make_model():\n    pass\n")
    for given, says in [(wrong, "does not define Batch"), (tmp_path / "absent.py", "Could not")]:
        r = train_step_cli("--quick", "--annotated-transformer", str(given))
        assert r.returncode == 2 and says in r.stderr, r.stderr
        assert "github.com/harvardnlp/annotated-transformer" in r.stderr
        assert "Traceback" not in r.stderr


def test_the_cpu_profile_runs_under_an_older_cpus_kernels(tmp_path):
    """cpu_profile_by_kind.py trains the CPU profile's own command line under AVX2 kernels for a
    few seconds, scores it, and files the row under the emulated kind; a kind it does not know
    is refused with exit code 2."""
    script = str(ROOT / "benchmarks" / "cpu_profile_by_kind.py")
    where = ["--runs", str(tmp_path / "runs"), "--results", str(tmp_path / "results")]
    r = subprocess.run(
        [sys.executable, script, "--kinds", "avx2", "--minutes", "0.05", "--limit", "40", *where],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads((tmp_path / "results" / "summary.json").read_text())
    row = summary["kinds"]["avx2"]
    assert row["kind"].startswith("avx2 kernels emulated on")
    assert row["cpu"]["pytorch_kernels"] == "AVX2" and row["precision"] == "fp32"
    assert 0 < row["steps"] < 2600 and row["training_seconds"] < 60  # stopped by its minutes
    assert row["test2016_sentences"] == 40  # --limit: the test scores a few sentences
    run = json.loads((tmp_path / "results" / "avx2" / "results.json").read_text())
    assert run["training"]["steps"] == row["steps"]
    assert "--set max_minutes=0.05" in run["provenance"]["training_command"]
    assert len(row["matmul_tflops_before_after"]) == 2 and isinstance(summary["host_drift"], bool)
    bad = subprocess.run([sys.executable, script, "--kinds", "sse"], capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown kind sse" in bad.stderr


def test_two_runs_agree_when_their_figures_are_within_ten_percent(tmp_path):
    """--against: the fast path's ratios and its time, this run over the earlier one's; a ratio
    20% off is a disagreement, and a file that cannot be read is refused."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import train_step

    def run(s_per_step, vs_torch):
        results = {train_step.FAST: {"median_s_per_step": s_per_step}}
        return {"training": {"fp32": {"results": results, "fast_vs_torch": vs_torch}}}

    near = train_step.agreement(run(0.25, 1.6), run(0.20, 1.55))["fp32"]
    assert near["agree"] and list(near["ratios"]) == ["fast_vs_torch"]  # the ratios agree...
    assert abs(near["fast_path_time"] - 1.25) < 1e-9 and not near["time_agrees"]  # ...the time not
    assert not train_step.agreement(run(0.20, 1.9), run(0.20, 1.55))["fp32"]["agree"]
    assert train_step.agreement(run(0.2, 1.6), {"training": {}}) == {}  # nothing to compare
    r = train_step_cli("--quick", "--against", str(tmp_path / "absent.json"))
    assert r.returncode == 2 and "Could not read the earlier run" in r.stderr
    assert "Traceback" not in r.stderr


def test_the_benchmark_presets_measure_the_registrys_models(monkeypatch):
    """A preset named for a configuration times that configuration's model, read from the table:
    change a row of the registry and the benchmark follows."""
    from annotated.training.registry import CONFIGS, build_config

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import train_step

    named = {"multi30k-small": "multi30k-small", "base": "wmt14-base", "big": "wmt14-big"}
    named |= {p: p for p in train_step.PRESETS if p in CONFIGS}
    assert set(named) == set(train_step.PRESETS) - {"quick"}
    for preset, config in named.items():
        m, p = build_config(config).model, train_step.PRESETS[preset]
        assert (p["N"], p["d_model"], p["d_ff"], p["h"]) == (m.N, m.d_model, m.d_ff, m.h), preset
        assert p["norm_first"] == m.norm_first, preset


def test_trainer_overhead_times_the_trainer_against_a_bare_loop_of_the_same_run(tmp_path):
    """benchmarks/trainer_overhead.py: both loops train the same run; the report holds each
    round, the medians and the ratio (the figure is reported, never asserted)."""
    out = tmp_path / "overhead.json"
    command = [sys.executable, str(ROOT / "benchmarks" / "trainer_overhead.py"), "--steps", "8"]
    command += ["--rounds", "1", "--json", str(out)]
    r = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["steps"] == 8 and report["settings"][-3:] == [
        "max_steps=8", "checkpoint_every=8", "precision=fp32",
    ]  # fmt: skip
    rounds = report["rounds"]
    assert all(len(v) == 1 and v[0] > 0 for v in rounds.values())
    assert report["ratio"] == rounds["trainer_s"][0] / rounds["bare_loop_s"][0]
    assert "x the bare loop" in r.stdout and report["commit"]
