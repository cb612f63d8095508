"""A trained model served by CTranslate2 and ONNX Runtime (appendix A5): the same numbers as the
PyTorch model, post-norm and pre-norm, sinusoid and learned positions; and the export command."""

import pytest
import torch

from annotated.batching import BOS, EOS, make_batch
from annotated.cli import export
from annotated.data.multi30k_corpus import load_multi30k
from annotated.data.tokenizer import train_tokenizer
from annotated.decoding import StepDecoder
from annotated.evaluation.translation import translate
from annotated.model import make_model

from helpers import run_trainer, sets

ctranslate2 = pytest.importorskip("ctranslate2")
pytest.importorskip("onnxruntime")

from annotated.deploy.ctranslate2_model import (  # noqa: E402
    ctranslate2_translate,
    export_ctranslate2,
)
from annotated.deploy.onnx_model import OnnxStepDecoder, OnnxTranslator, export_onnx  # noqa: E402

KINDS = {
    "post-norm, sinusoid (the paper)": dict(norm_first=False),
    "pre-norm": dict(norm_first=True),
    "learned positions": dict(learned_positions=True),
}


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    pairs = load_multi30k("train")[:3000]
    return train_tokenizer(pairs, tmp_path_factory.mktemp("sp") / "sp", 400)


@pytest.fixture(scope="module")
def sentences():
    return [s for s, _ in load_multi30k("test_2016_flickr")[:24]]


def random_model(tokenizer, **kind):
    torch.manual_seed(0)
    options = dict(N=2, d_model=32, d_ff=64, h=4, dropout=0.0, max_len=128)
    return make_model(tokenizer.vocab_size, tokenizer.vocab_size, **options, **kind).eval()


@pytest.mark.parametrize("kind", KINDS)
def test_ctranslate2_scores_what_the_model_scores(tokenizer, sentences, tmp_path, kind):
    model = random_model(tokenizer, **KINDS[kind])
    translator = ctranslate2.Translator(str(export_ctranslate2(model, tokenizer, tmp_path / "m")))
    sources = [tokenizer.encode(s) + [EOS] for s in sentences[:8]]
    targets = [tokenizer.encode(s)[:10] + [EOS] for s in sentences[8:16]]
    piece = tokenizer.sp.id_to_piece
    scored = translator.score_batch(
        [[piece(i) for i in s] for s in sources], [[piece(i) for i in t[:-1]] for t in targets]
    )
    batch = make_batch(sources, [[BOS, *t] for t in targets])
    with torch.no_grad():
        out = model.decode(model.encode(batch.src, batch.src_mask), batch.src_mask,
                           batch.tgt, batch.tgt_mask)  # fmt: skip
        log_probs = model.generator(out).gather(-1, batch.tgt_y[..., None])[..., 0]
    for row, (theirs, target) in enumerate(zip(scored, targets)):
        ours = log_probs[row, : len(target)]
        assert torch.allclose(torch.tensor(theirs.log_probs), ours, atol=1e-4), kind


@pytest.mark.parametrize("kind", KINDS)
def test_the_onnx_step_is_the_models_step(tokenizer, sentences, tmp_path, kind):
    model = random_model(tokenizer, **KINDS[kind])
    runner = OnnxTranslator(export_onnx(model, tokenizer, tmp_path / "m"))
    batch = make_batch([tokenizer.encode(s) + [EOS] for s in sentences[:6]])
    with torch.no_grad():
        memory = model.encode(batch.src, batch.src_mask)
        ours = StepDecoder(model, memory, batch.src_mask)
        theirs = OnnxStepDecoder(runner.decoder, memory.numpy(), batch.src.numpy(), runner.config)
        ys = torch.full((6, 1), BOS)
        for t in range(6):
            expected, got = ours.step(ys), theirs.step(ys)
            assert torch.allclose(got, expected, atol=1e-5), (kind, t)
            ys = torch.cat([ys, expected.argmax(-1, keepdim=True)], 1)
            if t == 2:  # beam search re-ranks rows and drops finished ones: the cache follows
                rows = torch.tensor([5, 0, 3, 3])
                ours.reorder(rows)
                theirs.reorder(rows)
                ys = ys[rows]


def test_the_onnx_step_says_where_it_looked_and_the_graphs_share_one_copy_of_each_weight(
    tokenizer, sentences, tmp_path
):
    """cross_attention is each layer's encoder-decoder attention weights for the newest token,
    as the reference path computes them; weights.bin holds every array once, although the
    embedding and the positional table are in both graphs."""
    import onnx

    model = random_model(tokenizer)
    folder = export_onnx(model, tokenizer, tmp_path / "m")
    runner = OnnxTranslator(folder)
    batch = make_batch([tokenizer.encode(s) + [EOS] for s in sentences[:5]])
    with torch.no_grad():
        memory = model.encode(batch.src, batch.src_mask)
        ours = StepDecoder(model, memory, batch.src_mask)  # the reference path keeps weights
        theirs = OnnxStepDecoder(runner.decoder, memory.numpy(), batch.src.numpy(), runner.config)
        ys = torch.full((5, 1), BOS)
        for t in range(4):
            next_token = ours.step(ys).argmax(-1, keepdim=True)
            theirs.step(ys)
            looked = torch.stack(
                [layer.src_attn.attn[:, :, -1] for layer in model.decoder.layers], 1
            )
            assert theirs.attention.shape == (5, 2, 4, batch.src.size(1))
            assert torch.allclose(torch.from_numpy(theirs.attention), looked, atol=1e-5), t
            assert torch.allclose(looked.sum(-1), torch.ones(5, 2, 4))  # each head: a distribution
            ys = torch.cat([ys, next_token], 1)
    distinct = sum(p.numel() for p in model.parameters()) + model.src_embed[1].pe.numel()
    arrays = [t for g in ("encoder.onnx", "decoder_step.onnx")
              for t in onnx.load(str(folder / g), load_external_data=False).graph.initializer
              if t.data_location == onnx.TensorProto.EXTERNAL]  # fmt: skip
    stored = (folder / "weights.bin").stat().st_size
    assert stored <= 4 * distinct + 64 * len(arrays)  # float32, each array once, 64-byte aligned
    assert (
        sum(int(dict((e.key, e.value) for e in t.external_data)["length"]) for t in arrays) > stored
    )


def test_both_engines_translate_as_the_book_does(tokenizer, sentences, tmp_path):
    model = random_model(tokenizer)
    ct2 = ctranslate2.Translator(str(export_ctranslate2(model, tokenizer, tmp_path / "c")))
    onnx = OnnxTranslator(export_onnx(model, tokenizer, tmp_path / "o"))
    inputs = [*sentences, ""]  # an empty line stays empty
    for beam in (1, 4):
        book = translate(model, tokenizer, inputs, beam_size=beam)
        assert onnx.translate(inputs, beam_size=beam) == book  # the same search, another engine
        if beam == 1:  # CTranslate2's beam search normalises by length differently
            assert ctranslate2_translate(ct2, tokenizer, inputs, beam_size=1) == book
    with pytest.raises(ValueError, match="this model takes 77"):
        onnx.translate(["a " * 200])
    assert (tmp_path / "c" / "sentencepiece.model").read_bytes() == (
        tmp_path / "o" / "sentencepiece.model"
    ).read_bytes()


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A parallel run of two steps on 400 Multi30k pairs, prepared from plain files."""
    from annotated.cli import prepare

    root = tmp_path_factory.mktemp("tiny")
    pairs = load_multi30k("train")[:400]
    for side, lang in enumerate(("en", "de")):
        (root / f"train.{lang}").write_text("".join(p[side] + "\n" for p in pairs))
    test = load_multi30k("test_2016_flickr")[:6]
    for side, lang in enumerate(("en", "de")):
        (root / f"test.{lang}").write_text("".join(p[side] + "\n" for p in test))
    files = ["--src", str(root / "train.en"), "--tgt", str(root / "train.de")]
    tests = ["--test", f"t16={root / 'test.en'},{root / 'test.de'}"]
    assert prepare.main([*files, *tests, "--out", str(root / "data"), "--vocab", "300"]) == 0
    tiny = sets("model.N=1", "model.d_model=32", "model.d_ff=64", "model.h=2")
    run_trainer("--config", "parallel", *sets(f"data.path={root / 'data'}"), *tiny,
                "--max-steps", "2", "--out", str(root / "run"))  # fmt: skip
    return root / "run"


def test_the_export_command(tiny_run, tmp_path, capsys):
    checkpoint = str(next((tiny_run / "checkpoints").glob("*.pt")))
    for engine in ("onnx", "ctranslate2"):
        out = tmp_path / engine
        assert export.main(["--checkpoint", checkpoint, "--to", engine, str(out)]) == 0
        assert "README.md" in capsys.readouterr().out and (out / "README.md").is_file()
        assert export.main(["--checkpoint", checkpoint, "--to", engine, str(out)]) == 2
        assert "exists" in capsys.readouterr().err
    int8 = ["--to", "ctranslate2", str(tmp_path / "q"), "--quantization", "int8"]
    assert export.main(["--checkpoint", checkpoint, *int8]) == 0
    bad = [
        (["--to", "tflite", str(tmp_path / "x")], "choose one of ctranslate2, onnx"),
        (
            ["--to", "onnx", str(tmp_path / "y"), "--quantization", "int8"],
            "CTranslate2 models only",
        ),
        (["--to", "ctranslate2", str(tmp_path / "z"), "--quantization", "int3"], "int3"),
    ]
    for args, message in bad:
        assert export.main(["--checkpoint", checkpoint, *args]) == 2
        assert message in capsys.readouterr().err
    copy = tmp_path / "copy"
    run_trainer("--config", "copy", *sets("model.N=1", "model.d_model=16", "model.d_ff=32",
                "model.h=2"), "--max-steps", "1", "--out", str(copy))  # fmt: skip
    copy_checkpoint = str(next((copy / "checkpoints").glob("*.pt")))
    assert export.main(["--checkpoint", copy_checkpoint, "--to", "onnx", str(tmp_path / "w")]) == 2
    assert "no subword tokenizer" in capsys.readouterr().err


def test_the_speed_benchmark_runs_every_engine_on_the_same_sentences(tiny_run, tmp_path):
    import json
    import subprocess
    import sys

    from helpers import ROOT

    out = tmp_path / "speed.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "translate_speed.py"), "--run", str(tiny_run),
           "--rounds", "1", "--threads", "1", "--json", str(out)]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["sentences"] == 6 and set(report["engines"]) == {
        "book",
        "ctranslate2",
        "ctranslate2-int8",
        "onnx",
    }
    for beam in ("beam 1", "beam 4"):
        assert report["engines"]["onnx"][beam]["identical_to_book"] == 6  # the same search
    speeds = [report["engines"][e][b]["sentences_per_s"] for e in report["engines"] for b in
              ("beam 1", "beam 4")]  # fmt: skip
    assert all(s > 0 for s in speeds) and report["rounds"] == 1
    assert report["ratios"]["book / ctranslate2, beam 4"] > 0 and report["commit"]


def test_an_int8_export_leaves_the_model_as_it_was(tokenizer, tmp_path):
    model = random_model(tokenizer)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    export_ctranslate2(model, tokenizer, tmp_path / "q", quantization="int8")
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_the_browser_model_is_the_scored_run_with_translates_outputs(tiny_run, tmp_path):
    """tools/browser_model.py (make translator): the run's kept checkpoints, averaged, as ONNX,
    with translate's outputs on the first test set and the scores of exactly those checkpoints;
    a results folder that scored other checkpoints is refused."""
    import json
    import subprocess
    import sys

    from annotated.checkpoints import checkpoint_paths
    from annotated.evaluation.translation import load_model

    from helpers import ROOT

    names = [p.name for p in checkpoint_paths(tiny_run)]
    scored = {
        "provenance": {"commit": "c0ffee"},
        "training": {"steps": 2, "seconds": 1.5},
        "evaluation": {"checkpoints": names, "tests": {"t16": {"sacrebleu": 1.234}}},
    }
    results, out = tmp_path / "results", tmp_path / "translator"
    results.mkdir()
    (results / "results.json").write_text(json.dumps(scored))
    cmd = [sys.executable, str(ROOT / "tools" / "browser_model.py"), "--run", str(tiny_run),
           "--results", str(results), "--out", str(out)]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    about = json.loads((out / "about.json").read_text())
    assert about["scores"] == {"t16": 1.23} and about["run"]["checkpoints"] == names
    assert about["run"]["commit"] == "c0ffee" and about["commit"]  # the run's and the export's
    reference = json.loads((out / "reference.json").read_text())
    model, tokenizer, _ = load_model(checkpoint_paths(tiny_run))
    assert reference["test_set"] == "t16" and len(reference["sources"]) == 6
    assert reference["beam 4"] == translate(model, tokenizer, reference["sources"], beam_size=4)
    assert OnnxTranslator(out).translate(reference["sources"], beam_size=1) == reference["beam 1"]
    pieces = json.loads((out / "pieces.json").read_text())
    assert len(pieces) == tokenizer.vocab_size and pieces[5] == tokenizer.sp.id_to_piece(5)
    scored["evaluation"]["checkpoints"] = names[:-1] or ["ckpt_other.pt"]
    (results / "results.json").write_text(json.dumps(scored))
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 2 and "export the run that was scored" in r.stderr


def test_the_speed_benchmark_refuses_a_gpu_it_has_not_and_onnx_on_one(tiny_run, capsys):
    """--device cuda: the book and CTranslate2 on the GPU; refused, before anything loads, on a
    machine without one, and with ONNX Runtime, which runs on the CPU only."""
    import importlib.util

    from helpers import ROOT

    spec = importlib.util.spec_from_file_location("speed", ROOT / "benchmarks/translate_speed.py")
    speed = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(speed)
    says = "sees no GPU" if not torch.cuda.is_available() else "runs on the CPU only"
    with pytest.raises(SystemExit) as stop:
        speed.main(["--run", str(tiny_run), "--device", "cuda"])
    assert stop.value.code == 2 and says in capsys.readouterr().err


def test_the_model_card_says_what_the_model_is_and_only_what_was_recorded():
    """The exported folder's README: the model's sizes read from the model itself, and the
    provenance lines only for what the run recorded (none: it says so)."""
    from annotated.deploy.model_card import model_card
    from annotated.model import make_model
    from annotated.training.registry import build_config

    cfg = build_config("copy")
    model = make_model(13, 13, N=2, d_model=32, d_ff=64, h=4)
    bare = model_card(model, cfg, {})
    assert "Task `copy`: N=2 layers, d_model=32, d_ff=64, h=4, 13 SentencePiece" in bare
    assert "one embedding matrix shared three ways" in bare and "Not recorded" in bare
    run = {"command": "python -m annotated.cli.train --config copy", "commit": "abc123",
           "device": "cpu", "world_size": 2}  # fmt: skip
    tests = {"test2016": {"sentences": 1000, "sacrebleu": 12.345, "sacrebleu_signature": "s"}}
    card = model_card(model, cfg, {"run": run, "results": {"evaluation": {"tests": tests}}})
    assert "- Code: `abc123`" in card and "- Trained on: `2 x cpu`" in card
    assert "| test2016 | 1000 | 12.35 | `s` |" in card and "Not recorded" not in card
    assert "PyTorch" not in card  # not recorded, so not said
