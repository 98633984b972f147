"""``trainer.memory_budget_gb``: pick the fastest memory settings whose estimated peak fits a GPU budget.

    choice = apply_memory_budget(24, model=model_cfg, data=data, trainer=trainer_cfg, optim=optim, lora=lora)

``trainer.memory_budget_gb="auto"``: the budget is this rank's GPU memory (:func:`device_memory_gib`; on the CPU the
knobs stay as set).

What it chooses: ``trainer.strategy.activation_checkpointing`` (none / save_attention / selective / full; for full and
save_attention every block or the fastest count of blocks that fits, ``activation_checkpointing_blocks``),
``lora.frozen_dtype`` (None / bf16 / fp8; LoRA under a ``*-mixed`` precision), ``trainer.strategy.activation_offload``,
``trainer.strategy.block_swap`` (0..blocks; LoRA: frozen block weights in pinned CPU memory),
``trainer.strategy.cpu_offload`` (full fine-tuning with FSDP) and ``optim.name="adamw8bit"`` (full fine-tuning, torchao
installed). **Rule: every one of these knobs is chosen, the recipe's values included (ties go to the fewest changes,
so they stay whenever they are as fast); knobs named in ``keep`` (``trainer.memory_budget_keep``; the CLI adds those
its overrides set, ``recipes/cli.py``) stay as set.**
Candidates are ordered by an estimated slowdown factor; the first whose estimated peak fits ``(1 - HEADROOM)`` x the
budget is taken (ties: fewest changes, then least memory), and whose host share (:func:`host_gib`: swapped
weights, offloaded activations, FSDP2's offloaded state) fits ``(1 - HEADROOM)`` x the host's ``MemAvailable`` per
local process. One line per faster candidate that does not fit is printed.

The memory model (per GPU, GiB = 2**30 bytes; an estimate, not a measurement). Parameter counts come from the
network built on the meta device (no memory allocated; :mod:`memory_workload`), with LoRA adapters applied, per
block and outside the blocks:

- trainable parameters: fp32 weights + AdamW state (8 B; ``adamw8bit``: 2 B + block scales) + fp32 gradients;
  frozen ones: 4 B (None), 2 B (bf16), 1 B per adapted base weight + 4 B per row + 2 B the rest (fp8); all divided
  by the model shards (FSDP x TP x PP); FSDP gathers two blocks in bf16 at a time. ``block_swap=N``: the frozen
  weights of N blocks leave the GPU, two blocks' worth stays as a staging buffer; under autocast a swapped block that
  is not checkpointed keeps the bf16 cast of an fp32 or fp8 base for backward (docs/finetuning.md).
  ``cpu_offload``: weights, gradients and optimizer state live on the host; two gathered blocks (bf16 weights +
  fp32 gradients) and the weights outside the blocks stay. An EMA copy (``ema_decay``) holds every weight again, in
  its training dtype, over the same shards and where the network's are (host under ``cpu_offload``; swapped blocks).
- activations, summed over the token streams the family declares (``FamilySpec.memory_streams``: Wan one video
  stream; LTX-2 a video and an audio stream, four attentions a block on each; video only: the video stream with
  two): an un-checkpointed block keeps ``tokens x (ACT_PER_HIDDEN x hidden + FFN intermediates x ffn)`` bf16
  values per stream (ACT_PER_HIDDEN fitted to the measured selective-vs-full gap of Wan 1.3B LoRA on one H100,
  docs/finetuning.md, for Wan's two attentions; ``ACT_PER_ATTENTION`` more per further attention, not fitted);
  times the stream's ``activation_scale`` (Kandinsky 6 declares 1.13, a lower bound from an out-of-memory run);
  a stream whose modulation is per token (``TokenStream.token_modulation``: Wan 2.2 TI2V-5B, whose objective gives
  per-token times) ``TOKEN_MODULATION`` more (its fp32 modulation terms; fitted to a 5B LoRA run with 8 of 30 blocks
  un-checkpointed at 27,280 tokens: 72.5 GiB against 55.2 estimated without the term, one H200, 2026-11-29);
  a checkpointed block its input (``save_attention``: also its attention output); a checkpointed run recomputes one
  block at a time; ``OUTSIDE_RESIDUALS`` token x hidden tensors live outside the blocks. ``activation_offload``:
  what two blocks keep stays on the GPU (and ``save_attention``'s attention outputs, kept by checkpointing).
  Backward frees activations as it fills gradients, so the peak counts the larger of the two. A compiled block's
  backward is counted ``BACKWARD_FFN_TENSORS`` token x FFN-width buffers beside them (fitted to the 480p and 720p
  peaks; the offloading runs, whose blocks are eager, match their peaks without the term). Plus ``OVERHEAD_GIB`` (CUDA context,
  workspaces). Fragmentation is not modelled: a run with a budget on CUDA switches the allocator to expandable
  segments (a Wan-14B LoRA run at 720p ran out of memory with 11.5 GiB reserved but unallocated without them).
  Checked against the measured Wan 1.3B / 14B peaks in tests/lightning/test_memory_budget.py.

Slowdown factors (estimates; relative to no checkpointing and nothing offloaded). Recomputation from the family's
FLOP counter (a step = 3 forwards): full 4/3, selective 1 + (checkpointed share)/3, save_attention
1 + (non-attention share)/3 (on Wan 1.3B LoRA at 32,760 tokens these give full/save_attention 1.21 and
selective/save_attention 1.06; measured 1.18 and 1.04). Host copies (``HOST_LINK_GBPS``) overlap compute
(``EFFECTIVE_TFLOPS``): factor ``max(1, copy time / compute time)`` times ``1 + SYNC_OVERHEAD`` per mechanism;
``cpu_offload`` adds the host AdamW (``CPU_ADAM_PARAMS_PER_S``), which does not overlap. activation_offload and
block_swap run the blocks eager (``nemo_vfm.parallel.config.ParallelConfig.resolve_compile``): ``EAGER`` where they
would be compiled (our Wan 1.3B LoRA step spends 192 ms of 1,835 in fused Triton element-wise kernels where
diffusers' eager step spends 709: (1835 - 192 + 709) / 1835 = 1.28). fp8 bases ``FP8_DEQUANT``, fp32 ones under
autocast ``FP32_FROZEN``; ``adamw8bit`` ``ADAMW8BIT`` (not measured one by one).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import itertools
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

from nemo_vfm.lightning.memory_workload import Workload, workload

GIB = 1024**3
ACT_PER_HIDDEN = 14.0  # bf16 values per token and hidden unit an un-checkpointed Wan block keeps (fit, see above)
TOKEN_MODULATION = 14.5  # bf16 values per token and hidden unit more under per-token modulation (fit, see above)
ACT_PER_ATTENTION = 5.0  # of which one attention's share (modulated input, q, k, v, normed q / k, output): not fitted
OUTSIDE_RESIDUALS = 4  # token x hidden bf16 tensors outside the blocks (embedding, head, residual gradient)
OVERHEAD_GIB = 2.5  # CUDA context, cuBLAS/cuDNN workspaces (fit, see above)
BACKWARD_FFN_TENSORS = 3  # token x FFN-width bf16 buffers a compiled block's backward holds (fit, see above)
HEADROOM = 0.10  # estimates must fit (1 - HEADROOM) x budget: Wan-14B LoRA estimated at 23.7 GiB ran out of 24 (H100)
EFFECTIVE_TFLOPS = 400.0  # bf16 model TFLOP/s of a step on an H100 (below what DiT-7B reaches on one H100: docs/benchmarks.md section 2)
HOST_LINK_GBPS = 25.0  # pinned host <-> device copies, one direction (PCIe 4/5 x16 in practice; not measured here)
CPU_ADAM_PARAMS_PER_S = 1e9  # host AdamW throughput (parameters per second; a guess, not measured)
EAGER = 1.28  # uncompiled blocks (activation_offload / block_swap run eager): Wan 1.3B LoRA profile, see above
SYNC_OVERHEAD = 0.02  # per offload mechanism: stream waits and copies that do not overlap
FP8_DEQUANT = 1.03  # fp8 frozen bases: a dequantising pass over the weights at every matmul
FP32_FROZEN = 1.01  # fp32 frozen weights under autocast: a bf16 copy of each weight made at every matmul
ADAMW8BIT = 1.02  # torchao's 8-bit AdamW: one compiled kernel per parameter (host overhead)
ADAMW8BIT_BYTES = 2 + 8 / 256  # two uint8 states + one fp32 scale per 256 values each

AC_MODES = ("none", "save_attention", "selective", "full")
DEFAULTS = {"activation_checkpointing": "none", "activation_checkpointing_blocks": None, "frozen_dtype": None,
            "activation_offload": False, "block_swap": 0, "cpu_offload": False, "optim_name": "adamw"}
STRATEGY_KNOBS = ("activation_checkpointing", "activation_checkpointing_blocks", "activation_offload", "block_swap",
                  "cpu_offload")
BLOCKWISE = ("full", "save_attention")  # the modes that read activation_checkpointing_blocks (of those it chooses)
KNOB_NAMES = {**{k: f"trainer.strategy.{k}" for k in STRATEGY_KNOBS}, "frozen_dtype": "lora.frozen_dtype",
              "optim_name": "optim.name"}


@dataclass(frozen=True, kw_only=True)
class MemorySettings:
    """One candidate: the knobs the chooser sets (names as in ``DEFAULTS``)."""

    activation_checkpointing: str = "none"
    activation_checkpointing_blocks: int | None = None  # full / save_attention on the first N blocks; None: all
    frozen_dtype: str | None = None
    activation_offload: bool = False
    block_swap: int = 0
    cpu_offload: bool = False
    optim_name: str = "adamw"

    def describe(self, against: MemorySettings | None = None) -> str:
        """The knobs that differ from ``against`` (default: the defaults), as ``name=value``."""
        ref = dataclasses.asdict(against) if against is not None else DEFAULTS
        said = [f"{KNOB_NAMES[k]}={v}" for k, v in dataclasses.asdict(self).items() if v != ref[k]]
        return ", ".join(said) or "no memory knob changed"

    def kept(self, current: MemorySettings) -> str:
        """The knobs left as ``current`` set them away from their defaults (what :meth:`describe` does not say)."""
        cur = dataclasses.asdict(current)
        return ", ".join(f"{KNOB_NAMES[k]}={v}" for k, v in dataclasses.asdict(self).items()
                         if v == cur[k] and v != DEFAULTS[k])


def _checkpointed(w: Workload, s: MemorySettings) -> list[bool]:
    """Which blocks ``s`` checkpoints (``selective``: every ``ac_every``-th from the first, as
    ``nemo_vfm.parallel.activation_checkpoint`` wraps them; ``activation_checkpointing_blocks=N``: the first N)."""
    n, mode = len(w.blocks), s.activation_checkpointing
    if mode == "selective":
        return [i % w.ac_every == 0 for i in range(n)]
    k = 0 if mode == "none" else n if s.activation_checkpointing_blocks is None else s.activation_checkpointing_blocks
    return [i < k for i in range(n)]


def _compiled(w: Workload, s: MemorySettings) -> bool:
    """Whether the blocks run compiled under ``s`` (activation_offload and block_swap run them eager)."""
    return w.compile and not (s.activation_offload or s.block_swap)


def _act_per_hidden(s) -> float:
    """bf16 values per token and hidden unit an un-checkpointed block keeps of stream ``s`` (its attentions counted:
    ACT_PER_HIDDEN for Wan's two, ACT_PER_ATTENTION more or less for each other)."""
    return ACT_PER_HIDDEN + ACT_PER_ATTENTION * (s.attentions - 2)


def pinned(nbytes: float) -> int:
    """Bytes of a pinned host tensor of ``nbytes``: PyTorch's caching host allocator rounds each one up to a power of
    two (an activation-offloaded run passed 1.6x its estimated host memory before this was counted, and the kernel's
    OOM killer ended it: docs/benchmarks.md section 8)."""
    return 0 if nbytes <= 0 else 1 << (math.ceil(nbytes) - 1).bit_length()


def _saved(w: Workload, alloc=float) -> tuple[float, float]:
    """(bytes an un-checkpointed block saves for backward, a checkpointed block's input), summed over the streams;
    ``alloc``: what one saved tensor of so many bytes takes (:func:`pinned` on the host)."""
    full = inp = 0.0
    for s in w.streams:
        h, f = alloc(2 * s.tokens * s.hidden_size), alloc(2 * s.tokens * s.ffn_size)
        full += ((_act_per_hidden(s) + TOKEN_MODULATION * s.token_modulation) * h + s.ffn_tensors * f) * s.activation_scale
        inp += h
    return full, inp


def _kept_activations(w: Workload, settings: MemorySettings, alloc=float) -> tuple[list[float], float, float]:
    """Bytes each block keeps for backward under ``settings`` that activation offloading moves to the host, bytes kept
    on the device in any case (``save_attention``'s attention outputs stay in checkpointing's cache), and one
    un-checkpointed block's (what a checkpointed block recomputes); ``alloc`` as :func:`_saved`."""
    full, inp = _saved(w, alloc)
    checkpointed = _checkpointed(w, settings)
    moved = [inp if c else full for c in checkpointed]
    # save_attention keeps each stream's self-attention output (and those of attentions with more keys than queries:
    # LTX-2's video-to-audio, audio-sized), about a checkpointed block's input
    return moved, (sum(checkpointed) * inp if settings.activation_checkpointing == "save_attention" else 0.0), full


def memory_breakdown(w: Workload, s: MemorySettings) -> dict[str, float]:
    """Estimated peak bytes per GPU of ``w`` under ``s``, by part (see the module docstring)."""
    shards, blocks = w.model_shards, w.blocks
    trainable = sum(p.trainable for p in blocks) + w.outside.trainable
    optim = 8 if s.optim_name == "adamw" else ADAMW8BIT_BYTES
    frozen = [p.frozen_bytes(s.frozen_dtype) for p in blocks]
    swapped = sum(frozen[: s.block_swap])
    if w.autocast and s.frozen_dtype not in ("bf16", "fp16"):  # a swapped block that is not checkpointed keeps the
        kept = _checkpointed(w, s)  # bf16 cast of its fp32 / fp8 weights for backward
        swapped -= sum(2 * (p.frozen_linear + p.frozen_other) for p, c in zip(blocks[: s.block_swap], kept) if not c)
    staging = min(2, s.block_swap) * max(frozen[: s.block_swap], default=0)
    biggest = max(p.total for p in blocks)
    if s.cpu_offload:  # two gathered blocks (bf16 weights, fp32 gradients) and the outside weights on the GPU
        states, grads = (2 * biggest + w.outside.total) * 6, 0.0
    else:
        states, grads = trainable * (4 + optim) / shards, trainable * 4 / shards
    gather = 2 * biggest * 2 if shards > 1 else 0
    weights = states + (sum(frozen) - swapped + w.outside.frozen_bytes(s.frozen_dtype)) / shards + staging + gather
    weights += ema_bytes(w, s)[0]
    moved, resident, full = _kept_activations(w, s)
    kept = min(2 * max(moved), sum(moved)) if s.activation_offload else sum(moved)  # offload: two blocks in flight
    acts = kept + resident + (full if any(_checkpointed(w, s)) else 0)  # the block being recomputed
    acts += sum((OUTSIDE_RESIDUALS * t.hidden_size + BACKWARD_FFN_TENSORS * t.ffn_size * _compiled(w, s)) * t.tokens
                for t in w.streams) * 2
    return {"weights and optimizer": weights, "max(gradients, activations)": max(grads, acts),
            "overhead": OVERHEAD_GIB * GIB}


def ema_bytes(w: Workload, s: MemorySettings) -> tuple[float, float]:
    """(GPU, host) bytes of the EMA copy (``ema_decay``), laid out like the network: fp32 trainable weights and frozen
    ones in their dtype over the model shards; on the host under ``cpu_offload``, and the swapped blocks' frozen
    weights on the host under ``block_swap``."""
    if not w.ema:
        return 0.0, 0.0
    frozen = [p.frozen_bytes(s.frozen_dtype) for p in w.blocks]
    trainable = sum(p.trainable for p in w.blocks) + w.outside.trainable
    total = (4 * trainable + sum(frozen) + w.outside.frozen_bytes(s.frozen_dtype)) / w.model_shards
    if s.cpu_offload:
        return 0.0, total
    swapped = sum(frozen[: s.block_swap]) / w.model_shards
    return total - swapped, swapped


def estimate_gib(w: Workload, s: MemorySettings) -> float:
    """Estimated peak GiB per GPU."""
    return sum(memory_breakdown(w, s).values()) / GIB


def host_gib(w: Workload, s: MemorySettings) -> float:
    """Estimated host GiB per process that the knobs of ``s`` keep: ``block_swap=N``, the frozen weights of N blocks
    (pinned, each weight rounded as :func:`pinned`); ``activation_offload``, what the blocks save for backward
    (pinned, each saved tensor rounded); ``cpu_offload`` (FSDP2's ``CPUOffloadPolicy``), this rank's shard of every
    weight, its fp32 gradient and the optimizer state (not rounded). Not counted: the process itself (Python, CUDA's
    host side, data workers); the headroom is left for it. Plus the EMA copy's host share (:func:`ema_bytes`)."""
    total = sum(p.frozen_bytes(s.frozen_dtype, pinned) for p in w.blocks[: s.block_swap])
    if s.activation_offload:
        total += sum(_kept_activations(w, s, pinned)[0])
    if s.cpu_offload:
        params = (*w.blocks, w.outside)
        trainable = sum(p.trainable for p in params) * (4 + 4 + (8 if s.optim_name == "adamw" else ADAMW8BIT_BYTES))
        total += (trainable + sum(p.frozen_bytes(s.frozen_dtype) for p in params)) / w.model_shards
    return (total + ema_bytes(w, s)[1]) / GIB


def device_memory_gib(accelerator: str = "auto") -> float | None:
    """``trainer.memory_budget_gb="auto"``: this process's GPU's memory in GiB (``LOCAL_RANK``'s device, made
    current first so that no other GPU gets a CUDA context); None on the CPU (``accelerator`` "cpu" or no CUDA).
    Every rank reads its own GPU: a job on GPUs of different sizes should name a budget instead."""
    import torch

    if str(accelerator) not in ("auto", "gpu", "cuda") or not torch.cuda.is_available():
        return None
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    return torch.cuda.get_device_properties(local).total_memory / GIB


def available_host_gib(processes: int = 1, meminfo: str = "/proc/meminfo") -> float | None:
    """``MemAvailable`` of ``meminfo`` shared by the ``processes`` of this machine; None where it cannot be read
    (then the host is not checked)."""
    try:
        m = re.search(r"^MemAvailable:\s+(\d+) kB", Path(meminfo).read_text(), re.M)
    except OSError:
        return None
    return None if m is None else int(m.group(1)) * 1024 / GIB / max(1, processes)


def slowdown(w: Workload, s: MemorySettings) -> float:
    """Estimated step time of ``s`` over that of no checkpointing and nothing offloaded (see the module docstring)."""
    moved, _, _ = _kept_activations(w, s)
    recompute = sum(_checkpointed(w, s)) / len(w.blocks)  # full: 1, selective / N blocks: their share
    if s.activation_checkpointing == "save_attention":
        recompute *= 1 - w.attention_share
    base_s = 3 * w.forward_flops / (EFFECTIVE_TFLOPS * 1e12)
    compute_s = base_s * (1 + recompute / 3) * (EAGER if w.compile and not _compiled(w, s) else 1)
    copies, mechanisms, host_s = 0.0, 0, 0.0
    if s.activation_offload:
        copies, mechanisms = copies + 2 * sum(moved), mechanisms + 1  # out in forward, back in backward
    if s.block_swap:
        swapped = sum(p.frozen_bytes(s.frozen_dtype) for p in w.blocks[: s.block_swap])
        copies, mechanisms = copies + 2 * swapped, mechanisms + 1  # in for forward and again for backward
    if s.cpu_offload:
        trainable = (sum(p.trainable for p in w.blocks) + w.outside.trainable) / w.model_shards
        copies, mechanisms = copies + 12 * trainable, mechanisms + 1  # fp32 weights in twice, gradients out
        host_s = trainable / CPU_ADAM_PARAMS_PER_S  # the host AdamW step: after backward, no overlap
    step_s = max(compute_s, copies / (HOST_LINK_GBPS * 1e9)) * (1 + SYNC_OVERHEAD) ** mechanisms + host_s
    factor = step_s / base_s
    if s.frozen_dtype == "fp8":
        factor *= FP8_DEQUANT
    elif s.frozen_dtype is None and w.lora and w.autocast:
        factor *= FP32_FROZEN
    if s.optim_name == "adamw8bit":
        factor *= ADAMW8BIT
    return factor


@dataclass(frozen=True)
class Choice:
    """The settings taken, their estimates, and the faster candidates that do not fit (settings, GiB, slowdown)."""

    settings: MemorySettings
    gib: float
    slowdown: float
    rejected: tuple[tuple[MemorySettings, float, float], ...]
    host_gib: float = 0.0  # host memory its offloading keeps per process (:func:`host_gib`)

    def report(self, budget_gib: float, current: MemorySettings | None = None, fit_gib: float | None = None) -> str:
        lines = [f"memory budget {budget_gib:g} GiB{'' if fit_gib is None else f' (estimates fit {fit_gib:.1f})'}: "
                 f"{self.settings.describe(current)} (estimated {self.gib:.1f} GiB"
                 f"{f', host {self.host_gib:.1f} GiB' if self.host_gib else ''}, slowdown x{self.slowdown:.2f}; "
                 "estimates, see nemo_vfm/lightning/memory_budget.py)"]
        if current is not None and (kept := self.settings.kept(current)):
            lines.append(f"  kept as set: {kept}")
        lines += [f"  rejected, faster but over budget: {s.describe(current)}: {g:.1f} GiB (x{f:.2f})"
                  for s, g, f in self.rejected]
        return "\n".join(lines)


def options(w: Workload, fixed: dict, *, mixed_precision: bool = True, torchao: bool = True, strategy: bool = True,
            offload: bool = True, fsdp: bool = True) -> dict[str, tuple]:
    """The values tried per knob. ``fixed`` (knob -> value: what the user set) is kept. ``strategy=False``: no
    ``VFMParallelStrategy`` carries the strategy knobs; ``offload=False``: the layout takes no offloading and no count
    of checkpointed blocks (pipeline parallelism: a stage holds some of the blocks); ``fsdp``: cpu_offload applies.
    Block swapping needs unsharded weights (``w.model_shards == 1``). ``block_swap`` ``None``: 0, then the fewest
    blocks that fit. ``activation_checkpointing_blocks`` ``None``: for ``full`` and ``save_attention``, every block
    and the fastest count that fits without block swapping (:func:`_ac_blocks`)."""
    unknown = set(fixed) - set(DEFAULTS)
    if unknown:
        raise ValueError(f"unknown memory knobs {sorted(unknown)}; the knobs are {sorted(DEFAULTS)}")
    offload = offload and strategy
    opts = {"activation_checkpointing": AC_MODES if strategy else ("none",),
            "activation_checkpointing_blocks": None if offload else (None,),
            "frozen_dtype": (None, "bf16", "fp8") if w.lora and mixed_precision else (None,),
            "activation_offload": (False, True) if offload else (False,),
            "block_swap": None if w.lora and offload and w.model_shards == 1 else (0,),
            "cpu_offload": (False, True) if not w.lora and fsdp and offload else (False,),
            "optim_name": ("adamw", "adamw8bit") if not w.lora and torchao else ("adamw",)}
    return {**opts, **{k: (v,) for k, v in fixed.items()}}


def _swaps(w: Workload, s: MemorySettings, budget_gib: float, tried) -> tuple[int, ...]:
    """``block_swap`` values for ``s``: ``tried``, or 0 and then the fewest blocks that fit (all: none fits)."""
    if tried is not None:
        return tuple(tried)
    if estimate_gib(w, s) <= budget_gib:
        return (0,)
    n = len(w.blocks)
    return 0, next((k for k in range(1, n + 1) if estimate_gib(w, dataclasses.replace(s, block_swap=k)) <= budget_gib), n)


def _ac_blocks(w: Workload, s: MemorySettings, budget_gib: float, tried) -> tuple[int | None, ...]:
    """``activation_checkpointing_blocks`` values for ``s``: those of ``tried`` that its mode reads (None: every
    block); ``tried`` None: every block and, for ``full`` / ``save_attention``, the fastest count whose estimate fits
    (without offloading the fewest: each block left un-checkpointed saves its recomputation, measured on DiT-7B at 74k
    tokens, docs/benchmarks.md section 8; with activation offloading, what it moves to the host costs copies too)."""
    if tried is not None:
        return tuple(n for n in tried if n is None or s.activation_checkpointing in BLOCKWISE)
    if s.activation_checkpointing not in BLOCKWISE:
        return (None,)
    counts = [dataclasses.replace(s, activation_checkpointing_blocks=n) for n in range(1, len(w.blocks))]
    fits = [c for c in counts if estimate_gib(w, c) <= budget_gib]
    return (None, min(fits, key=lambda c: slowdown(w, c)).activation_checkpointing_blocks) if fits else (None,)


def choose(w: Workload, budget_gib: float, opts: dict, current: MemorySettings | None = None,
           headroom: float = 0.0, host_limit_gib: float | None = None) -> Choice:
    """The fastest candidate of ``opts`` (see :func:`options`) whose estimate fits ``(1 - headroom) x budget_gib``
    and whose host share (:func:`host_gib`) ``(1 - headroom) x host_limit_gib`` (None: not checked); ties: fewest
    changes from ``current``, then least memory. Raises ``ValueError`` naming the smallest estimate."""
    current, fit = current or MemorySettings(), budget_gib * (1 - headroom)
    host_fit = None if host_limit_gib is None else host_limit_gib * (1 - headroom)
    base = [k for k in DEFAULTS if k not in ("block_swap", "activation_checkpointing_blocks")]
    scored = []
    for combo in itertools.product(*(opts[k] for k in base)):
        s = MemorySettings(**dict(zip(base, combo)))
        for blocks in _ac_blocks(w, s, fit, opts["activation_checkpointing_blocks"]):
            partial = dataclasses.replace(s, activation_checkpointing_blocks=blocks)
            for n in _swaps(w, partial, fit, opts["block_swap"]):
                c = dataclasses.replace(partial, block_swap=n)
                if c.cpu_offload and c.block_swap:  # cpu_offload keeps every weight on the host already (refused)
                    continue
                changes = sum(a != b for a, b in zip(dataclasses.astuple(c), dataclasses.astuple(current)))
                scored.append((round(slowdown(w, c), 4), changes, estimate_gib(w, c), c))
    scored.sort(key=lambda x: x[:3])
    on_gpu = [x for x in scored if x[2] <= fit]
    for i, (f, _, g, s) in enumerate(scored):
        h = host_gib(w, s) if g <= fit else None
        if h is not None and (host_fit is None or h <= host_fit):
            faster = [(r, rg, rf) for rf, _, rg, r in scored[:i] if rf < f]
            # those no other faster candidate beats in memory as well (the rest tell nothing new)
            shown = [x for x in faster if not any(y[2] <= x[2] and y[1] < x[1] for y in faster)]
            return Choice(s, g, f, tuple(shown), h)
    if on_gpu:  # the GPU would hold some, the host none of them
        h, s = min(((host_gib(w, x[3]), x[3]) for x in on_gpu), key=lambda hs: hs[0])
        raise ValueError(f"nothing fits trainer.memory_budget_gb={budget_gib:g} on this host: the candidates that fit "
                         f"the GPU need at least {h:.1f} GiB of host memory per process ({s.describe(current)}), "
                         f"{host_fit:.1f} GiB are available ({1 - headroom:.0%} of MemAvailable / processes); use "
                         "more GPUs (FSDP shards the weights and the offloaded state), a host with more memory, a "
                         "larger budget, or fewer processes per host")
    f, _, g, s = min(scored, key=lambda x: x[2])
    fits = f"trainer.memory_budget_gb={budget_gib:g}" + (f" (estimates must fit {fit:.1f})" if headroom else "")
    raise ValueError(f"nothing fits {fits}: the smallest estimate is {g:.1f} GiB ({s.describe(current)}); raise the "
                     "budget, lower data.batch_size or the clip size, use more GPUs (FSDP shards the weights), or "
                     "drop the memory knobs you fixed (on the command line or in trainer.memory_budget_keep)")


def _layout(strategy, trainer) -> tuple[object, int, int]:
    """(ParallelConfig, model shards, token shards) of the run; a strategy name gives the default config."""
    from nemo_vfm.parallel.config import ParallelConfig

    cfg = getattr(strategy, "config", None) or ParallelConfig()
    devices = trainer.devices if isinstance(trainer.devices, int) else 1
    world = int(os.environ.get("WORLD_SIZE", "0")) or devices * trainer.num_nodes
    tp, cp, pp = cfg.tensor_model_parallel_size, cfg.context_parallel_size, cfg.pipeline_model_parallel_size
    sharded = cfg.fsdp and not isinstance(strategy, str)  # a strategy name: Lightning's, which does not shard
    # FSDP shards over data parallel x CP (nemo_vfm.parallel.mesh's "fsdp" dimension), replicas hold copies
    fsdp = max(1, world // (tp * pp * cfg.data_parallel_replicate_size)) if sharded else 1
    return cfg, fsdp * tp * pp, cp * (tp if cfg.sequence_parallel else 1)


def plan_memory_budget(budget_gb: float, *, model, data, trainer, optim, lora=None, keep: tuple[str, ...] = (),
                       ema: bool = False, cuda: bool | None = None, torchao: bool | None = None,
                       host_limit_gib: float | None | str = "this host", objective=None) -> tuple[Choice, MemorySettings]:
    """(choice, the configs' settings) for this run, nothing set; ``cuda`` (a GPU run, whose blocks ``compile="auto"``
    compiles), ``torchao``: None: this machine's; ``host_limit_gib``: free host GiB per process; ``objective``: its
    ``trained_streams`` (a joint audio + video objective: ``("video", "audio")``; else the video stream) decide the
    token streams counted. Raises as choose."""
    import torch

    from nemo_vfm.lightning.strategy import VFMParallelStrategy

    strategy = trainer.strategy
    carries = isinstance(strategy, VFMParallelStrategy) or strategy == "auto"
    cfg, model_shards, token_shards = _layout(strategy, trainer)
    devices = trainer.devices if isinstance(trainer.devices, int) else 1
    current = MemorySettings(
        activation_checkpointing=cfg.activation_checkpointing,
        activation_checkpointing_blocks=cfg.activation_checkpointing_blocks, frozen_dtype=getattr(lora, "frozen_dtype", None),
        activation_offload=cfg.activation_offload, block_swap=cfg.block_swap, cpu_offload=cfg.cpu_offload,
        optim_name=optim.name)
    if unknown := set(keep) - set(DEFAULTS):
        raise ValueError(f"trainer.memory_budget_keep names {sorted(unknown)}, not memory knobs; use {sorted(DEFAULTS)}")
    compiled = cfg.compile is True or (cfg.compile == "auto" and (torch.cuda.is_available() if cuda is None else cuda))
    mixed = "mixed" in str(trainer.precision)
    w = workload(model, data, lora, model_shards=model_shards, token_shards=token_shards,
                 ac_every=cfg.activation_checkpointing_every, compile=compiled, autocast=mixed, ema=ema,
                 streams=tuple(getattr(objective, "trained_streams", ("video",))),
                 token_timesteps=getattr(objective, "token_timesteps", False))
    opts = options(w, {k: getattr(current, k) for k in keep}, mixed_precision=mixed, strategy=carries,
                   torchao=importlib.util.find_spec("torchao") is not None if torchao is None else torchao,
                   offload=cfg.pipeline_model_parallel_size == 1, fsdp=cfg.fsdp and cfg.expert_model_parallel_size == 1)
    if host_limit_gib == "this host":
        host_limit_gib = available_host_gib(int(os.environ.get("LOCAL_WORLD_SIZE", "0")) or devices)
    return choose(w, budget_gb, opts, current, headroom=HEADROOM, host_limit_gib=host_limit_gib), current


def apply_memory_budget(budget_gb: float, *, model, data, trainer, optim, lora=None, keep: tuple[str, ...] = (),
                        ema: bool = False, verbose: bool = True, objective=None) -> Choice:
    """:func:`plan_memory_budget`, then set the chosen knobs on ``trainer.strategy`` (``"auto"`` becomes a
    ``VFMParallelStrategy`` when a strategy knob changes), ``lora`` and ``optim``; those named in ``keep`` stay."""
    import torch

    from nemo_vfm.lightning.strategy import VFMParallelStrategy

    choice, current = plan_memory_budget(budget_gb, model=model, data=data, trainer=trainer, optim=optim, lora=lora,
                                         keep=keep, ema=ema, objective=objective)
    strategy = trainer.strategy
    if verbose:
        print(choice.report(budget_gb, current, fit_gib=budget_gb * (1 - HEADROOM)))
    s = choice.settings
    changes = {k: getattr(s, k) for k in STRATEGY_KNOBS if getattr(s, k) != getattr(current, k)}
    if changes and isinstance(strategy, str):
        trainer.strategy = VFMParallelStrategy(**changes)
    elif changes:  # what VFMParallelStrategy.__init__ derives from its knobs
        strategy.config = dataclasses.replace(strategy.config, **changes)
        strategy.parallelize_kwargs = strategy.config.family_knobs
    if lora is not None:
        lora.frozen_dtype = s.frozen_dtype
    optim.name = s.optim_name
    if torch.cuda.is_available() and str(trainer.accelerator) in ("auto", "gpu", "cuda"):
        from nemo_vfm.parallel.activation_offload import expandable_segments

        expandable_segments()  # the estimates leave no room for fragmentation; process-wide, for what follows too
    return choice
