"""Sharded checkpoints with torch distributed checkpoint (DCP): save, async save, load into any layout,
and export to one consolidated safetensors file.

Every rank writes only its own shards; the metadata records each tensor's global shape and the
pieces, keyed by the *plain model's* parameter names (FSDP/TP/AC/compile wrappers do not show), so a
checkpoint saved under one layout (e.g. TP2) loads under another (FSDP4, PP2, one process):
DCP reads whichever pieces each rank needs.

    save(path, model, optimizer)                    # all ranks
    fut = save(path, model, optimizer, async_=True) # returns a future; fut.result() before the next save
    load(path, model, optimizer)                    # all ranks, any layout
    export_safetensors(path, "model.safetensors")   # one process, no GPU needed

``model`` is a module, or this rank's pipeline stages (a list, several per rank under the interleaved
schedule). Stages save their optimizer state *flattened*, one entry per parameter name
(``optim.state.<name>.exp_avg``, ``optim.param_groups.<name>.lr``), so that every rank writes the
entries of its own stages, and loads into any layout; a single module keeps torch's nested format,
which loads into a module or one stage per rank.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import nn

MODEL_KEY = "model"
OPTIM_KEY = "optim"


def _modules(model) -> list[nn.Module]:
    return list(model) if isinstance(model, (list, tuple)) else [model]


def stage_prefixes(root: nn.Module) -> list[str]:
    """Paths of the :class:`~nemo_vfm.parallel.pipeline.StageList` modules under ``root`` ("" = root)."""
    from nemo_vfm.parallel.pipeline import StageList

    return [name for name, m in root.named_modules() if isinstance(m, StageList)]


def canonical_name(fqn: str, prefixes: list[str]) -> str:
    """``fqn`` without its stage-list index: ``model.1.blocks.3.w`` -> ``model.blocks.3.w``."""
    for p in prefixes:
        head = p + "." if p else ""
        if fqn.startswith(head):
            index, _, rest = fqn[len(head):].partition(".")
            if index.isdigit():
                return head + rest
    return fqn


def canonical_state(state: dict, prefixes: list[str], *, flat_optimizer: bool = False) -> tuple[dict, dict]:
    """``state`` keyed by canonical names (of duplicated entries, the first stage's copy) and the map
    original key -> canonical key. ``flat_optimizer``: keys are ``state.<fqn>.<k>`` / ``param_groups.<fqn>.<k>``."""
    out, names = {}, {}
    for key, v in state.items():
        if flat_optimizer:
            section, _, fqn = key.partition(".")
            names[key] = f"{section}.{canonical_name(fqn, prefixes)}"
        else:
            names[key] = canonical_name(key, prefixes)
        out.setdefault(names[key], v)
    return out, names


def original_keys(loaded: dict, names: dict) -> dict:
    """Undo :func:`canonical_state` after loading; each copy of a duplicated tensor gets its own clone."""
    out, seen = {}, set()
    for key, c in names.items():
        v = loaded[c]
        out[key] = v.clone() if c in seen and torch.is_tensor(v) else v
        seen.add(c)
    return out


def model_state(root: nn.Module, options=None) -> tuple[dict, dict]:
    """``root``'s model state dict under canonical names, and the key map (see :func:`canonical_state`)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return canonical_state(get_model_state_dict(root, options=options), stage_prefixes(root))


def flat_optimizer_state(root: nn.Module, optimizer, options=None) -> tuple[dict, dict]:
    """``optimizer``'s state, flattened per parameter name (canonical), and the key map."""
    import dataclasses

    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    options = dataclasses.replace(options or StateDictOptions(), flatten_optimizer_state_dict=True)
    return canonical_state(get_optimizer_state_dict(root, optimizer, options=options), stage_prefixes(root),
                           flat_optimizer=True)


def set_model_states(root: nn.Module, model_sd: dict, names: dict, *, strict: bool = True) -> None:
    """Load a canonical-keyed model state (from :func:`model_state`, filled by ``dcp.load``) into ``root``."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    set_model_state_dict(root, original_keys(model_sd, names), options=StateDictOptions(strict=strict))


def set_flat_optimizer_state(root: nn.Module, optimizer, optim_sd: dict, names: dict) -> None:
    """Load a canonical-keyed flattened optimizer state (from :func:`flat_optimizer_state`) into ``optimizer``."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(root, optimizer, original_keys(optim_sd, names),
                             options=StateDictOptions(flatten_optimizer_state_dict=True))


def _root(model) -> nn.Module:
    from nemo_vfm.parallel.pipeline import StageList

    return StageList(model) if isinstance(model, (list, tuple)) else model


def state_dict(model, optimizer=None, extra: dict | None = None) -> dict:
    """What :func:`save` writes: ``{"model": ..., "optim": ..., **extra}``."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    root = _root(model)
    state = {MODEL_KEY: model_state(root)[0]}
    if optimizer is not None:
        stages = isinstance(model, (list, tuple))
        state[OPTIM_KEY] = flat_optimizer_state(root, optimizer)[0] if stages else get_optimizer_state_dict(root, optimizer)
    if extra:
        state.update(extra)
    return state


def saved_flat_optimizer(path: str | os.PathLike, key: str = OPTIM_KEY, *, allow_pickle: bool = False) -> bool | None:
    """Whether the optimizer state under ``key`` in the checkpoint is flattened per parameter name (torch's
    nested format has a ``<key>.param_groups.<i>.params`` list per group); None if there is none."""
    import re

    from nemo_vfm.io.dcp_metadata import safe_read_metadata

    md = safe_read_metadata(Path(path) / ".metadata", allow_pickle=allow_pickle)
    keys = [k for k in md.state_dict_metadata if k.startswith(key + ".")]
    if not keys:
        return None
    nested = re.compile(rf"{re.escape(key)}\.param_groups\.\d+\.params")
    return not any(nested.fullmatch(k) for k in keys)


def save(path: str | os.PathLike, model, optimizer=None, *, extra: dict | None = None, async_: bool = False):
    """Write a sharded checkpoint folder (collective: call on every rank).

    ``async_=True`` copies the shards to CPU memory, returns a future at once and writes in the
    background; call ``future.result()`` before the next save. ``extra``: more stateful entries
    (tensors, or objects with ``state_dict``/``load_state_dict``).
    """
    import torch.distributed.checkpoint as dcp

    path = Path(path)
    state = state_dict(model, optimizer, extra)
    if async_:
        return dcp.async_save(state, checkpoint_id=str(path))
    dcp.save(state, checkpoint_id=str(path))
    return None


def load(path: str | os.PathLike, model, optimizer=None, *, extra: dict | None = None, strict: bool = True) -> None:
    """Load a checkpoint written by :func:`save` under any layout into ``model`` (and ``optimizer``).

    Flattened optimizer state (saved from stages) loads into any layout; a single module's nested state
    loads into a module or one stage per rank."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

    from nemo_vfm.io.dcp_metadata import SafeFileSystemReader

    path = Path(path)
    if not (path / ".metadata").exists():
        raise FileNotFoundError(f"{path} is not a complete distributed checkpoint (no .metadata); pick another one.")
    root, mods = _root(model), _modules(model)
    saved_flat = optimizer is not None and bool(saved_flat_optimizer(path))
    if optimizer is not None and not saved_flat and len(mods) > 1:
        raise ValueError(f"{path} holds one module's optimizer state (torch's nested format), which does not split "
                         f"over the {len(mods)} pipeline stages of this rank; load the weights only (optimizer=None) "
                         "or use one stage per rank.")
    msd, mnames = model_state(root)
    state = {MODEL_KEY: msd, **(extra or {})}
    if saved_flat:
        state[OPTIM_KEY], onames = flat_optimizer_state(root, optimizer)
    elif optimizer is not None:
        state[OPTIM_KEY] = get_optimizer_state_dict(mods[0], optimizer)
    dcp.load(state, storage_reader=SafeFileSystemReader(path))
    set_model_states(root, state[MODEL_KEY], mnames, strict=strict)
    if saved_flat:
        set_flat_optimizer_state(root, optimizer, state[OPTIM_KEY], onames)
    elif optimizer is not None:
        set_optimizer_state_dict(mods[0], optimizer, state[OPTIM_KEY])


def consolidated_state_dict(path: str | os.PathLike, prefix: str = MODEL_KEY + ".") -> dict[str, torch.Tensor]:
    """Read a DCP checkpoint in one process (no process group) into full tensors, keeping entries under
    ``prefix`` (stripped)."""
    from torch.distributed.checkpoint.format_utils import _EmptyStateDictLoadPlanner, _load_state_dict

    from nemo_vfm.io.dcp_metadata import SafeFileSystemReader

    sd: dict = {}
    _load_state_dict(sd, storage_reader=SafeFileSystemReader(path), planner=_EmptyStateDictLoadPlanner(),
                     no_dist=True)

    out = {}

    def walk(d, name=""):
        for k, v in d.items():
            key = f"{name}{k}"
            if isinstance(v, dict):
                walk(v, key + ".")
            elif torch.is_tensor(v) and key.startswith(prefix):
                out[key[len(prefix):]] = v

    walk(sd)
    return out


def export_safetensors(path: str | os.PathLike, out_file: str | os.PathLike, dtype: torch.dtype | None = None) -> Path:
    """Consolidate a sharded checkpoint's model weights into one ``.safetensors`` file for inference."""
    from safetensors.torch import save_file

    sd = consolidated_state_dict(path)
    if not sd:
        raise ValueError(f"no model weights under '{MODEL_KEY}.' in {path}; is it a nemo-vfm distributed checkpoint?")
    if dtype is not None:
        sd = {k: v.to(dtype) if v.is_floating_point() else v for k, v in sd.items()}
    out_file = Path(out_file)
    out_file.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_file.with_name(f".{out_file.name}.tmp{os.getpid()}")
    save_file({k: v.contiguous() for k, v in sd.items()}, str(tmp))
    os.replace(tmp, out_file)
    return out_file
