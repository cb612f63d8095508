"""Print environment settings under which PyTorch uses another CPU's kernels than this machine's
best.

`make test` starts every notebook's kernel under them, with two threads (conftest.py), so that a
stored output that depends on this machine's floating-point kernels fails in CI rather than on
a reader's laptop: AVX-512 machines fall back to the AVX2 kernels, every other machine to the
portable, non-vectorised ones. `make other-cpu` runs only the notebooks so.
"""


def settings() -> dict[str, str]:
    """The variables, as a mapping: ATEN_CPU_CAPABILITY and ONEDNN_MAX_CPU_ISA."""
    import torch

    best = torch.backends.cpu.get_cpu_capability()  # e.g. "AVX512", "AVX2", "DEFAULT"
    if best.upper().startswith("AVX512"):
        return {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    return {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41"}


if __name__ == "__main__":
    print(" ".join(f"{k}={v}" for k, v in settings().items()))
