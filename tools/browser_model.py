"""The live translator's model (chapter 14): a trained run's kept checkpoints, averaged and exported
to ONNX (appendix A5) into book/translator/, with the vocabulary's pieces and where it came from.

    python tools/browser_model.py --run runs/multi30k-cpu --results results/multi30k-cpu

`make translator` runs this. The folder is committed (it is below 10 MB) so that the book builds
without the run; tools/vendor_js.py turns it into the script that the page loads.
`reference.json` holds `translate`'s outputs on test2016 (greedy and beam 4), which the browser
test compares the page's with. `about.json` records the command, commit and date of this
export, the run's own provenance and its test2016 score from `--results`, which must name the
same checkpoints: the page then states the score of exactly the model it runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from annotated.checkpoints import checkpoint_paths  # noqa: E402
from annotated.deploy.onnx_model import export_onnx  # noqa: E402
from annotated.evaluation.translation import load_model, score  # noqa: E402
from annotated.files import atomic_path  # noqa: E402
from annotated.precision import fast_decoding  # noqa: E402
from annotated.provenance import provenance  # noqa: E402
from annotated.training.task import TASKS  # noqa: E402

OUT = ROOT / "book" / "translator"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--run", type=Path, required=True, help="a training run's --out folder")
    ap.add_argument("--results", type=Path, required=True, help="its evaluation's --results")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    checkpoints = checkpoint_paths(args.run)
    scored = json.loads((args.results / "results.json").read_text())
    names = [p.name for p in checkpoints]
    if not checkpoints or names != scored["evaluation"]["checkpoints"]:
        print(f"error: {args.run} keeps {names or 'no checkpoints'}, but {args.results} scored "
              f"{scored['evaluation']['checkpoints']}; export the run that was scored.",
              file=sys.stderr)  # fmt: skip
        return 2
    model, tokenizer, cfg = load_model(checkpoints)
    command = "python tools/browser_model.py " + " ".join(argv or sys.argv[1:])
    about = provenance(command, torch.device("cpu"))
    about["run"] = {"results": str(args.results), **scored["provenance"], "checkpoints": names}
    about["scores"] = {name: round(test["sacrebleu"], 2)
                       for name, test in scored["evaluation"]["tests"].items()}  # fmt: skip
    about["training"] = scored["training"]
    with atomic_path(args.out) as tmp:
        export_onnx(model, tokenizer, tmp)
        pieces = [tokenizer.sp.id_to_piece(i) for i in range(tokenizer.vocab_size)]
        (tmp / "pieces.json").write_text(json.dumps(pieces, ensure_ascii=False) + "\n")
        (tmp / "about.json").write_text(json.dumps(about, indent=1) + "\n")
        (tmp / "reference.json").write_text(json.dumps(reference(model, tokenizer, cfg)) + "\n")
    sizes = {f.name: f.stat().st_size for f in sorted(args.out.iterdir())}
    print(f"wrote {args.out}: {sum(sizes.values()) / 1e6:.1f} MB ({sizes})")
    return 0


def reference(model, tokenizer, cfg) -> dict:
    """`translate`'s outputs on the run's first test set, greedy and with beam 4, alpha 0.6, as
    `score` makes them: what the page must reproduce (tests/test_live_translator.py)."""
    test, load = next(iter(TASKS[cfg.task].test_sets(cfg).items()))
    pairs = load()
    with fast_decoding(model):
        scored = {k: score(model, tokenizer, pairs, beam_size=k) for k in (1, 4)}
    outputs = {f"beam {k}": s["translations"] for k, s in scored.items()}
    return {"test_set": test, "sources": [s for s, _ in pairs], **outputs}


if __name__ == "__main__":
    sys.exit(main())
