"""Table 1 measured (chapter 6): multiply-adds, activation memory and time of one
self-attention, recurrent (LSTM) and convolutional layer as the sequence length n grows past
the width d, on one device. Writes a JSON file with provenance and the chapter's figure.

    python benchmarks/layer_costs.py --d 256 --out results/table1

The files are named after the device: cpu.json and cpu.png, cuda.json and cuda.png.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from annotated.experiments.charts import layer_costs_figure
from annotated.experiments.plots import save_png
from annotated.experiments.table1 import layer_costs
from annotated.files import write_text_atomic
from annotated.provenance import provenance


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--d", type=int, default=256, help="the layers' width (default 256)")
    ap.add_argument("--max-n", type=int, default=4096, help="the longest sequence (default 4096)")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", type=Path, required=True, help="folder for DEVICE.json and .png")
    args = ap.parse_args(argv)
    if args.d < 4 or args.d % 4 or args.max_n < 16 or args.batch < 1:
        ap.error("--d must be a multiple of 4 (four heads), --max-n at least 16, --batch >= 1")
    lengths = [16 * 2**i for i in range((args.max_n // 16).bit_length())]
    rows = layer_costs(lengths, args.d, batch=args.batch, device=args.device)
    command = "python benchmarks/layer_costs.py " + " ".join(sys.argv[1:] if argv is None else argv)
    report = provenance(command, torch.device(args.device))
    report.update(d=args.d, batch=args.batch, heads=4, kernel_width=3, rows=rows)
    for r in rows:
        print(f"{r['layer']:>15}  n {r['n']:>5}  {r['multiply-adds']:>14,} multiply-adds  "
              f"{r['saved MB']:>9.2f} MB  {r['seconds'] * 1e3:>9.2f} ms")  # fmt: skip
    name = torch.device(args.device).type
    args.out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(args.out / f"{name}.json", json.dumps(report, indent=2) + "\n")
    png = args.out / f"{name}.png"
    save_png(layer_costs_figure(rows, args.d), png)
    print("wrote", args.out / f"{name}.json", "and", png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
