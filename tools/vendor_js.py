"""Vendor the book's JavaScript (MathJax, Vega, Vega-Lite, vega-embed) from npm into book/vendor/.

    python tools/vendor_js.py

Reproducible: `npm ci` installs exactly the versions in book/package-lock.json, then the files
the book loads are copied to book/vendor/ (git-ignored) with a manifest of versions and
sha256 sums. The built book serves them from its own `_static/` folder, so it renders offline.
The folder is deliberately not called `_static`: jupyter-book would add every .js file in a
`_static` folder to every page, and MathJax would load twice.
"""

from __future__ import annotations

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
    manifest = {"versions": {}, "sha256": {}}
    for pkg in ["mathjax", "vega", "vega-lite", "vega-embed"]:
        manifest["versions"][pkg] = json.loads((modules / pkg / "package.json").read_text())[
            "version"
        ]
    for dest in [*FILES, "mathjax/tex-mml-chtml.js"]:
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
