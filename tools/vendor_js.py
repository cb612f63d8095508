"""Vendor the book's JavaScript (MathJax, Vega, Vega-Lite, vega-embed, and the live translator's
ONNX Runtime Web and SentencePiece) from npm into book/vendor/, with the translator's model.

    python tools/vendor_js.py

Reproducible: `npm ci` installs exactly the versions in book/package-lock.json, then the files
the book loads are copied to book/vendor/ (git-ignored) with a manifest of versions and
sha256 sums. The built book serves them from its own `_static/` folder, so it renders offline.
The folder is deliberately not called `_static`: jupyter-book would add every .js file in a
`_static` folder to every page, and MathJax would load twice.

The live translator of chapter 14 must work from a page opened as a file (file://), where the
browser refuses to fetch files and to load JavaScript modules. So everything it needs arrives
through plain <script> tags, and binary files travel inside scripts as base64 text: ONNX
Runtime's WebAssembly binary and its loader (`translator/ort-runtime.js`), SentencePiece bundled
by esbuild into one script (`translator/sentencepiece.js`), and the model folder that
tools/browser_model.py wrote into book/translator (`translator/model.js`).
"""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BOOK = ROOT / "book"
VENDOR = BOOK / "vendor"
FILES = {  # destination in book/vendor -> source under node_modules
    "vega/vega.min.js": "vega/build/vega.min.js",
    "vega-lite/vega-lite.min.js": "vega-lite/build/vega-lite.min.js",
    "vega-embed/vega-embed.min.js": "vega-embed/build/vega-embed.min.js",
}
MATHJAX_DIR = "mathjax/es5"  # tex-mml-chtml.js plus the components and fonts it loads lazily
ORT = "onnxruntime-web/dist"  # the WebAssembly build: its script, loader and binary
MODEL = BOOK / "translator"  # written by tools/browser_model.py
PACKAGES = [
    "mathjax",
    "vega",
    "vega-lite",
    "vega-embed",
    "onnxruntime-web",
    "@sctg/sentencepiece-js",
]


def as_script(variables: dict) -> str:
    """JavaScript that sets each window.NAME to its JSON value."""
    return "".join(
        f"window.{k} = {json.dumps(v, ensure_ascii=False)};\n" for k, v in variables.items()
    )


def translator_files(modules: Path, out: Path) -> None:
    """The live translator's scripts in `out` (see the module's docstring)."""
    out.mkdir(parents=True)
    shutil.copy2(modules / ORT / "ort.wasm.min.js", out / "ort.wasm.min.js")
    wasm = (modules / ORT / "ort-wasm-simd-threaded.wasm").read_bytes()
    loader = (modules / ORT / "ort-wasm-simd-threaded.mjs").read_text()
    runtime = {"ORT_LOADER": loader, "ORT_WASM": base64.b64encode(wasm).decode()}
    (out / "ort-runtime.js").write_text(as_script(runtime))
    esbuild = [str(modules / ".bin" / "esbuild"), "js/sentencepiece-entry.js", "--bundle",
               "--format=iife", "--global-name=SentencePiece", "--platform=browser", "--minify",
               "--alias:fs=./js/node-builtins.js", "--alias:module=./js/node-builtins.js",
               "--log-level=warning", f"--outfile={out / 'sentencepiece.js'}"]  # fmt: skip
    subprocess.run(esbuild, cwd=BOOK, check=True)
    binary = ["encoder.onnx", "decoder_step.onnx", "weights.bin", "sentencepiece.model"]
    model = {
        "files": {n: base64.b64encode((MODEL / n).read_bytes()).decode() for n in binary},
        **{n.split(".")[0]: json.loads((MODEL / n).read_text()) for n in
           ("config.json", "pieces.json", "about.json")},
    }  # fmt: skip
    (out / "model.js").write_text(as_script({"TRANSLATOR_MODEL": model}))


def main() -> int:
    if shutil.which("npm") is None:
        print(
            "vendor_js: npm is not installed; install Node.js (it provides npm) and run again.",
            file=sys.stderr,
        )
        return 1
    subprocess.run(
        ["npm", "ci", "--no-audit", "--no-fund", "--ignore-scripts", "--loglevel=error"],
        cwd=BOOK,
        check=True,
    )
    modules = BOOK / "node_modules"
    tmp = BOOK / "vendor.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    for dest, src in FILES.items():
        (tmp / dest).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(modules / src, tmp / dest)
    shutil.copytree(modules / MATHJAX_DIR, tmp / "mathjax")
    translator_files(modules, tmp / "translator")
    manifest = {"versions": {}, "sha256": {}}
    for pkg in PACKAGES:
        manifest["versions"][pkg] = json.loads((modules / pkg / "package.json").read_text())[
            "version"
        ]
    for dest in [*FILES, "mathjax/tex-mml-chtml.js", *(f"translator/{f.name}" for f in
                 sorted((tmp / "translator").iterdir()))]:  # fmt: skip
        manifest["sha256"][dest] = hashlib.sha256((tmp / dest).read_bytes()).hexdigest()
    (tmp / "MANIFEST.json").write_text(json.dumps(manifest, indent=2) + "\n")
    shutil.rmtree(VENDOR, ignore_errors=True)
    tmp.rename(VENDOR)  # all or nothing: a half-copied vendor folder is never left in place
    print(
        "vendored "
        + ", ".join(f"{k} {v}" for k, v in manifest["versions"].items())
        + f" into {VENDOR.relative_to(ROOT)}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
