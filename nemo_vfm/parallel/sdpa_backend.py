"""Which kernel ``F.scaled_dot_product_attention`` uses on CUDA (a process-wide setting of PyTorch).

``cudnn``: cuDNN's flash attention first, the memory-efficient kernel as the fallback for masked
(cross-)attention; measured 593 vs 314 TFLOP/s (flash) forward + backward at 8k tokens, head dim 128,
on an H100, and equal to flash at 256 tokens, head dim 72 (docs/benchmarks.md). ``auto`` means ``cudnn`` on
CUDA. The flags are read when a graph is traced, so set them before compiling.

The narrowed flags suit our DiTs; a third-party model run in the same process (a text encoder, a VAE) may fit none
of the kernels left (UMT5's float position bias did not: "No viable backend"), so its wrapper's calls are decorated
with :func:`any_sdpa_kernel`.
"""

from __future__ import annotations

import functools

import torch

SDPA_BACKENDS = ("auto", "cudnn", "flash", "efficient", "math", "default")

#                 flash, efficient, math, cudnn
_FLAGS = {"cudnn": (False, True, False, True), "flash": (True, True, False, False),
          "efficient": (False, True, False, False), "math": (False, False, True, False),
          "default": (True, True, True, True)}


def select_sdpa_backend(name: str = "auto") -> str:
    """Set the SDPA kernel flags for ``name`` (one of :data:`SDPA_BACKENDS`); returns the backend set.
    ``default`` leaves PyTorch's own choice (every kernel enabled)."""
    if name not in SDPA_BACKENDS:
        raise ValueError(f"attention backend must be one of {SDPA_BACKENDS}, got {name!r}")
    name = "cudnn" if name == "auto" else name
    flash, efficient, math, cudnn = _FLAGS[name]
    b = torch.backends.cuda
    b.enable_flash_sdp(flash)
    b.enable_mem_efficient_sdp(efficient)
    b.enable_math_sdp(math)
    b.enable_cudnn_sdp(cudnn)
    return name


def any_sdpa_kernel(fn):
    """Run ``fn`` with every SDPA kernel enabled (PyTorch's own choice), whatever :func:`select_sdpa_backend` set;
    for the calls into third-party models (text encoders, VAEs)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    every = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH, SDPBackend.CUDNN_ATTENTION]

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with sdpa_kernel(every):
            return fn(*args, **kwargs)

    return wrapper
