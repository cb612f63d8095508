"""Our tokenized BLEU against the Perl pipelines it reproduces (tools/moses_bleu.sh), on the
translations the book scores: the published OPUS-MT output for newstest2014 and chapter 13's GPU
run on Multi30k test2016. Writes one JSON file with both sides' statistics and the provenance.

    python tools/bleu_vs_moses.py --moses DIR [--moses DIR ...] --json FILE

Each DIR is a checkout of github.com/moses-smt/mosesdecoder (its scripts/ folder is enough).
tests/test_decoding.py compares our statistics with the Perl lines recorded here.
"""

import argparse
import json
import platform
import re
import subprocess
from pathlib import Path

import sacrebleu
import sacremoses
from sacrebleu.metrics import BLEU

from annotated.bleu_scores import PaperTokenizer, lowercase_tokenized_bleu
from annotated.data.download import data_root, read_lines
from annotated.provenance import provenance

ROOT = Path(__file__).resolve().parent.parent
CASES = {  # name -> (hypotheses, references), relative to the repository and the data folder
    "newstest2014, OPUS-MT (published)": (
        "$DATA/published_outputs/opus-mt-eng-deu-opus+bt-2021-04-13.newstest2014.de",
        "$DATA/wmt14_en_de_newstest/newstest2014.de",
    ),
    "Multi30k test2016, chapter 13's GPU run": (
        "results/multi30k/test2016.hyp",
        "$DATA/multi30k/task1/raw/test_2016_flickr.de.gz",
    ),
}
PERL_LINE = re.compile(r"^(paper-style|multi-bleu\.perl -lc|multi-bleu\.perl)[^:]*:\s*(BLEU = .*)$")


def resolve(path: str) -> Path:
    return data_root() / path[len("$DATA/") :] if path.startswith("$DATA/") else ROOT / path


def statistics(hyps: list[str], refs: list[str]) -> str:
    """A multi-bleu.perl line for already-tokenized text."""
    s = BLEU(tokenize="none", smooth_method="none", force=True).corpus_score(hyps, [refs])
    precisions = "/".join(f"{p:.1f}" for p in s.precisions)
    return (
        f"BLEU = {s.score:.2f}, {precisions} (BP={s.bp:.3f}, ratio={s.sys_len / s.ref_len:.3f}, "
        f"hyp_len={s.sys_len}, ref_len={s.ref_len})"
    )


def ours(hyps: list[str], refs: list[str]) -> dict:
    """The three tokenized scores of annotated.bleu_scores, as multi-bleu.perl would print them."""
    system = PaperTokenizer("de", replace_punctuation=True)
    reference, plain = PaperTokenizer("de"), PaperTokenizer("de", compound_split=False)
    lowered = lowercase_tokenized_bleu(hyps, refs)[0]
    system_hyps = [system(h) for h in hyps]  # the same tokens for both paper-style variants
    return {
        "paper-style": statistics(system_hyps, [reference(r) for r in refs]),
        "paper-style, punctuation replaced on both sides": statistics(
            system_hyps, [system(r) for r in refs]
        ),
        "multi-bleu.perl": statistics([plain(h) for h in hyps], [plain(r) for r in refs]),
        "multi-bleu.perl -lc": f"BLEU = {lowered:.2f}",
    }


def perl(moses: Path, hyp: Path, ref: Path) -> dict:
    script = ROOT / "tools" / "moses_bleu.sh"
    out = subprocess.run(
        ["bash", str(script), str(moses), str(hyp), str(ref), "de"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return {m[1]: m[2] for m in map(PERL_LINE.match, out.splitlines()) if m}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--moses", type=Path, action="append", required=True)
    ap.add_argument("--json", type=Path, required=True)
    args = ap.parse_args()
    record = {
        "what": "tokenized BLEU of annotated.bleu_scores against tools/moses_bleu.sh "
        "(the Perl scripts)",
        "provenance": provenance(
            "python tools/bleu_vs_moses.py "
            + " ".join(f"--moses {m.name}" for m in args.moses)
            + f" --json {args.json}",
            "cpu",
        ),
        "versions": {
            "perl": subprocess.run(
                ["perl", "-e", "print $^V"], capture_output=True, text=True
            ).stdout,
            "sacremoses": sacremoses.__version__,
            "sacrebleu": sacrebleu.__version__,
            "python": platform.python_version(),
        },
        "moses": {
            m.name: subprocess.run(
                ["git", "-C", str(m), "log", "-1", "--format=%h %cs %s"],
                capture_output=True,
                text=True,
            ).stdout.strip()
            or m.name
            for m in args.moses
        },
        "cases": {},
    }
    for name, (hyp, ref) in CASES.items():
        hyps, refs = read_lines(resolve(hyp)), read_lines(resolve(ref))
        record["cases"][name] = {
            "hypotheses": hyp,
            "references": ref,
            "ours": ours(hyps, refs),
            "perl": {m.name: perl(m, resolve(hyp), resolve(ref)) for m in args.moses},
        }
    args.json.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")
    print(json.dumps(record["cases"], indent=1, ensure_ascii=False))


if __name__ == "__main__":
    main()
