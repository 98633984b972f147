"""Tensor (and sequence) parallelism from a plan written as data.

A plan maps module paths *inside one transformer block* to a style name:

- ``"colwise"``: output features split across TP ranks (q/k/v, MLP in); returns local shards.
- ``"rowwise"``: input features split, partial outputs summed (attention out, MLP out); under
  sequence parallel the sum is a reduce-scatter onto the token dimension.
- ``"sp_input"``: a module whose first argument is the token stream: under sequence parallel it
  is all-gathered over the tokens before the module runs (no-op without SP).

Without sequence parallel every TP rank holds all tokens between sub-layers; with it, each holds
``1/tp`` of them, so norms, modulation and residual adds run on the local slice.

An entry whose path holds a LoRA adapter (``nemo_vfm.models.common.lora.LoRALinear``) is expanded into
its base layer and its two adapter layers, with three more styles: ``colwise_replicate`` (output
features split, then gathered), ``rowwise_replicate`` (partial outputs summed onto every rank) and
``colwise_out`` (output features split, then laid out as a rowwise layer's output).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    parallelize_module,
)

STYLES = ("colwise", "rowwise", "sp_input", "colwise_replicate", "rowwise_replicate", "colwise_out")


def style_for(name: str, sequence_parallel: bool, n_inputs: int = 1):
    """The torch ``ParallelStyle`` for a plan entry, or None when it is a no-op in this setting."""
    if name == "colwise":
        return ColwiseParallel()
    if name == "rowwise":
        return RowwiseParallel(output_layouts=Shard(1) if sequence_parallel else Replicate())
    if name == "colwise_replicate":
        return ColwiseParallel(output_layouts=Replicate())
    if name == "rowwise_replicate":
        return RowwiseParallel(output_layouts=Replicate())
    if name == "colwise_out":
        return ColwiseParallel(output_layouts=Shard(1) if sequence_parallel else Replicate())
    if name == "sp_input":
        if not sequence_parallel:
            return None
        return PrepareModuleInput(
            input_layouts=(Shard(1),) + (None,) * (n_inputs - 1),
            desired_input_layouts=(Replicate(),) + (None,) * (n_inputs - 1),
            use_local_output=False,
        )
    raise ValueError(f"unknown tensor-parallel style {name!r}; use one of {STYLES}.")


def check_tp_plan(blocks, plan: dict[str, str], optional: frozenset[str] = frozenset()) -> None:
    """Raise naming the plan paths that some block lacks, other than the ``optional`` ones."""
    for i, block in enumerate(blocks):
        names = dict(block.named_modules())
        missing = [p for p in plan if p not in names and p not in optional]
        if missing:
            raise ValueError(f"the tensor-parallel plan names {missing} but block {i} ({type(block).__name__}) has no "
                             f"such module; fix the family's TP plan (or declare the path optional)")


def apply_tensor_parallel(
    blocks: nn.ModuleList | list[nn.Module],
    tp_mesh: DeviceMesh,
    plan: dict[str, str],
    *,
    sequence_parallel: bool = False,
    sp_input_arity: dict[str, int] | None = None,
    optional: frozenset[str] = frozenset(),
) -> None:
    """Apply ``plan`` (block-relative path -> style) to every block in place.

    ``sp_input_arity`` gives the number of positional inputs of each ``sp_input`` module (only the
    first is gathered). A path missing from a block raises, naming it, unless it is ``optional`` (e.g.
    cross-attention in a model without text): a renamed layer never silently loses tensor parallelism.
    """
    sp_input_arity = sp_input_arity or {}
    check_tp_plan(blocks, plan, optional)
    for block in blocks:
        names = dict(block.named_modules())
        torch_plan = {}
        expanded = {}
        for path, style in plan.items():
            tp_entries = getattr(names.get(path), "tp_entries", None)  # a LoRA adapter: base + lora_A + lora_B
            if tp_entries is not None:
                expanded.update(tp_entries(path, style))
            else:
                expanded[path] = style
        for path, style in expanded.items():
            if path not in names:
                continue
            s = style_for(style, sequence_parallel, sp_input_arity.get(path, 1))
            if s is not None:
                torch_plan[path] = s
        # sp_input entries first: parallelize_module applies in dict order and a parent's input hook
        # must exist before the children are converted.
        ordered = dict(sorted(torch_plan.items(), key=lambda kv: not isinstance(kv[1], PrepareModuleInput)))
        parallelize_module(block, tp_mesh, ordered)


class _ScaleGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scale):
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g * ctx.scale, None


def scale_grad_hook(scale: float):
    """A forward hook that leaves a module's output as it is and multiplies its gradient by ``scale``."""
    return lambda mod, args, out: _ScaleGrad.apply(out, scale)
