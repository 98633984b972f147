"""Which kernel ``F.scaled_dot_product_attention`` uses on CUDA (a process-wide setting of PyTorch).

``cudnn``: cuDNN's flash attention first, the memory-efficient kernel as the fallback for masked
(cross-)attention; measured 593 vs 314 TFLOP/s (flash) forward + backward at 8k tokens, head dim 128,
on an H100, and equal to flash at 256 tokens, head dim 72 (docs/benchmarks.md). ``auto`` means ``cudnn`` on
CUDA. The flags are read when a graph is traced, so set them before compiling.

Every setting keeps the math kernel on as the last resort: PyTorch tries math after flash and efficient in
either of its orders (cuDNN first on Hopper with a recent cuDNN, else flash, efficient, math, cuDNN), so math
runs only what the chosen fused kernels refuse, e.g. the text encoders and VAEs that share the process with the
DiT (UMT5's float position bias found no kernel when math was off: "No viable backend", 4 x H200, 2026-11-27).
"""

from __future__ import annotations

import torch

SDPA_BACKENDS = ("auto", "cudnn", "flash", "efficient", "math", "default")

#                 flash, efficient, cudnn (math: always on, the last resort)
_FLAGS = {"cudnn": (False, True, True), "flash": (True, True, False), "efficient": (False, True, False),
          "math": (False, False, False), "default": (True, True, True)}


def select_sdpa_backend(name: str = "auto") -> str:
    """Set the SDPA kernel flags for ``name`` (one of :data:`SDPA_BACKENDS`); returns the backend set.
    ``default`` leaves PyTorch's own choice (every kernel enabled)."""
    if name not in SDPA_BACKENDS:
        raise ValueError(f"attention backend must be one of {SDPA_BACKENDS}, got {name!r}")
    name = "cudnn" if name == "auto" else name
    flash, efficient, cudnn = _FLAGS[name]
    b = torch.backends.cuda
    b.enable_flash_sdp(flash)
    b.enable_mem_efficient_sdp(efficient)
    b.enable_math_sdp(True)
    b.enable_cudnn_sdp(cudnn)
    return name
