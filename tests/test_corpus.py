"""Chapter 11's corpus interface: what the paper's chapters need of a corpus (its pairs by split
and its shared tokenizer), looked up by name among the known corpora and nothing else."""

import subprocess
import sys

import pytest

from annotated.corpus import CORPORA, load_corpus
from annotated.data.multi30k_corpus import MULTI30K_SPLITS, MULTI30K_VOCAB, load_multi30k


def test_multi30k_is_its_loader_and_its_tokenizer_behind_one_name():
    multi30k = load_corpus("multi30k")
    assert multi30k.splits == MULTI30K_SPLITS
    assert multi30k.pairs("val") == load_multi30k("val")
    tokenizer = multi30k.tokenizer()
    assert tokenizer.vocab_size == MULTI30K_VOCAB
    sentence = multi30k.pairs("val")[0][1]
    assert tokenizer.decode(tokenizer.encode(sentence)) == sentence
    with pytest.raises(ValueError, match="unknown split"):
        multi30k.pairs("test")


@pytest.mark.parametrize("name", ["this", "annotated.data.multi30k_corpus", "wmt14", ""])
def test_an_unknown_name_is_refused_before_any_module_is_imported(name):
    """A name outside CORPORA is refused with the names that exist, and nothing is imported
    (`this` prints a poem when imported)."""
    code = (
        "import sys\nfrom annotated.corpus import load_corpus\n"
        f"try:\n    load_corpus({name!r})\nexcept ValueError as e:\n    print(e)\n"
        "print('this' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    message, imported = out.stdout.strip().splitlines()[-2:]
    assert f"no corpus {name!r}" in message and ", ".join(CORPORA) in message
    assert imported == "False" and "The Zen of Python" not in out.stdout
