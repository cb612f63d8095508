"""A trained model exported to Hugging Face transformers (appendix A5): MarianMTModel and
MarianTokenizer load the folder and compute what the book's model computes, greedy and beam
search give the book's tokens, and what Marian cannot hold is refused with what to do."""

import json
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
import torch

import annotated.beam
from annotated.batching import BOS, EOS, PAD, make_batch
from annotated.checkpoints import checkpoint_paths
from annotated.data.multi30k_corpus import load_multi30k
from annotated.decoding import beam_search_hypotheses
from annotated.embeddings import sinusoidal_table
from annotated.errors import ConfigError
from annotated.evaluation.translation import load_model
from annotated.model import make_model
from annotated.training.run_folder import read_json

from helpers import run_trainer, sets

transformers = pytest.importorskip("transformers")

from annotated.deploy.transformers_model import (  # noqa: E402
    export_transformers,
    marian_generate,
    marian_order,
    marian_vocab,
    to_marian,
)

RESULTS = {  # the parts of a results.json (chapter 11) that the model card shows
    "provenance": {"evaluation_command": "python -m annotated.cli.evaluate --run RUN"},
    "training": {"steps": 200},
    "evaluation": {"tests": {"test2016": {"sentences": 1000, "sacrebleu": 1.234,
                                          "sacrebleu_signature": "nrefs:1|tok:13a"}}},
}  # fmt: skip


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """200 steps of a one-layer model (d_model 32) on 3,000 Multi30k pairs, prepared from plain
    files: a few seconds, and enough for it to end its sentences."""
    from annotated.cli import prepare

    root = tmp_path_factory.mktemp("trained")
    pairs = load_multi30k("train")[:3000]
    for side, lang in enumerate(("en", "de")):
        (root / f"train.{lang}").write_text("".join(p[side] + "\n" for p in pairs))
    files = ["--src", str(root / "train.en"), "--tgt", str(root / "train.de")]
    assert prepare.main([*files, "--out", str(root / "data"), "--vocab", "500"]) == 0
    tiny = sets("model.N=1", "model.d_model=32", "model.d_ff=64", "model.h=2", "model.max_len=128")
    tiny += sets("model.dropout=0", "optim.warmup=50", "optim.lr_factor=2", "batch.max_tokens=1000")
    run_trainer("--config", "parallel", *sets(f"data.path={root / 'data'}"), *tiny,
                "--max-steps", "200", "--out", str(root / "run"))  # fmt: skip
    return root / "run"


@pytest.fixture(scope="module")
def exported(trained, tmp_path_factory):
    """The trained model, its tokenizer and configuration, the exported folder, and the folder
    loaded by transformers: (model, tokenizer, cfg, folder, marian, marian_tokenizer)."""
    paths = checkpoint_paths(trained)
    model, tokenizer, cfg = load_model(paths)
    card = {"run": read_json(trained / "run.json"), "results": RESULTS,
            "checkpoints": [p.name for p in paths]}  # fmt: skip
    out = tmp_path_factory.mktemp("exported") / "marian"
    folder = export_transformers(model, tokenizer, cfg, out, card=card)
    marian = transformers.MarianMTModel.from_pretrained(folder).eval()
    return (
        model,
        tokenizer,
        cfg,
        folder,
        marian,
        transformers.MarianTokenizer.from_pretrained(folder),
    )


@pytest.fixture(scope="module")
def sources():
    return [s for s, _ in load_multi30k("test_2016_flickr")[:200]]


def power_penalty(length, alpha):
    """transformers' length penalty, |Y|^alpha (|Y| counting </s>), for the book's beam search."""
    return length**alpha


def book_tokens(model, tokenizer, sentences, beam_size, penalty=None):
    """The book's search on `sentences` (the paper's limit, n_src + 50): each best hypothesis's
    tokens; with `penalty`, that length penalty in place of Wu et al.'s."""
    batch = make_batch([tokenizer.encode(s) + [EOS] for s in sentences])
    with mock.patch.object(
        annotated.beam, "length_penalty", penalty or annotated.beam.length_penalty
    ):
        beams = beam_search_hypotheses(model, batch.src, batch.src_mask, None, BOS, EOS, beam_size)
    return [beam[0].tokens for beam in beams]


def share_same(a: list, b: list) -> float:
    return sum(x == y for x, y in zip(a, b)) / len(a)


def random_model(tokenizer, **kind):
    torch.manual_seed(0)
    options = dict(N=2, d_model=32, d_ff=64, h=4, dropout=0.0, max_len=128)
    return make_model(tokenizer.vocab_size, tokenizer.vocab_size, **options, **kind).eval()


def logit_gap(model, marian, tokenizer, sentences) -> float:
    """The largest difference between the book's log-probabilities and Marian's (in the book's
    order of the ids) on a batch of sentences, each with another sentence as its target
    (teacher forcing). Marian's logits are the book's less one number per position, which the
    zero start embedding subtracts from them all (start_from_zero)."""
    ids = [tokenizer.encode(s) + [EOS] for s in sentences]
    half = len(ids) // 2
    batch = make_batch(ids[:half], [[BOS, *x[:-1]] for x in ids[half : 2 * half]])
    size = tokenizer.vocab_size
    as_marian = lambda t: torch.tensor([to_marian(row, size) for row in t.tolist()])  # noqa: E731
    with torch.no_grad():
        ours = model.generator.proj(model(batch.src, batch.tgt, batch.src_mask, batch.tgt_mask))
        mask = (batch.src != PAD).long()
        theirs = marian(input_ids=as_marian(batch.src), attention_mask=mask,
                        decoder_input_ids=as_marian(batch.tgt)).logits  # fmt: skip
    book_order = torch.empty_like(theirs)
    book_order[..., marian_vocab(size)] = theirs  # Marian's id j is the book's marian_vocab[j]
    gap = ours.log_softmax(-1) - book_order.log_softmax(-1)
    return gap[batch.tgt != PAD].abs().max().item()


def test_the_order_turns_the_papers_sinusoid_into_marians(exported):
    """The paper interleaves sines and cosines, Marian puts the sines first: the same table in
    another order of the dimensions, which the loaded model computes for itself."""
    marian = exported[4]
    for side in (marian.model.encoder, marian.model.decoder):
        theirs = side.embed_positions.weight  # (max_len, d_model), not stored in the folder
        assert theirs.shape == (128, 32)
        assert torch.allclose(sinusoidal_table(128, 32)[:, marian_order(32)], theirs, atol=1e-6)
    assert sorted(marian_order(32).tolist()) == list(range(32))


def test_the_exported_model_computes_the_books_logits(exported, sources):
    model, tokenizer, _, folder, marian, _ = exported
    assert sorted(f.name for f in folder.iterdir()) == [
        "README.md", "config.json", "generation_config.json", "model.safetensors", "source.spm",
        "target.spm", "tokenizer_config.json", "vocab.json",
    ]  # fmt: skip
    assert logit_gap(model, marian, tokenizer, sources[:64]) < 1e-4
    assert marian.lm_head.weight.data_ptr() == marian.model.encoder.embed_tokens.weight.data_ptr()


def test_marian_tokenizer_gives_the_books_ids_and_text(exported, sources):
    _, tokenizer, _, folder, _, marian_tokenizer = exported
    size = tokenizer.vocab_size
    book = [to_marian(tokenizer.encode(s) + [EOS], size) for s in sources]
    assert marian_tokenizer(sources).input_ids == book  # the book's ids in Marian's order
    vocab = json.loads((folder / "vocab.json").read_text())
    assert vocab["<pad>"] == size - 1 == marian_tokenizer.pad_token_id  # last, as OPUS-MT's
    ids = [tokenizer.encode(s) for s in sources[:20]]
    texts = marian_tokenizer.batch_decode([to_marian([BOS, *x, EOS], size) for x in ids],
                                          skip_special_tokens=True)  # fmt: skip
    assert texts == [tokenizer.decode(x) for x in ids]
    assert (folder / "source.spm").read_bytes() == tokenizer.sp.serialized_model_proto()


def test_greedy_and_beam_search_give_the_books_tokens(exported, sources):
    """Greedy: the same tokens. Beam 4: the same tokens once both searches divide by |Y|^alpha,
    transformers' length penalty (its search keeps finished hypotheses apart, the book's does
    not, so a few sentences may still differ)."""
    model, tokenizer, _, _, marian, marian_tokenizer = exported
    greedy = marian_generate(marian, marian_tokenizer, sources, beam_size=1)
    assert share_same(book_tokens(model, tokenizer, sources, 1), greedy) >= 0.99
    beam = marian_generate(marian, marian_tokenizer, sources, beam_size=4)
    assert share_same(book_tokens(model, tokenizer, sources, 4, power_penalty), beam) >= 0.99
    assert all(EOS not in y for y in greedy)  # ids come without </s>
    assert marian_generate(marian, marian_tokenizer, ["", " "]) == [[], []]


def test_a_translation_cut_by_the_length_limit_is_the_books(exported, sources, tmp_path):
    """An untrained model never ends a sentence: each output runs to the paper's limit, n_src +
    50 tokens, in both, and its last token is not replaced by </s>."""
    _, tokenizer, cfg, _, _, _ = exported
    model = random_model(tokenizer)
    folder = export_transformers(model, tokenizer, cfg, tmp_path / "m")
    marian = transformers.MarianMTModel.from_pretrained(folder).eval()
    marian_tokenizer = transformers.MarianTokenizer.from_pretrained(folder)
    few = sources[:8]
    limits = [len(tokenizer.encode(s)) + 51 for s in few]
    for beam, penalty in ((1, None), (4, power_penalty)):
        ours = book_tokens(model, tokenizer, few, beam, penalty)
        assert [len(y) for y in ours] == limits  # the limit, no </s>
        assert marian_generate(marian, marian_tokenizer, few, beam_size=beam) == ours


def test_separate_embeddings_stay_separate(exported, sources, tmp_path):
    _, tokenizer, cfg, _, _, _ = exported
    model = random_model(tokenizer, share_embeddings=False)
    folder = export_transformers(model, tokenizer, cfg, tmp_path / "m")
    marian = transformers.MarianMTModel.from_pretrained(folder).eval()
    assert logit_gap(model, marian, tokenizer, sources[:16]) < 1e-4
    config = json.loads((folder / "config.json").read_text())
    assert config["share_encoder_decoder_embeddings"] is False
    assert config["tie_word_embeddings"] is False


REFUSED = {
    "pre-norm": (dict(norm_first=True), ["pre-norm", "model.norm_first=false", "--to onnx"]),
    "learned positions": (dict(learned_positions=True), ["learned", "stores no positions",
                                                         "model.learned_positions=false"]),
    "d_k": (dict(d_k=4), ["d_k=4", "d_model / h = 8", "--to onnx", "model.d_k=0"]),
}  # fmt: skip


@pytest.mark.parametrize("kind", REFUSED)
def test_what_marian_cannot_hold_is_refused(exported, tmp_path, kind):
    _, tokenizer, cfg, _, _, _ = exported
    options, said = REFUSED[kind]
    with pytest.raises(ConfigError) as refused:
        export_transformers(random_model(tokenizer, **options), tokenizer, cfg, tmp_path / "m")
    assert all(words in str(refused.value) for words in said), str(refused.value)
    assert not (tmp_path / "m").exists() and list(tmp_path.iterdir()) == []


def test_an_existing_folder_and_another_tokenizer_are_refused(exported, tmp_path):
    model, tokenizer, cfg, _, _, _ = exported
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "mine.txt").write_text("kept")
    with pytest.raises(ConfigError, match="exists; remove it or choose another folder"):
        export_transformers(model, tokenizer, cfg, tmp_path / "m")
    assert [f.name for f in (tmp_path / "m").iterdir()] == ["mine.txt"]
    other = make_model(tokenizer.vocab_size + 1, tokenizer.vocab_size + 1, N=1, d_model=16,
                       d_ff=32, h=2)  # fmt: skip
    with pytest.raises(ConfigError, match="give the tokenizer the model was trained with"):
        export_transformers(other, tokenizer, cfg, tmp_path / "o")


def test_the_export_leaves_the_model_and_the_random_numbers_as_they_were(exported, tmp_path):
    model, tokenizer, cfg, _, _, _ = exported
    before, state = {k: v.clone() for k, v in model.state_dict().items()}, torch.get_rng_state()
    export_transformers(model, tokenizer, cfg, tmp_path / "m")
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert torch.equal(torch.get_rng_state(), state)


def test_the_model_card_and_the_generation_settings(exported, trained):
    _, _, _, folder, marian, _ = exported
    card = (folder / "README.md").read_text()
    run = read_json(trained / "run.json")
    for said in [run["command"], run["commit"], "ckpt_00000200.pt", "| test2016 | 1000 | 1.23 |",
                 "nrefs:1|tok:13a", "Steps: `200`", "MarianMTModel.from_pretrained", "|Y|",
                 "library_name: transformers"]:  # fmt: skip
        assert said in card, said
    generation = marian.generation_config
    assert (generation.num_beams, generation.length_penalty, generation.max_length) == (4, 0.6, 128)
    assert (generation.decoder_start_token_id, generation.eos_token_id) == (BOS - 1, EOS - 1)
    assert generation.bad_words_ids == [[marian.config.pad_token_id]]  # as OPUS-MT's models
    start = marian.model.decoder.embed_tokens.weight[generation.decoder_start_token_id]
    assert not start.any()  # decoding starts from a zero embedding, as Marian's does
    assert not generation.forced_eos_token_id and not marian.config.forced_eos_token_id
    assert (
        "((5 + |Y|) / 6)"
        in json.loads((folder / "generation_config.json").read_text())["length_penalty_note"]
    )


def test_without_transformers_the_message_says_what_to_install(exported, tmp_path, monkeypatch):
    model, tokenizer, cfg, _, _, _ = exported
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers fails
    with pytest.raises(
        ConfigError, match=r"pip install 'annotated-transformer-book\[transformers\]'"
    ):
        export_transformers(model, tokenizer, cfg, tmp_path / "m")


def test_the_export_command_writes_the_folder_with_the_runs_card(trained, tmp_path):
    """python -m annotated.cli.export --to transformers: the folder, loadable, with a model card
    that names the run's command; an existing folder is refused with exit code 2."""
    import subprocess
    import sys

    from transformers import MarianMTModel

    checkpoint = sorted((trained / "checkpoints").glob("ckpt_*.pt"))[-1]
    out = tmp_path / "hf"
    cmd = [sys.executable, "-m", "annotated.cli.export", "--checkpoint", str(checkpoint)]
    r = subprocess.run([*cmd, "--to", "transformers", str(out)], capture_output=True, text=True)
    assert r.returncode == 0 and f"wrote {out}" in r.stdout, r.stderr[-2000:]
    assert "python -m annotated.cli.train" in (out / "README.md").read_text()
    assert checkpoint.name in (out / "README.md").read_text()
    assert MarianMTModel.from_pretrained(out).config.d_model == 32
    r = subprocess.run([*cmd, "--to", "transformers", str(out)], capture_output=True, text=True)
    assert r.returncode == 2 and "exists" in r.stderr and "Traceback" not in r.stderr


def _recipes(folder) -> list[str]:
    """The Python code blocks of the model card, in order."""
    card = (folder / "README.md").read_text()
    return [block.split("```", 1)[0] for block in card.split("```python\n")[1:]]


def _run(code: str, folder, sentences: list[str]) -> list[str]:
    """Run a recipe in the exported folder, on `sentences` instead of its examples."""
    given = f"sentences = {sentences!r}\n"
    code = code.replace('sentence = "A dog runs through the snow."\n', "")
    code = "\n".join(given if line.startswith("sentences = [") else line
                     for line in code.splitlines())  # fmt: skip
    if "sentence)" in code or "[sentence]" in code:  # one sentence: once for each
        body = code.split("\n", 3)[3]  # without the imports and from_pretrained's lines
        head = code[: len(code) - len(body)]
        loop = "".join("    " + line + "\n" for line in body.splitlines())
        code = head + given + "for sentence in sentences:\n" + loop
    r = subprocess.run([sys.executable, "-c", code], cwd=folder, capture_output=True, text=True,
                       timeout=600)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout.splitlines()


def test_the_model_cards_recipes_and_ctranslate2s_converter_give_the_books_translations(
    exported, sources, tmp_path
):
    """Each recipe of the model card, run as a user would in the exported folder, gives the
    book's greedy translations of test2016 (`translate`, beam_size=1); CTranslate2's own
    ct2-transformers-converter converts the folder, as it converts OPUS-MT's models, and its
    recipe, with the paper's length limit, gives them too. A batch shares the longest source's
    limit, so a sentence that runs to its own limit may differ: 99% must agree."""
    ctranslate2 = pytest.importorskip("ctranslate2")
    import shutil

    from annotated.evaluation.translation import translate

    model, tokenizer, _, folder, _, _ = exported
    work = tmp_path / "marian"
    shutil.copytree(folder, work)
    converter = shutil.which("ct2-transformers-converter") or str(
        Path(sys.executable).parent / "ct2-transformers-converter"
    )
    r = subprocess.run([converter, "--model", str(work), "--output_dir", str(work / "ct2")],
                       capture_output=True, text=True, timeout=600)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert ctranslate2.Translator(str(work / "ct2")).num_active_batches == 0
    one, batch, ct2 = _recipes(work)
    few = sources[:40]
    book = translate(model, tokenizer, few, beam_size=1)
    assert _run(one, work, few) == book  # each sentence with its own limit: exactly
    for recipe in (batch, ct2):
        assert share_same(book, _run(recipe, work, few)) >= 0.99
