"""Print environment settings under which PyTorch uses another CPU's kernels than this machine's
best.

`make other-cpu` (CI's second pass) runs the notebooks again under them, with two threads instead
of one, so that a stored output that depends on this machine's floating-point kernels fails in CI
rather than on a reader's laptop: AVX-512 machines fall back to the AVX2 kernels, every other
machine to the portable, non-vectorised ones.
"""

import torch

best = torch.backends.cpu.get_cpu_capability()  # e.g. "AVX512", "AVX2", "DEFAULT"
if best.upper().startswith("AVX512"):
    print("ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2")
else:
    print("ATEN_CPU_CAPABILITY=default ONEDNN_MAX_CPU_ISA=SSE41")
