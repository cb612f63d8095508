"""Sentences per second of translating a real test set, by the book's `translate` and by the engines
people deploy with, on the same model and sentences: a trained run's averaged checkpoints translate
the first sentences of its task's first test set, at beams 1 and 4 (alpha 0.6, input + 50).

    python benchmarks/translate_speed.py --run runs/multi30k-cpu --json results/benchmarks/x.json

Engines: `book` (PyTorch, the package's translate), `ctranslate2` (fp32), `ctranslate2-int8`
(weights in 8 bits), `onnx` (ONNX Runtime under the book's beam search). Each is timed over
`--rounds` rounds after one warm-up round; the median is reported with the spread. Each engine runs
in a fresh process of its own: two thread pools in one process (PyTorch's and CTranslate2's each
wait for work by spinning for a while) slow each other down, by a quarter for the book's beam 4
when measured here. Beside the speed, each engine's agreement with the book: identical outputs,
and sacreBLEU on the references.
With `--engines book` it uses only the package's stable reader API (load_model, translate), so the
same file measures an older commit of the package too: copy it into that checkout and run it there.
`--device cuda` runs the book (bf16, as `translate` chooses on a GPU) and CTranslate2 (bf16) on the
GPU; ONNX Runtime runs on the CPU only. CTranslate2's PyPI wheels load CUDA 12's cuBLAS
(libcublas.so.12), which the machine must have.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from annotated.checkpoints import checkpoint_paths
from annotated.evaluation.translation import load_model, translate
from annotated.files import write_text_atomic
from annotated.precision import fast_decoding
from annotated.provenance import provenance
from annotated.training.task import TASKS

ENGINES = ("book", "ctranslate2", "ctranslate2-int8", "onnx")


def translator(name: str, model, tokenizer, folder: Path, threads: int, device: str = "cpu"):
    """(sentences, beam) -> translations, by engine `name` on `device` (cpu or cuda)."""
    if name == "book":

        def book(sentences, beam):
            with fast_decoding(model):
                return translate(model, tokenizer, sentences, beam_size=beam)

        return book
    if name.startswith("ctranslate2"):
        import ctranslate2

        from annotated.deploy.ctranslate2_model import ctranslate2_translate, export_ctranslate2

        quantization = "int8" if name == "ctranslate2-int8" else None
        path = export_ctranslate2(model, tokenizer, folder / name, quantization=quantization)
        where = {"device": device, "compute_type": "bfloat16"} if device == "cuda" else {}
        t = ctranslate2.Translator(str(path), intra_threads=threads, **where)
        # one call for all sentences, without exact per-sentence limits: as its users call it
        return lambda s, beam: ctranslate2_translate(t, tokenizer, s, beam_size=beam,
                                                     exact_limits=False)  # fmt: skip
    from annotated.deploy.onnx_model import OnnxTranslator, export_onnx

    runner = OnnxTranslator(export_onnx(model, tokenizer, folder / "onnx"), threads=threads)
    return lambda s, beam: runner.translate(s, beam_size=beam)


def timed(run, sources, beam: int, rounds: int) -> tuple[list[str], list[float]]:
    outputs = run(sources, beam)  # warm-up: first-call allocations and thread pools
    seconds = []
    for _ in range(rounds):
        start = time.perf_counter()
        run(sources, beam)
        seconds.append(time.perf_counter() - start)
    return outputs, seconds


def engine_alone(
    name: str, run_folder: Path, sentences: int, threads: int, rounds: int, device: str = "cpu"
) -> dict:
    """In a fresh process: one engine's outputs and seconds at beams 1 and 4."""
    torch.set_num_threads(threads)
    model, tokenizer, _, sources, _ = first_test_sentences(run_folder, sentences)
    if name == "book":
        model = model.to(device)
    with tempfile.TemporaryDirectory() as folder:
        run = translator(name, model, tokenizer, Path(folder), threads, device)
        return {beam: timed(run, sources, beam, rounds) for beam in (1, 4)}


def first_test_sentences(run_folder: Path, sentences: int):
    """The run's averaged model, its tokenizer, and its first test set's name, first sentences
    and their references."""
    model, tokenizer, cfg = load_model(checkpoint_paths(run_folder))
    test, load = next(iter(TASKS[cfg.task].test_sets(cfg).items()))
    pairs = load()[:sentences]
    return model, tokenizer, test, [s for s, _ in pairs], [r for _, r in pairs]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--run", type=Path, required=True, help="a training run's --out folder")
    ap.add_argument("--sentences", type=int, default=1000)
    ap.add_argument("--engines", default=",".join(ENGINES), help=f"of {', '.join(ENGINES)}")
    ap.add_argument("--rounds", type=int, default=5, help="timed rounds per engine and beam")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    names = [n for n in args.engines.split(",") if n]
    if "book" not in names or set(names) - set(ENGINES):
        ap.error(f"--engines: a comma-separated list of {', '.join(ENGINES)}, with book")
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: this machine's PyTorch sees no GPU; use --device cpu")
    if args.device == "cuda" and "onnx" in names:
        ap.error(
            "--engines onnx runs on the CPU only (onnxruntime); leave it out with --device cuda"
        )
    names = ["book"] + [n for n in names if n != "book"]  # the book's outputs are the reference
    _, _, test, sources, references = first_test_sentences(args.run, args.sentences)
    command = "python benchmarks/translate_speed.py " + " ".join(argv or sys.argv[1:])
    report = provenance(command, torch.device(args.device))
    report.update(test_set=test, sentences=len(sources), threads=args.threads, rounds=args.rounds)
    report["engine_device"] = args.device
    report["processes"] = "one per engine"
    report["checkpoints"] = len(checkpoint_paths(args.run))
    measured = {}
    for name in names:
        context = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as pool:
            job = (name, args.run, args.sentences, args.threads, args.rounds, args.device)
            measured[name] = pool.submit(engine_alone, *job).result()
    report["engines"] = summarise(measured, len(sources), references)
    report["ratios"] = ratios(report["engines"])
    for key, value in report["ratios"].items():
        print(f"{key}: {value:.2f}")
    if args.json:
        write_text_atomic(args.json, json.dumps(report, indent=2) + "\n")
    return 0


def summarise(measured: dict, n: int, references) -> dict:
    """name -> beam -> speed, spread, agreement with the book and sacreBLEU."""
    from annotated.bleu_scores import sacrebleu_score

    results: dict = {}
    for beam in (1, 4):
        book = measured["book"][beam][0]
        for name, per_beam in measured.items():
            outputs, seconds = per_beam[beam]
            median = statistics.median(seconds)
            results.setdefault(name, {})[f"beam {beam}"] = r = {
                "seconds_median": median,
                "seconds": seconds,
                "spread": (max(seconds) - min(seconds)) / median,
                "sentences_per_s": n / median,
                "identical_to_book": sum(a == b for a, b in zip(outputs, book)),
                "sacrebleu": sacrebleu_score(outputs, references)[0],
            }
            print(f"{name:>16} beam {beam}: {r['sentences_per_s']:7.1f} sentences/s "
                  f"(spread {r['spread']:.0%}), {r['identical_to_book']} of {n} as "
                  f"the book's, sacreBLEU {r['sacrebleu']:.2f}")  # fmt: skip
    return results


def ratios(results: dict) -> dict:
    """How many times slower the book's translate is than each engine, beam by beam."""
    out = {}
    for name in results:
        for beam in ("beam 1", "beam 4"):
            if name != "book":
                book = results["book"][beam]["seconds_median"]
                out[f"book / {name}, {beam}"] = book / results[name][beam]["seconds_median"]
    return out


if __name__ == "__main__":
    sys.exit(main())
