"""What a benchmark's figures depend on besides the code: the kind of CPU, the kernels PyTorch runs
on it, and whether anything else was running.

A CPU is filed under one of three kinds, the ones whose speed differs most for this book:
- "bf16 units": AVX-512 with BF16 instructions (or AMX), where bfloat16 autocast pays;
- "AVX-512": AVX-512 without them;
- "AVX2": the ordinary laptop and desktop CPU of the last ten years.
`ATEN_CPU_CAPABILITY` (PyTorch's kernels) and `ONEDNN_MAX_CPU_ISA` (oneDNN's, which bfloat16 uses)
can make a newer CPU run an older one's code; the kind then names what ran, marked as emulated.
"""

from __future__ import annotations

import os
import platform
import re
import time
from pathlib import Path

import torch

SETS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16")


def cpuinfo(field: str) -> str:
    """The first line of /proc/cpuinfo's `field` ("flags", "model name"), or "" off Linux."""
    try:
        found = re.search(rf"^{field}\s*:(.*)$", Path("/proc/cpuinfo").read_text(), re.MULTILINE)
    except OSError:
        return ""
    return found.group(1).strip() if found else ""


def cpu_flags() -> set[str]:
    return set(cpuinfo("flags").split())


def describe_cpu() -> dict:
    """The CPU's model, instruction sets, the kernels PyTorch chose, threads, and its kind."""
    flags = cpu_flags()
    kernels = torch.backends.cpu.get_cpu_capability()  # e.g. AVX512, AVX2, DEFAULT
    names = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")
    limits = {k: os.environ[k] for k in names if k in os.environ}
    if {"avx512_bf16", "amx_bf16"} & flags:
        kind = "bf16 units"
    else:
        kind = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "other"
    if "ATEN_CPU_CAPABILITY" in limits:  # an older CPU's kernels, run on this one
        kind = f"{limits['ATEN_CPU_CAPABILITY']} kernels emulated on {kind}"
    return {
        "model": cpuinfo("model name") or platform.processor() or platform.machine(),
        "instruction_sets": [s for s in SETS if s in flags],
        "pytorch_kernels": kernels,
        "limits": limits,
        "threads": torch.get_num_threads(),
        "kind": kind,
    }


def file_name(cpu: dict, what: str) -> str:
    """A results file name for `what` on this kind of CPU, such as cpu-avx2-multi30k-cpu.json."""
    slug = re.sub(r"[^a-z0-9]+", "-", cpu["kind"].lower()).strip("-")
    return f"cpu-{slug}-{what}.json"


def load(seconds: float = 1.0) -> float:
    """The share of all cores busy during the next `seconds` (from /proc/stat): near 0 on a quiet
    machine. Taken before the benchmark starts, so only other work counts."""

    def times() -> list[int]:
        return [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]

    try:
        first = times()
        time.sleep(seconds)
        second = times()
    except (OSError, ValueError):  # not Linux: the load average instead
        return os.getloadavg()[0] / (os.cpu_count() or 1)
    delta = [b - a for a, b in zip(first, second)]
    idle = delta[3] + (delta[4] if len(delta) > 4 else 0)  # idle and waiting for I/O
    return 1 - idle / max(1, sum(delta))
