"""Activation offloading (``trainer.strategy.activation_offload=True``): the tensors each transformer block saves for
backward wait in pinned host memory between its forward and its backward.

Each block's forward runs inside ``torch.autograd.graph.saved_tensors_hooks`` (entered by a forward pre-hook,
left by a forward hook). :meth:`ActivationOffloader.pack` copies a saved tensor to the host (on CUDA: on a side
stream that first waits for the compute stream; ``record_stream`` keeps the allocator from reusing the device
memory before the copy is done) and returns a handle; :meth:`ActivationOffloader.unpack` returns it to the device.
In backward, the first unpack of block ``i`` starts the copies of block ``i - 1``'s tensors on the side stream, so
they arrive while block ``i``'s backward runs. Kept on the device: tensors smaller than ``min_bytes`` (copying
them costs more than they hold), tensors not on the compute device, tensor subclasses (DTensor, FP8 tensors),
and parameters and their views (the weights stay resident anyway; copying them would only add traffic). A tensor
saved twice is copied twice.

With activation checkpointing the hooks sit outside the checkpoint wrapper. What a checkpointed block still saves
goes to the host: its inputs (torch's non-reentrant checkpoint keeps them as saved tensors, which pass through
these hooks); everything inside it is recomputed in backward, where the hooks are not active. The blocks that are
not checkpointed (``selective``) offload all they save. The op outputs that ``save_attention`` and
``selective_op`` keep stay in checkpointing's own cache, on the device.

On a CPU device the host is the device: the strategy does not install it there (it would only copy), but the
hooks work with any pair of devices, which is how they are tested.

We do not depend on torchtune for this (``torchtune.training.OffloadActivations`` does the same job for a whole
model): it is a fine-tuning library with its own model stack, and we need the hooks scoped per transformer
block, composed with block swapping's weight references (:mod:`nemo_vfm.parallel.block_swap`) in one hook pair,
and placed outside activation checkpointing; that is ~150 lines here.
"""

from __future__ import annotations

import os
import warnings
import weakref
from collections import defaultdict
from contextlib import nullcontext

import torch
from torch import nn

MIN_BYTES = 1 << 20  # smaller saved tensors stay on the device


class _Offloaded:
    """A saved tensor parked on the host: ``host`` (its copy), ``d2h`` (the event of that copy), ``early`` (a device
    copy prefetched for backward) and ``h2d`` (the event of that copy)."""

    __slots__ = ("host", "d2h", "early", "h2d", "block", "__weakref__")

    def __init__(self, host, d2h, block):
        self.host, self.d2h, self.block, self.early, self.h2d = host, d2h, block, None, None


def _is_parameter(t: torch.Tensor) -> bool:
    return isinstance(t, nn.Parameter) or isinstance(getattr(t, "_base", None), nn.Parameter)


class ActivationOffloader:
    """Moves saved tensors from ``device`` to ``host`` and back (see the module docstring); ``packed`` /
    ``unpacked`` count the tensors that went through the host."""

    def __init__(self, device, *, host="cpu", min_bytes: int = MIN_BYTES):
        self.device, self.host = torch.device(device), torch.device(host)
        self.min_bytes = min_bytes
        cuda = self.device.type == "cuda"
        self.pin = cuda and self.host.type == "cpu"
        self.stream = torch.cuda.Stream(self.device) if cuda else None
        self.block = 0  # the block whose forward is running (set by the hooks)
        self._by_block: dict[int, list] = defaultdict(list)  # block -> weak references to its handles
        self.packed = self.unpacked = 0

    def _stream(self):
        return torch.cuda.stream(self.stream) if self.stream is not None else nullcontext()

    def pack(self, t: torch.Tensor):
        if (type(t) is not torch.Tensor or t.device != self.device or t.numel() * t.element_size() < self.min_bytes
                or _is_parameter(t)):
            return t
        event = None
        if self.stream is not None:
            self.stream.wait_stream(torch.cuda.current_stream(self.device))  # t is written
        with self._stream():
            host = torch.empty_like(t, device=self.host, pin_memory=self.pin)
            host.copy_(t, non_blocking=self.pin)
            if self.stream is not None:
                t.record_stream(self.stream)
                event = self.stream.record_event()
        handle = _Offloaded(host, event, self.block)
        self._by_block[self.block].append(weakref.ref(handle))
        self.packed += 1
        return handle

    def prefetch(self, block: int) -> None:
        """Start copying ``block``'s parked tensors back to the device (side stream on CUDA)."""
        refs = self._by_block.pop(block, ())
        for ref in refs:
            h = ref()
            if h is None or h.early is not None:
                continue
            if self.stream is not None and h.d2h is not None:
                self.stream.wait_event(h.d2h)
            with self._stream():
                h.early = h.host.to(self.device, non_blocking=self.pin)
                h.h2d = self.stream.record_event() if self.stream is not None else None

    def unpack(self, h):
        if not isinstance(h, _Offloaded):
            return h
        self.unpacked += 1
        self._by_block.pop(h.block, None)
        self.prefetch(h.block - 1)
        t, h.early = h.early, None
        if t is None:  # not prefetched: copy on the compute stream, once the host copy is complete
            if self.stream is not None and h.d2h is not None:
                torch.cuda.current_stream(self.device).wait_event(h.d2h)
            return h.host.to(self.device, non_blocking=self.pin)
        if h.h2d is not None:
            compute = torch.cuda.current_stream(self.device)
            compute.wait_event(h.h2d)
            t.record_stream(compute)  # allocated on the side stream, used and freed on this one
        return t


def apply_saved_tensor_hooks(blocks, offloader: ActivationOffloader | None = None, swapper=None) -> None:
    """Run each block's forward inside ``saved_tensors_hooks`` that offload activations (``offloader``) and replace
    swapped weights by references (``swapper``, a :class:`~nemo_vfm.parallel.block_swap.BlockSwapper`, for its
    blocks). The hooks go on the outermost module of each block (outside activation checkpointing)."""
    for i, block in enumerate(blocks):
        swap = swapper if swapper is not None and i < len(swapper) else None
        if isinstance(block, nn.Identity) or (offloader is None and swap is None):
            continue

        def pack(t, swap=swap):
            ref = swap.pack(t) if swap is not None else None
            if ref is not None:
                return ("weight", ref)
            return ("act", offloader.pack(t) if offloader is not None else t)

        def unpack(packed, swap=swap, i=i):
            kind, x = packed
            if kind == "weight":
                return swap.unpack(x)
            if swap is not None:  # block i's backward (or its recomputation) is starting: its weights, please
                swap.prepare(i)
            return offloader.unpack(x) if offloader is not None else x

        contexts = []

        def enter(mod, args, i=i, pack=pack, unpack=unpack, contexts=contexts):
            if offloader is not None:
                offloader.block = i
                offloader._by_block.pop(i, None)  # handles of an earlier forward that no backward unpacked
            ctx = torch.autograd.graph.saved_tensors_hooks(pack, unpack)
            ctx.__enter__()
            contexts.append(ctx)

        def leave(mod, args, out, contexts=contexts):
            if contexts:
                contexts.pop().__exit__(None, None, None)

        block.register_forward_pre_hook(enter)
        block.register_forward_hook(leave, always_call=True)


def install_offload(net: nn.Module, device, activation_offload: bool = False, swapper=None) -> list:
    """The strategy's knobs on a parallelised ``net``: block swapping's fetch hooks (``swapper``) and one
    saved-tensor hook pair per block; returns the ``(module, name)`` parameters that must stay in host memory when
    the module is moved to the device (the swapped weights). On a CPU device activation offloading would copy host
    to host: it is skipped there, with a warning."""
    from nemo_vfm.parallel.block_swap import blocks_of

    device = torch.device(device)
    offloader = None
    if activation_offload and device.type == "cpu":
        warnings.warn("activation_offload=True has no effect on a CPU device (activations already live in host "
                      "memory).", stacklevel=2)
    elif activation_offload:
        offloader = ActivationOffloader(device)
    host = []
    if swapper is not None:
        swapper.install(blocks_of(net))
        host += [e for block in swapper.entries for e in block]
    if offloader is not None or swapper is not None:
        apply_saved_tensor_hooks(blocks_of(net, "activation_offload"), offloader, swapper)
        if device.type == "cuda":
            expandable_segments()
    return host


def expandable_segments() -> None:
    """Let the CUDA caching allocator grow segments in place (``expandable_segments:True``, PyTorch's remedy for a
    large "reserved but unallocated" share) unless ``PYTORCH_CUDA_ALLOC_CONF`` says otherwise. Offloading and block
    swapping allocate and free device copies of varying sizes every block: a Wan-14B LoRA run at a 24 GiB cap (one
    H100) ran out of memory with 2.1 GiB reserved but unallocated. Applies to segments allocated from now on; not
    with the ``cudaMallocAsync`` backend (no segments)."""
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    if "expandable_segments" not in conf and "cudaMallocAsync" not in conf:
        setting = getattr(torch._C, "_accelerator_setAllocatorSettings", None)  # torch.cuda's is deprecated in 2.11
        (setting or torch.cuda.memory._set_allocator_settings)("expandable_segments:True")
