"""Block swapping (``trainer.strategy.block_swap=N``): the frozen weights of the first ``N`` transformer blocks live
in (pinned) host memory and visit the GPU only while their block runs, so that a model whose frozen base does not
fit one card (LoRA on Wan 14B) still trains there.

- Which weights: the parameters with ``requires_grad=False`` of ``blocks[:N]`` (the LoRA bases, FP8 ones too).
  Trainable parameters (the adapters) stay on the device. For the EMA copy, the frozen-ness of the model's
  counterpart decides (``like``).
- Forward: a pre-hook on block ``i`` (outside an activation-checkpoint wrapper) makes its copy ready (the compute
  stream waits for it) and points the parameters at it; it starts the copy of block ``i + 1`` on a side stream
  (CUDA), so that the transfer overlaps block ``i``'s kernels. A post-hook points the parameters back at host
  memory and drops the device copy. A block's copy is one device buffer (each weight a 256-byte-aligned view of
  it): blocks of one shape reuse one cached allocation, where a tensor per weight fragments the allocator.
- Backward: the frozen linears need their weights again for the input gradient. Autograd would keep the device
  copy alive as a saved tensor, so block ``i``'s saved-tensor hooks (installed by
  :func:`nemo_vfm.parallel.activation_offload.apply_saved_tensor_hooks`) replace a saved tensor that lies in a
  device copy by a reference (:meth:`BlockSwapper.pack`). The first unpack of any of block ``i``'s saved tensors
  calls :meth:`BlockSwapper.prepare`: the block is fetched again (once, for all its weights), its parameters point
  at the copy, and block ``i - 1``'s copy starts. Under activation checkpointing the checkpoint unpacks the block's
  saved inputs before it recomputes the block, so the recomputation runs on the device copy, and the recomputed
  graph holds it until that block's backward is done. (No tensor op runs inside the checkpointed region: selective
  checkpointing would record it.) The last block of backward (block 0) stays on the device until the next forward.
- What autograd saves must be the weight itself (or a view): true for bf16 bases under bf16 autocast
  (``lora.frozen_dtype="bf16"``, which the 14B recipes use) and for fp32 without autocast. An fp32 base under
  bf16 autocast, or an FP8 base, is saved as its cast / dequantised copy, which stays on the device (or goes to
  the host with ``activation_offload``) until backward.
- Not supported: weights sharded by FSDP (more than one data-parallel rank with ``fsdp=True``) or tensor
  parallelism (DTensors), ``compile=True`` (the hooks would run inside the compiled call), pipeline parallelism.
  :meth:`BlockSwapper.kept_on_host` keeps the host-resident weights out of ``module.to(device)`` calls
  (Lightning's ``model_to_device``).

On a CPU device the "device copy" is a second host tensor: the mechanics run (and are tested) but save nothing.
"""

from __future__ import annotations

import bisect
import warnings
from contextlib import contextmanager, nullcontext

import torch
from torch import nn


def unwrap(block: nn.Module) -> nn.Module:
    """The module inside an activation-checkpoint wrapper (its forward is what checkpointing recomputes)."""
    return getattr(block, "_checkpoint_wrapped_module", block)


class _WeightRef:
    """A saved tensor that is a view of block ``block``'s ``k``-th swapped weight."""

    __slots__ = ("block", "k", "size", "stride", "offset")

    def __init__(self, block, k, t):
        self.block, self.k, self.size, self.stride, self.offset = block, k, t.size(), t.stride(), t.storage_offset()


class BlockSwapper:
    """Keeps the frozen parameters of ``blocks[:n]`` in host memory (see the module docstring).

    ``device``: the compute device. ``like``: the block list whose parameters' ``requires_grad`` decides which
    are frozen (the model's, for its EMA copy); default ``blocks``. Call :meth:`install` once the blocks are
    wrapped (activation checkpointing), before training.
    """

    def __init__(self, blocks, n: int, device, *, like=None):
        blocks = list(blocks)
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ValueError(f"block_swap must be an int >= 0 (blocks whose frozen weights live in host memory), "
                             f"got {n!r}.")
        if n > len(blocks):
            raise ValueError(f"block_swap={n} exceeds the {len(blocks)} transformer blocks of this network; set "
                             f"block_swap <= {len(blocks)}.")
        like = blocks if like is None else list(like)
        self.device = torch.device(device)
        self.pin = self.device.type == "cuda"
        self.stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self.entries: list[list[tuple[nn.Module, str]]] = []  # per block: (module, parameter name)
        for block, ref in zip(blocks[:n], like[:n]):
            frozen = {name for name, p in unwrap(ref).named_parameters() if not p.requires_grad}
            found, seen = [], set()
            for mod_name, mod in unwrap(block).named_modules():
                for name, p in mod._parameters.items():
                    full = f"{mod_name}.{name}" if mod_name else name
                    if p is None or full not in frozen or id(p) in seen:
                        continue
                    if type(p.data) is not torch.Tensor:
                        raise NotImplementedError(
                            f"block_swap moves whole frozen weights, but {full} is sharded ({type(p.data).__name__}: "
                            f"FSDP over several ranks or tensor parallelism); this combination is unsupported: use "
                            f"block_swap=0 (cpu_offload=True offloads FSDP shards) or fsdp=False with "
                            f"tensor_model_parallel_size=1.")
                    seen.add(id(p))
                    found.append((mod, name))
            self.entries.append(found)
        if n and not any(self.entries):
            warnings.warn(f"block_swap={n} has no effect: the first {n} blocks have no frozen weights (full "
                          f"fine-tuning); cpu_offload=True offloads trainable weights.", stacklevel=2)
        self._cache: dict[int, tuple[list[torch.Tensor], object]] = {}  # block -> (device copies, copy event)
        self._ptrs: dict[int, tuple[int, list[int]]] = {}  # device buffer address -> (block, its weights' byte starts)
        self._pointed: set[int] = set()  # blocks whose parameters point at their device copies
        self.fetches = 0  # device copies made (tests count them)
        self._to_host()

    def __len__(self) -> int:
        return len(self.entries)

    def params(self, i: int) -> list[nn.Parameter]:
        return [mod._parameters[name] for mod, name in self.entries[i]]

    @torch.no_grad()
    def _to_host(self) -> None:
        """Host tensors for the swapped parameters: moved (pinned on CUDA), or allocated for a meta build (a new
        Parameter, as ``to_empty`` makes one: a meta tensor cannot take host data)."""
        made = {}
        for mod, name in (e for block in self.entries for e in block):
            p = mod._parameters[name]
            if p.is_meta:
                if id(p) not in made:
                    made[id(p)] = nn.Parameter(torch.empty_like(p, device="cpu", pin_memory=self.pin), p.requires_grad)
                mod._parameters[name] = made[id(p)]
            elif p.device.type != "cpu" or (self.pin and not p.data.is_pinned()):
                p.data = p.data.to("cpu").pin_memory() if self.pin else p.data.to("cpu")

    @contextmanager
    def kept_on_host(self):
        """The swapped parameters are hidden from ``module.to()`` / ``to_empty()`` inside this context."""
        with kept_on_host([e for block in self.entries for e in block]):
            yield

    def install(self, blocks) -> BlockSwapper:
        """Register the forward fetch / release hooks on ``blocks[:n]`` (outside an activation-checkpoint wrapper:
        tensor ops inside it would be recorded by selective checkpointing). Backward goes through :meth:`prepare`,
        which the blocks' saved-tensor hooks call."""
        for i, block in enumerate(list(blocks)[: len(self)]):
            block.register_forward_pre_hook(lambda mod, args, i=i: self._use(i))
            block.register_forward_hook(lambda mod, args, out, i=i: self._release(i), always_call=True)
        return self

    # -- device copies -------------------------------------------------------------------------------
    @torch.no_grad()
    def _fetch(self, i: int) -> None:
        """Start copying block ``i``'s weights to the device (side stream on CUDA); a no-op if cached."""
        if i in self._cache or not 0 <= i < len(self):
            return
        if self.pin:  # a host tensor replaced since (e.g. a dtype cast) is pinned again, once
            for p in self.params(i):
                if not p.data.is_pinned():
                    p.data = p.data.pin_memory()
        host = [p.data for p in self.params(i)]
        starts, end = [], 0  # byte offsets of the weights in the block's one device buffer (256-byte aligned)
        for h in host:
            starts.append(-(-end // 256) * 256)
            end = starts[-1] + h.numel() * h.element_size()
        with torch.cuda.stream(self.stream) if self.stream is not None else nullcontext():
            flat = torch.empty(end, dtype=torch.uint8, device=self.device)
            copies = [flat[a:a + h.numel() * h.element_size()].view(h.dtype).view(h.shape).copy_(h, non_blocking=True)
                      for a, h in zip(starts, host)]
            event = self.stream.record_event() if self.stream is not None else None
        self._cache[i] = (copies, event)
        if copies:
            self._ptrs[flat.untyped_storage().data_ptr()] = (i, starts)
        self.fetches += 1

    def _ready(self, i: int) -> list[torch.Tensor]:
        """Block ``i``'s device copies, usable on the current stream."""
        self._fetch(i)
        copies, event = self._cache[i]
        if event is not None:
            compute = torch.cuda.current_stream(self.device)
            compute.wait_event(event)
            if copies:  # one buffer, allocated on the side stream, used (and freed) on this one
                copies[0].record_stream(compute)
            self._cache[i] = (copies, None)
        return copies

    def _drop(self, keep: set[int]) -> None:
        for j in [j for j in self._cache if j not in keep]:
            copies = self._cache.pop(j)[0]
            if copies:
                self._ptrs.pop(copies[0].untyped_storage().data_ptr(), None)

    def _point(self, i: int, direction: int) -> list[torch.Tensor]:
        """Point block ``i``'s parameters at its device copies (every other block's back at host memory), keep
        only ``i`` and the next block in ``direction`` on the device and start fetching that one."""
        if direction < 0 and self._pointed == {i}:  # every unpack of the block's saved tensors asks again
            return self._cache[i][0]
        for j in [j for j in self._pointed if j != i]:
            self._to_host_data(j)
        copies = self._ready(i)
        for p, c in zip(self.params(i), copies):
            if not hasattr(p, "_vfm_host"):
                p._vfm_host = p.data
            p.data = c
        self._pointed.add(i)
        self._drop({i, i + direction})
        self._fetch(i + direction)
        return copies

    def _to_host_data(self, i: int) -> None:
        for p in self.params(i):
            host = p.__dict__.pop("_vfm_host", None)
            if host is not None:
                p.data = host
        self._pointed.discard(i)

    def _use(self, i: int) -> None:  # forward pre-hook
        self._point(i, 1)

    def _release(self, i: int) -> None:  # forward hook
        self._to_host_data(i)
        self._drop({j for j in self._cache if j != i})  # autograd keeps references (or none), not this copy

    def prepare(self, i: int) -> list[torch.Tensor]:
        """Backward of block ``i`` is starting (one of its saved tensors is being unpacked): its weights on the
        device, for the references and for activation checkpointing's recomputation; block ``i - 1``'s on the
        way."""
        return self._point(i, -1)

    # -- saved tensors -------------------------------------------------------------------------------
    def pack(self, t: torch.Tensor):
        """A reference in place of a saved view of a swapped weight's device copy; None for any other tensor."""
        if type(t) not in (torch.Tensor, nn.Parameter) or t.device != self.device:
            return None
        hit = self._ptrs.get(t.untyped_storage().data_ptr())
        if hit is None:
            return None
        block, starts = hit
        return _WeightRef(block, bisect.bisect_right(starts, t.storage_offset() * t.element_size()) - 1, t)

    def unpack(self, ref: _WeightRef) -> torch.Tensor:
        """The saved view again, from the block's device copy (fetched now if it is not already)."""
        return self.prepare(ref.block)[ref.k].as_strided(ref.size, ref.stride, ref.offset)


@contextmanager
def kept_on_host(entries):
    """Hide the parameters ``entries`` (``(module, name)`` pairs) from ``module.to()`` / ``to_empty()`` (which walk
    ``module._parameters``) inside this context; their order in each module is kept."""
    saved = {}
    for mod, name in entries:
        order = saved.setdefault(id(mod), (mod, list(mod._parameters), {}))
        order[2][name] = mod._parameters.pop(name)
    try:
        yield
    finally:
        for mod, order, popped in saved.values():
            current = dict(mod._parameters)
            mod._parameters.clear()
            for name in order:
                mod._parameters[name] = popped[name] if name in popped else current[name]


def blocks_of(net: nn.Module, knob: str = "block_swap") -> nn.ModuleList:
    """The network's transformer blocks (``net.blocks``: every family's network declares them)."""
    blocks = getattr(net, "blocks", None)
    if not isinstance(blocks, nn.ModuleList):
        raise NotImplementedError(f"{knob} needs the network's transformer blocks as `.blocks` (an nn.ModuleList); "
                                  f"{type(net).__name__} has none: turn {knob} off.")
    return blocks


def block_swapper(net: nn.Module, n: int, device, *, fsdp: bool = False, like: nn.Module | None = None):
    """A :class:`BlockSwapper` for ``net``'s first ``n`` blocks (None for ``n == 0``); ``fsdp``: whether FSDP
    shards the network over several ranks (unsupported with block swapping); ``like``: the model, for its EMA."""
    if not n:
        return None
    if fsdp:
        raise ValueError("block_swap keeps whole frozen weights in host memory, which FSDP over several ranks shards "
                         "(unsupported combination); set fsdp=False (plain data parallel) or block_swap=0 "
                         "(cpu_offload=True offloads FSDP shards).")
    return BlockSwapper(blocks_of(net), n, device, like=None if like is None else blocks_of(like))


@torch.no_grad()
def move_except_sharded(module: nn.Module, device) -> None:
    """``module.to(device)`` except FSDP2's sharded parameters (DTensors), which ``cpu_offload`` (``CPUOffloadPolicy``)
    keeps in host memory: buffers and plain parameters move. (Hiding the shards from ``.to()`` as
    :func:`kept_on_host` does is no option: an FSDP2 module looks its parameters up again after a ``.to()``.)"""
    from torch.distributed.tensor import DTensor

    for m in module.modules():
        for name, b in m._buffers.items():
            if b is not None:
                m._buffers[name] = b.to(device)
        for p in m._parameters.values():
            if p is not None and not isinstance(p, DTensor):
                p.data = p.data.to(device)
