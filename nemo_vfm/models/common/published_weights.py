"""Streaming a published weights folder (safetensors shards) into a network: the loader every family's ``weights.py``
calls with what differs between families, its key map.

A family turns the folder's keys into :class:`Source` s, one per parameter of its plain network (our names): the
file keys the parameter is made of and, where it is not one key as it is, a conversion (a fused qkv from three
keys, reordered halves). Keys it maps to nothing are not loaded (weights the network does not build).
:func:`load_published` then checks the map against the network (a name the network lacks or a parameter no key
fills: a ``KeyError`` naming it, before anything is read; a shape that differs: a ``ValueError`` naming the key when
its tensor comes) and fills the network one tensor at a time:

- plain, or built on the meta device (each parameter assigned as read, in its dtype), or already parallelised:
  a DTensor parameter (FSDP2, TP) gets only its local shard, read as a slice of the safetensors tensor (a converted
  source is computed whole first), so no rank reads or holds a full copy of the network;
- a network with LoRA adapters takes the weights as its base weights (``p.base.weight`` for ``p.weight``); its
  adapters are left as they are (``lora.init_lora_weights``);
- an FP8 base (``LoRAConfig.frozen_dtype="fp8"``, :class:`~nemo_vfm.models.common.fp8_weights.FP8FrozenLinear`) is
  quantised as it is read (``fp8_weights.fill_quantized``: each rank reads whole rows of its shard); its
  ``weight_scale`` is computed, not read.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

__all__ = ["Source", "safetensors_files", "load_published"]


@dataclass(frozen=True)
class Source:
    """Where one parameter of ours comes from: the file ``keys`` and ``convert(*tensors)`` -> the parameter (None:
    the one key as it is, read slice by slice)."""

    keys: tuple[str, ...]
    convert: Callable[..., torch.Tensor] | None = None

    def __post_init__(self):
        if not self.keys or (self.convert is None and len(self.keys) != 1):
            raise ValueError(f"a Source is one file key, or several with a convert function; got {self.keys}")


def safetensors_files(folder: str | Path, what: str) -> list[Path]:
    """The safetensors files of a transformer ``folder`` (those its ``*.safetensors.index.json`` names, when there
    is one); ``FileNotFoundError`` naming ``what`` the folder should be when it has none."""
    d = Path(folder)
    index = sorted(d.glob("*.safetensors.index.json"))
    if index:
        return [d / n for n in sorted(set(json.loads(index[0].read_text())["weight_map"].values()))]
    files = sorted(d.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no safetensors weights in {d}; point at {what}")
    return files


def _targets(model: nn.Module) -> dict[str, tuple[nn.Module, str]]:
    """``{plain network's parameter name: (module, attribute)}`` of the parameters a weights folder fills: wrapper
    prefixes (activation checkpointing, compile) looked through, LoRA bases under the plain names, adapters and FP8
    scales left out."""
    from nemo_vfm.models.common.fp8_weights import FP8FrozenLinear
    from nemo_vfm.models.common.lora_names import adapted_paths, plain_param_name
    from nemo_vfm.parallel.grads import clean_name

    lora_paths = {clean_name(n) for n in adapted_paths(model)}
    out = {}
    for mn, m in model.named_modules():
        for pn, _ in m.named_parameters(recurse=False):
            if pn == "weight_scale" and isinstance(m, FP8FrozenLinear):
                continue  # an FP8 base's scales: computed from its weight as it is read
            name = plain_param_name(clean_name(f"{mn}.{pn}" if mn else pn), lora_paths)
            if name is not None:  # adapters are not in a published folder
                out[name] = (m, pn)
    return out


def _missing_message(family: str, path, hint: str, missing: set[str], leaves: set[str]) -> str:
    """Why a folder lacks parameters of the model: parameters of a kind no folder of the family holds (``leaves``:
    the last name pieces the folder has) are not a config mismatch but a part of the network the loader does not
    fill."""
    foreign = sorted(n for n in missing if n.rpartition(".")[2] not in leaves)
    if foreign:
        return (
            f"{len(foreign)} parameters of this {family} model are of a kind no {family} weights folder holds, "
            f"e.g. {foreign[:3]}: they were added to the network after it was built (by a LoRA or model option) "
            f"and nemo_vfm's {family} loader does not fill them; not a config mismatch: report it with the option "
            f"used"
        )
    return (
        f"the weights in {path} lack {len(missing)} parameters of this {family} model, e.g. {sorted(missing)[:3]}; "
        f"the config ({hint}) does not match the checkpoint, or a shard is missing"
    )


@torch.no_grad()
def load_published(
    model: nn.Module,
    files: Sequence[str | Path],
    sources: Callable[[list[str]], dict[str, Source]],
    *,
    family: str,
    hint: str,
    path: str | Path | None = None,
    strict: bool = True,
) -> int:
    """Stream the safetensors ``files`` into ``model`` (module docstring) and return the number of elements read.

    ``sources(keys)``: the folder's keys (every file's, in file order) -> ``{our name: Source}``. ``family`` (e.g.
    ``"Wan"``) and ``hint`` (what a mismatched config gets wrong, e.g. ``"flavor: layers, sizes"``) word the errors;
    ``path``: the folder named in them. ``strict=False``: names the model lacks are skipped and parameters no key
    fills are left as they are."""
    from safetensors import safe_open

    from nemo_vfm.models.common.fp8_weights import FP8FrozenLinear, fill_quantized, quantize_rowwise
    from nemo_vfm.parallel.materialize import fill_local

    params = _targets(model)
    with ExitStack() as stack:
        handles = [stack.enter_context(safe_open(str(f), framework="pt")) for f in files]
        where = {k: (h, Path(f).name) for f, h in zip(files, handles) for k in h.keys()}
        mapped = sources(list(where))
        unknown = sorted({k for s in mapped.values() for k in s.keys} - set(where))
        if unknown:  # a family's map names a key the folder lacks (e.g. one of a fused qkv's parts)
            raise KeyError(
                f"the weights in {path or Path(files[0]).parent} lack {unknown[:3]}, which this {family} "
                f"model's parameters are made of; a shard is missing or the folder is incomplete"
            )
        extra = [n for n in mapped if n not in params]
        if extra and strict:
            s = mapped[extra[0]]
            raise KeyError(
                f"{where[s.keys[0]][1]} has {', '.join(map(repr, s.keys))} ({extra[0]!r}) that this "
                f"{family} model lacks: the weights do not match the config ({hint})"
            )
        missing = set(params) - set(mapped)
        if missing and strict:
            leaves = {n.rpartition(".")[2] for n in mapped}
            raise KeyError(_missing_message(family, path or Path(files[0]).parent, hint, missing, leaves))
        n_read = 0
        for name, src in mapped.items():
            if name not in params:
                continue
            mod, attr = params[name]
            p = getattr(mod, attr)
            read, shape = _reader(src, where)
            if shape != tuple(p.shape):
                raise ValueError(
                    f"{', '.join(src.keys)}: shape {shape} in the weights, {tuple(p.shape)} in the "
                    f"model; the config does not match the checkpoint"
                )
            fp8 = isinstance(mod, FP8FrozenLinear) and attr == "weight"  # a frozen LoRA base stored as e4m3
            if p.is_meta:
                t = read(None)
                if fp8:
                    bits, scale = quantize_rowwise(t)
                    mod.weight = nn.Parameter(bits, requires_grad=False)
                    mod.weight_scale = nn.Parameter(scale, requires_grad=False)
                else:
                    setattr(mod, attr, nn.Parameter(t.to(p.dtype), requires_grad=p.requires_grad))
                n_read += t.numel()
            else:
                n_read += fill_quantized(mod, read) if fp8 else fill_local(p, read)
    return n_read


def _reader(src: Source, where: dict) -> tuple[Callable, tuple[int, ...]]:
    """(``read(region)``: the source's ``region``, or all of it for None; its shape). One key is read slice by slice;
    a converted source is computed whole once."""
    if src.convert is None:
        key = src.keys[0]
        handle = where[key][0]
        sl = handle.get_slice(key)

        def read(region):
            return handle.get_tensor(key) if region is None else sl[region]

        return read, tuple(sl.get_shape())
    full = src.convert(*(where[k][0].get_tensor(k) for k in src.keys))
    return (lambda region: full if region is None else full[region]), tuple(full.shape)
