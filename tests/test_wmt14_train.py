"""WMT14 training: the length-bucketed sampler, the task across ranks, automatic accumulation,
two processes against one with twice the accumulation, the launch helpers and the preparation
command line. Everything runs on the shared 10k-pair sample, on CPU."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from annotated.batching import BOS, EOS, PAD, BucketSampler
from annotated.errors import ConfigError, TrainingError
from annotated.experiments.throughput import measure_throughput
from annotated.training.config import micro_batches_per_process
from annotated.training.jobs import launch, slurm_script, torchrun_command
from annotated.training.registry import build_config
from annotated.training.task import TASKS

ROOT = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("ANNOTATED_DATA") or ROOT.parent / "shared" / "data").resolve()
TINY = ["model.N=1", "model.d_model=16", "model.d_ff=32", "model.h=2", "model.dropout=0"]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """A private cache with the sample prepared once (nothing is written into the shared data)."""
    folder = tmp_path_factory.mktemp("xdg-cache")
    env = dict(os.environ, ANNOTATED_DATA=str(SHARED), XDG_CACHE_HOME=str(folder))
    r = subprocess.run(
        [sys.executable, "-m", "annotated.cli.prepare", "--config", "wmt14-base"]
        + ["--set", "data.scale=sample"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "9,709 training pairs" in r.stdout
    return folder


@pytest.fixture
def sample_env(cache, monkeypatch):
    monkeypatch.setenv("ANNOTATED_DATA", str(SHARED))
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    return dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")


def test_bucket_sampler_respects_both_limits_and_covers_every_pair_once():
    rng = np.random.default_rng(0)
    lengths = np.stack([rng.integers(1, 60, 3000), rng.integers(1, 70, 3000)], 1)
    lengths[7] = [300, 5]  # longer than max_len: left out
    sampler = BucketSampler(lengths, budget=900, max_tokens=1200, max_len=128, seed=3)
    assert sampler.skipped == 1 and 7 not in sampler.kept
    epochs = [sampler.batches(e) for e in range(3)]
    for batches in epochs:
        ids = np.concatenate(batches)
        assert sorted(ids.tolist()) == sampler.kept.tolist()  # every kept pair, once
        for b in batches:
            real = lengths[b].sum(0)
            assert len(b) == 1 or real.max() <= 900
            assert len(b) * lengths[b].max() <= 1200  # padded tokens a side
    # the order depends on (seed, epoch) only
    assert [b.tolist() for b in epochs[1]] == [b.tolist() for b in sampler.batches(1)]
    assert [b.tolist() for b in epochs[0]] != [b.tolist() for b in epochs[1]]
    # batches are packed tightly: few micro-batches end far below the budget
    sizes = np.array([lengths[b].sum(0).max() for b in epochs[0]])
    assert np.mean(sizes > 900 - 140) > 0.9, np.mean(sizes)


def test_the_longer_side_fills_the_budget_and_the_other_holds_fewer():
    """Chapter 25's statement: whichever side fills first closes a micro-batch. With targets
    about a fifth longer than their sources, the targets come close to the budget and the
    sources hold correspondingly fewer tokens; neither side ever exceeds it."""
    rng = np.random.default_rng(1)
    source = rng.integers(5, 40, 5000)
    lengths = np.stack([source, np.round(source * 1.2).astype(int) + 1], 1)
    batches = BucketSampler(lengths, budget=1000, max_tokens=4096, max_len=128).batches(0)
    sums = np.array([lengths[b].sum(0) for b in batches])  # (micro-batches, 2)
    assert (sums <= 1000).all()
    assert np.median(sums[:, 1]) > 950  # the target side fills the budget
    assert np.median(sums[:, 0] / sums[:, 1]) < 0.9  # the source side holds fewer


def test_a_pair_over_the_budget_is_batched_alone():
    sampler = BucketSampler([[5, 5], [50, 40], [6, 6]], budget=20, max_tokens=64)
    batches = sorted(b.tolist() for b in sampler.batches(0))
    assert batches == [[0, 2], [1]]


def test_automatic_accumulation_and_its_checks():
    cfg = build_config("wmt14-base")  # 25,000 tokens a step, micro-batches of at most 32,768
    assert [micro_batches_per_process(cfg, w) for w in (1, 2, 4, 8)] == [1, 1, 1, 1]
    big = build_config("wmt14-big")
    assert [micro_batches_per_process(big, w) for w in (1, 2, 4, 8)] == [2, 1, 1, 1]
    smaller = build_config("wmt14-base", ["batch.max_tokens=8192"])  # a GPU with less memory
    assert [micro_batches_per_process(smaller, w) for w in (1, 2, 4, 8)] == [4, 2, 1, 1]
    assert micro_batches_per_process(build_config("wmt14-base", ["batch.accum=3"]), 8) == 3
    for bad, key in (
        (["batch.tokens_per_step=0"], "accum"),
        (["batch.tokens_per_step=-5", "batch.accum=1"], "tokens_per_step"),
        (["data.scale=huge"], "data"),
    ):
        with pytest.raises(ConfigError, match=key):
            build_config("wmt14-base", bad)


def test_paper_configurations():
    """The named WMT14 configurations are the paper's, as its text gives them (test_paper.py)."""
    from test_paper import SECTION_5_3, SECTION_5_4, TABLE_3, said

    base, big, enfr = (build_config(n) for n in ("wmt14-base", "wmt14-big", "wmt14-enfr-big"))
    columns = ("d_model", "d_ff", "h", "P_drop")
    for cfg, row in [(base, TABLE_3["base"]), (big, TABLE_3["big"])]:
        m = cfg.model
        assert (m.d_model, m.d_ff, m.h, m.dropout) == tuple(said(row, c) for c in columns)
    assert enfr.data.pair == "en-fr" and enfr.model.dropout == 0.1 and enfr.model.d_model == 1024
    paper = [said(SECTION_5_3, "warmup_steps"), said(SECTION_5_4, "epsilon_ls")]
    paper += [said(SECTION_5_3, "beta_2"), said(SECTION_5_3, "epsilon")]
    for c in (base, big, enfr):
        ours = [c.optim.warmup, c.loss.label_smoothing, c.optim.adam_beta2, c.optim.adam_eps]
        assert ours == paper
        assert c.batch.tokens_per_step == 25_000 and c.checkpoint_minutes == 10
        assert not c.model.norm_first  # post-norm, as in the paper
    assert (base.max_steps, base.keep_last, big.max_steps, big.keep_last) == (
        100_000,
        5,
        300_000,
        20,
    )


def test_task_visits_every_pair_once_per_epoch_across_ranks(sample_env):
    cfg = build_config(
        "wmt14-base", ["data.scale=sample", "batch.tokens_per_step=4000", "batch.max_tokens=2048"]
    )

    def steps(per_process, processes):
        task = TASKS["wmt14"](cfg, per_process * processes)
        out = []
        while not out or out[-1]:
            ids = []
            for rank in range(processes):
                for index in range(rank * per_process, (rank + 1) * per_process):
                    epoch, position = task.locate(len(out) * task.per_step + index)
                    ids += task.epoch(epoch)[position].tolist() if epoch == 0 else []
            out.append(sorted(ids))
        return out[:-1], task

    four_ranks, task = steps(1, 4)
    one_rank, _ = steps(4, 1)
    assert four_ranks == one_rank
    seen = sorted(i for s in four_ranks for i in s)
    assert seen == task.sampler.kept.tolist() and len(seen) == 9709
    # a micro-batch holds the encoded pairs, framed: source ... </s>, <s> target ... </s>
    batch = task.micro_batch(0, 0)
    first = task.epoch(0)[0][0]
    src, tgt = task.corpus.pair(first)
    assert batch.src[0][batch.src[0] != PAD].tolist() == [*src.tolist(), EOS]
    full_target = [BOS, *tgt.tolist(), EOS]
    assert batch.tgt[0][: len(full_target) - 1].tolist() == full_target[:-1]
    assert batch.src.shape[0] * batch.src.shape[1] <= 2048


def test_locate_walks_across_epochs(sample_env):
    cfg = build_config("wmt14-base", ["data.scale=sample", "batch.tokens_per_step=20000"])
    task = TASKS["wmt14"](cfg, 1)
    n0 = len(task.epoch(0))
    assert task.locate(n0 - 1) == (0, n0 - 1)
    assert task.locate(n0) == (1, 0)
    n1 = len(task.epoch(1))
    assert task.locate(n0 + n1 + 2) == (2, 2)


def _train(out: Path, env, *args, launcher=None):
    cmd = (launcher or [sys.executable, "-m"]) + ["annotated.cli.train", "--no-progress"]
    r = subprocess.run(cmd + list(args) + ["--out", str(out)], capture_output=True, text=True,
                       env=env, timeout=600)  # fmt: skip
    return r


def _sets(*items):
    return [a for item in items for a in ("--set", item)]


def test_two_processes_equal_one_process_with_twice_the_accumulation(sample_env, tmp_path):
    common = [
        "--config",
        "wmt14-base",
        *_sets("data.scale=sample", *TINY, "batch.tokens_per_step=1500"),
    ]
    common += _sets("batch.max_tokens=1024", "max_steps=4", "optim.warmup=2", "log_every=1")
    common += _sets("precision=fp32")  # auto measures on a CPU: two runs could choose apart
    one = _train(tmp_path / "one", sample_env, *common, *_sets("batch.accum=2"))
    assert one.returncode == 0, one.stderr[-3000:]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    torchrun += ["--nproc_per_node", "2", "-m"]
    two = _train(tmp_path / "two", sample_env, *common, *_sets("batch.accum=1"), launcher=torchrun)
    assert two.returncode == 0, two.stderr[-3000:]
    assert json.loads((tmp_path / "two" / "run.json").read_text())["world_size"] == 2

    def last(out):
        path = sorted((out / "checkpoints").glob("ckpt_*.pt"))[-1]
        return torch.load(path, weights_only=True)["model"]

    a, b = last(tmp_path / "one"), last(tmp_path / "two")
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-6, msg=k)
    losses = [
        [json.loads(line)["loss"] for line in open(out / "metrics.jsonl")]
        for out in (tmp_path / "one", tmp_path / "two")
    ]
    assert np.allclose(losses[0], losses[1], rtol=1e-5) and len(losses[0]) == 4


def test_resume_refuses_other_data_settings(sample_env, tmp_path):
    args = ["--config", "copy", *_sets("model.N=1", "model.d_model=16", "model.d_ff=32")]
    args += _sets("model.h=2", "max_steps=2", "data.batch_sentences=4")
    assert _train(tmp_path, sample_env, *args).returncode == 0
    for change in ("data.vocab=12", "data.batch_sentences=5"):
        r = _train(tmp_path, sample_env, *args, *_sets(change, "max_steps=3"), "--resume")
        another = "written by another run than the one asked for: its data."
        assert r.returncode == 2 and another in r.stderr, r.stderr


def test_prepare_command_line_messages(sample_env):
    def prepare(*args):
        return subprocess.run(
            [sys.executable, "-m", "annotated.cli.prepare", *args],
            capture_output=True,
            text=True,
            env=sample_env,
            timeout=300,
        )

    r = prepare("--config", "copy")
    assert r.returncode == 0 and "nothing to do" in r.stdout
    r = prepare("--config", "wmt14-base", "--set", "data.pair=en-xx")
    assert r.returncode == 2 and "en-xx" in r.stderr and "Traceback" not in r.stderr
    r = prepare("--config", "wmt14-enfr-big", "--set", "data.scale=sample")
    assert r.returncode == 2 and "English-German only" in r.stderr and "Traceback" not in r.stderr


def test_processes_preparing_at_once_take_turns(tmp_path):
    env = dict(os.environ, ANNOTATED_DATA=str(SHARED), XDG_CACHE_HOME=str(tmp_path))
    cmd = [sys.executable, "-m", "annotated.cli.prepare", "--config", "wmt14-base"]
    procs = [
        subprocess.Popen(
            cmd + ["--set", "data.scale=sample"], stdout=subprocess.PIPE, text=True, env=env
        )
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=600)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outputs
    fingerprints = {line.rsplit(" ", 1)[-1] for line in outputs}
    assert len(fingerprints) == 1, outputs


def test_torchrun_command_for_one_and_several_machines():
    one = torchrun_command("wmt14-base", "runs/x", gpus=8, overrides=["max_steps=10"])
    assert one[1:4] == ["-m", "annotated.cli.launch", "--nproc_per_node=8"]  # torchrun's options
    assert "--standalone" in one and one[-1] == "--no-progress"
    assert one[one.index("--set") + 1] == "max_steps=10"
    two = torchrun_command("wmt14-big", "runs/y", gpus=4, nodes=2, rendezvous="n1:29500")
    assert "--nnodes=2" in two and "--rdzv_endpoint=n1:29500" in two and "--standalone" not in two
    assert torchrun_command("copy", "runs/z", gpus=1, resume=True)[-1] == "--resume"
    with pytest.raises(ConfigError, match="rendezvous"):
        torchrun_command("wmt14-big", "runs/y", nodes=2)


def test_slurm_script_is_valid_bash_and_resumes(tmp_path):
    script = slurm_script(
        "wmt14-big", "runs/big run", nodes=4, overrides=["max_steps=10"], partition="gpu"
    )
    path = tmp_path / "job.sh"
    path.write_text(script)
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0
    assert "#SBATCH --nodes=4" in script and "#SBATCH --partition=gpu" in script
    assert "--nnodes=4 --nproc_per_node=8" in script
    assert "python -m annotated.cli.prepare --config wmt14-big --set max_steps=10" in script
    assert "--out 'runs/big run'" in script and "echo --resume" in script
    # torchrun as the single-machine command runs it (the book's launcher, which exits with the
    # trainers' code), through the environment's own Python
    assert "srun python -m annotated.cli.launch --nnodes=4" in script
    assert "srun torchrun" not in script
    # the data: on a folder every node sees, prepared on the first, then checked on every node
    lines = script.splitlines()
    prepare = "python -m annotated.cli.prepare --config wmt14-big --set max_steps=10"
    first, every = lines.index(prepare), lines.index(f"srun --ntasks-per-node=1 {prepare}")
    cache = lines.index('export XDG_CACHE_HOME="${XDG_CACHE_HOME:-$HOME/.cache}"')
    train = next(i for i, line in enumerate(lines) if "annotated.cli.launch" in line)
    assert lines.index("set -e  # a step that fails ends the job") < cache < first < every < train


def test_launch_streams_the_log_and_returns_the_records(tmp_path, capsys):
    out = tmp_path / "copy"
    command = [sys.executable, "-m", "annotated.cli.train", "--config", "copy", "--out", str(out)]
    command += _sets("model.N=1", "model.d_model=16", "model.d_ff=32", "model.h=2")
    command += _sets("max_steps=6", "log_every=2", "data.batch_sentences=4") + ["--no-progress"]
    records = launch(command, out, plot=False, refresh=0)
    assert [r["step"] for r in records] == [2, 4, 6]
    printed = capsys.readouterr().out
    assert printed.startswith("$ python -m annotated.cli.train") and "done: step 6/6" in printed
    assert printed.count("target tokens/s\n") == 3
    with pytest.raises(TrainingError, match="exited with code 2"):
        launch(command, out, plot=False)  # the folder holds a run: the trainer refuses
    assert "already holds checkpoints" in capsys.readouterr().out


def test_measure_throughput_reports_a_step():
    cfg = build_config("copy", ["model.N=1", "model.d_model=16", "model.d_ff=32", "model.h=2"])
    m = measure_throughput(cfg, steps=2, device="cpu")
    assert m["seconds_per_step"] > 0 and m["target_tokens_per_s"] > 0
    task = TASKS["copy"](cfg)  # the timed steps are 1 and 2; step 0 warms up
    assert (
        m["target_tokens_per_step"]
        == (task.micro_batch(1, 0).ntokens + task.micro_batch(2, 0).ntokens) / 2
    )
    assert 0 < m["mfu"] < 1 and m["micro_batches_per_step"] == 1
    assert m["projected_hours"] == pytest.approx(cfg.max_steps * m["seconds_per_step"] / 3600)


def test_slurm_script_requeues_itself_and_stops_the_trainers_before_the_time_limit(tmp_path):
    """SLURM's USR1 ahead of the time limit: the script asks for a requeue and passes SIGTERM
    on, and exits with the trainers' own code. srun, scontrol and python are stand-ins here:
    the trainer's stand-in exits 75 on SIGTERM, as the real one does after saving."""
    bin_dir, log = tmp_path / "bin", tmp_path / "calls.log"
    bin_dir.mkdir()
    fakes = {
        "srun": 'while [[ "$1" == --* ]]; do shift; done; exec "$@"',
        "scontrol": f'echo "scontrol $*" >> {log}; [ "$1" = show ] && echo node1; true',
        "python": f'echo "python $*" >> {log}\n'
        'if [[ "$*" == *annotated.cli.train* ]]; then\n'
        f"  trap 'echo \"trainer got TERM\" >> {log}; exit 75' TERM\n"
        "  while true; do sleep 0.1; done\nfi",
    }
    for name, body in fakes.items():
        (bin_dir / name).write_text(f"#!/bin/bash\n{body}\n")
        (bin_dir / name).chmod(0o755)
    script = tmp_path / "job.sh"
    script.write_text(slurm_script("wmt14-base", str(tmp_path / "run"), nodes=1))
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", SLURM_JOB_ID="42")
    job = subprocess.Popen(["bash", str(script)], env=env, cwd=tmp_path, start_new_session=True)
    deadline = time.time() + 30
    try:
        while "annotated.cli.train" not in (log.read_text() if log.exists() else ""):
            assert time.time() < deadline and job.poll() is None, "the trainer never started"
            time.sleep(0.05)
        job.send_signal(signal.SIGUSR1)
        assert job.wait(timeout=30) == 75
    finally:
        try:  # whatever happened, nothing of the job outlives the test
            os.killpg(job.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    calls = log.read_text()
    assert "scontrol requeue 42" in calls and "trainer got TERM" in calls, calls
    assert "#SBATCH --requeue" in script.read_text() and "--signal=B:USR1@300" in script.read_text()
