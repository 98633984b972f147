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


def _model_state(model) -> dict:
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    state = {}
    for m in _modules(model):  # pipeline stages: disjoint names, except duplicated conditioning (same values)
        for k, v in get_model_state_dict(m).items():
            state.setdefault(k, v)
    return state


def _optim_state(model, optimizer) -> dict:
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    mods = _modules(model)
    if len(mods) != 1:
        raise NotImplementedError("optimizer state for several pipeline stages on one rank is not supported yet; "
                                  "save the model only or use one stage per rank.")
    return get_optimizer_state_dict(mods[0], optimizer)


def state_dict(model, optimizer=None, extra: dict | None = None) -> dict:
    state = {MODEL_KEY: _model_state(model)}
    if optimizer is not None:
        state[OPTIM_KEY] = _optim_state(model, optimizer)
    if extra:
        state.update(extra)
    return state


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
    """Load a checkpoint written by :func:`save` under any layout into ``model`` (and ``optimizer``)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    path = Path(path)
    if not (path / ".metadata").exists():
        raise FileNotFoundError(f"{path} is not a complete distributed checkpoint (no .metadata); pick another one.")
    state = state_dict(model, optimizer, extra)
    dcp.load(state, checkpoint_id=str(path))
    mods = _modules(model)
    for m in mods:
        own = set(m.state_dict().keys())
        sub = {k: v for k, v in state[MODEL_KEY].items() if k in own}
        set_model_state_dict(m, sub, options=StateDictOptions(strict=strict and len(mods) == 1))
    if optimizer is not None:
        set_optimizer_state_dict(mods[0], optimizer, state[OPTIM_KEY])


def consolidated_state_dict(path: str | os.PathLike, prefix: str = MODEL_KEY + ".") -> dict[str, torch.Tensor]:
    """Read a DCP checkpoint in one process (no process group) into full tensors, keeping entries under
    ``prefix`` (stripped)."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.format_utils import _EmptyStateDictLoadPlanner, _load_state_dict

    sd: dict = {}
    _load_state_dict(sd, storage_reader=FileSystemReader(str(path)), planner=_EmptyStateDictLoadPlanner(),
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
