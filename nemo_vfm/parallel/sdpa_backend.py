"""Which kernel ``F.scaled_dot_product_attention`` uses on CUDA (a process-wide setting of PyTorch).

``cudnn``: cuDNN's flash attention first, the memory-efficient kernel as the fallback for masked
(cross-)attention; measured 593 vs 314 TFLOP/s (flash) forward + backward at 8k tokens, head dim 128,
on an H100, and equal to flash at 256 tokens, head dim 72 (docs/benchmarks.md). ``auto`` means ``cudnn`` on
CUDA. ``fa4``: FlashAttention-4 (the ``flash-attn-4`` package, CuTe DSL kernels for Hopper and Blackwell)
behind PyTorch's flash-attention entry points (``torch.nn.attention.activate_flash_attention_impl``), so
SDPA, compiled graphs and ring attention's ``flash`` blocks all run it; masked attention falls back to the
memory-efficient kernel. The flags are read when a graph is traced, so set them before compiling.
"""

from __future__ import annotations

import torch

SDPA_BACKENDS = ("auto", "cudnn", "flash", "efficient", "math", "default", "fa4")

#                 flash, efficient, math, cudnn
_FLAGS = {"cudnn": (False, True, False, True), "flash": (True, True, False, False),
          "efficient": (False, True, False, False), "math": (False, False, True, False),
          "default": (True, True, True, True), "fa4": (True, True, False, False)}


def select_sdpa_backend(name: str = "auto") -> str:
    """Set the SDPA kernel flags for ``name`` (one of :data:`SDPA_BACKENDS`); returns the backend set.
    ``default`` leaves PyTorch's own choice (every kernel enabled); ``fa4`` activates FlashAttention-4
    (:func:`activate_fa4`), any other name restores PyTorch's own flash kernel."""
    if name not in SDPA_BACKENDS:
        raise ValueError(f"attention backend must be one of {SDPA_BACKENDS}, got {name!r}")
    name = "cudnn" if name == "auto" else name
    if name == "fa4":
        activate_fa4()
    else:
        _restore_flash_impl()
    flash, efficient, math, cudnn = _FLAGS[name]
    b = torch.backends.cuda
    b.enable_flash_sdp(flash)
    b.enable_mem_efficient_sdp(efficient)
    b.enable_math_sdp(math)
    b.enable_cudnn_sdp(cudnn)
    return name


def fa4_unavailable_reason(device: torch.device | None = None) -> str | None:
    """Why FlashAttention-4 cannot run here (``None`` when it can): it needs a Hopper (sm90) or Blackwell
    (sm100) GPU, PyTorch's flash-attention registry (torch >= 2.10) and the ``flash-attn-4`` package."""
    if not torch.cuda.is_available():
        return "it needs a CUDA GPU"
    major, minor = torch.cuda.get_device_capability(device)
    if major not in (9, 10):
        return f"it needs a Hopper (sm90) or Blackwell (sm100) GPU, this one is sm{major}{minor}"
    try:
        from torch.nn.attention import list_flash_attention_impls
    except ImportError:
        return f"torch {torch.__version__} has no flash-attention registry (torch >= 2.10 has)"
    if "FA4" not in list_flash_attention_impls():
        return f"torch {torch.__version__} does not register FA4"
    try:
        import flash_attn.cute.interface  # noqa: F401
    except Exception as e:  # ImportError, or the CuTe DSL failing to find its CUDA libraries
        return f"the flash-attn-4 package does not import ({type(e).__name__}: {e}); pip install flash-attn-4"
    return None


def activate_fa4() -> None:
    """Route PyTorch's flash-attention kernels to FlashAttention-4; a clear error when it cannot run here."""
    reason = fa4_unavailable_reason()
    if reason:
        raise RuntimeError(f"attention_backend='fa4' cannot be used: {reason}. Use attention_backend='cudnn' "
                           f"(the default) instead.")
    from torch.nn.attention import activate_flash_attention_impl, current_flash_attention_impl

    if current_flash_attention_impl() != "FA4":
        activate_flash_attention_impl("FA4")


def _restore_flash_impl() -> None:
    try:
        from torch.nn.attention import current_flash_attention_impl, restore_flash_attention_impl
    except ImportError:
        return
    if current_flash_attention_impl() is not None:
        restore_flash_attention_impl()
