"""Resume a training checkpoint into a network of any layout: one process or many, FSDP2/TP DTensors or plain.

Lightning's ``ModelParallelStrategy`` loads only into networks that hold DTensors, so a run that used one
process (nothing to shard) could not resume its own checkpoint. Here the weights and optimizer state go
through ``torch.distributed.checkpoint.state_dict`` (which takes plain modules and DTensor ones alike):

- a ``step=N.ckpt/`` folder (DCP, what :class:`~nemo_vfm.lightning.strategy.VFMParallelStrategy` writes at
  any process count) is read by ``dcp.load`` into this rank's shards, whatever layout wrote it;
- a ``step=N.ckpt`` file (a full checkpoint: ``save_distributed_checkpoint=False`` or a run on Lightning's
  single-device/DDP strategies) is read whole by every rank and scattered into the local shards.

Either way the rest of the checkpoint (loops, schedulers, callbacks) is returned for Lightning to restore.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from nemo_vfm.lightning.lora_checkpoint import BASE_ENTRY, check_omitted

META_FILE = "meta.pt"  # Lightning's name for the non-tensor part of a sharded checkpoint


def load_training_state(path: Path, module: torch.nn.Module, optimizers: list, strict: bool = True,
                        weights_only: bool = True) -> dict:
    """Load weights and optimizer states of ``path`` into ``module`` (the LightningModule) and ``optimizers``;
    returns the remaining checkpoint entries."""
    path, t0 = Path(path), time.perf_counter()
    load = _load_sharded if path.is_dir() else _load_full
    rest = load(path, module, optimizers, strict, weights_only)
    if not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0:
        print(f"checkpoint loaded: {path.name} in {time.perf_counter() - t0:.1f} s (rank 0's view)", flush=True)
    return rest


def _load_sharded(path: Path, module, optimizers, strict: bool, weights_only: bool) -> dict:
    import torch.distributed.checkpoint as dcp

    from nemo_vfm.io.dcp_metadata import SafeFileSystemReader

    meta = path / META_FILE
    rest = torch.load(meta, weights_only=weights_only) if meta.is_file() else {}
    reader = SafeFileSystemReader(path, allow_pickle=not weights_only)  # .metadata: read with the allow-list
    state = {"state_dict": get_model_state_dict(module)}
    if BASE_ENTRY in rest:  # a LoRA checkpoint without its frozen base: the network holds it already
        saved = {k.removeprefix("state_dict.") for k in reader.read_metadata().state_dict_metadata}
        check_omitted([k for k in state["state_dict"] if k not in saved], module, path)
        state["state_dict"] = {k: v for k, v in state["state_dict"].items() if k in saved}
        strict = False
    for i, opt in enumerate(optimizers):
        state[f"optimizer_{i}"] = get_optimizer_state_dict(module, opt)
    dcp.load(state, storage_reader=reader)
    set_model_state_dict(module, state["state_dict"], options=StateDictOptions(strict=strict))
    for i, opt in enumerate(optimizers):
        set_optimizer_state(module, opt, state[f"optimizer_{i}"])
    return rest


def _load_full(path: Path, module, optimizers, strict: bool, weights_only: bool) -> dict:
    checkpoint = torch.load(path, map_location="cpu", mmap=True, weights_only=weights_only)
    if BASE_ENTRY in checkpoint:  # a LoRA checkpoint without its frozen base: the network holds it already
        check_omitted([k for k in get_model_state_dict(module) if k not in checkpoint["state_dict"]], module, path)
        strict = False
    full = StateDictOptions(full_state_dict=True, strict=strict)
    set_model_state_dict(module, checkpoint.pop("state_dict"), options=full)
    saved = checkpoint.get("optimizer_states", [])
    for opt, osd in zip(optimizers, saved):
        if osd.get("state") and isinstance(next(iter(osd["state"])), int):  # a plain optimizer.state_dict()
            osd = _by_name(osd, module, opt)
        set_optimizer_state(module, opt, osd, options=full)
    return checkpoint


def _by_name(osd: dict, module, optimizer) -> dict:
    """A plain ``optimizer.state_dict()`` (states keyed by the index of the parameter in the optimizer's groups)
    keyed by parameter name instead, as ``set_optimizer_state_dict`` reads it. The indices are resolved through
    this run's optimizer, built the same way as the one that saved them."""
    name_of = {id(p): n for n, p in module.named_parameters()}
    names = [name_of[id(p)] for g in optimizer.param_groups for p in g["params"]]
    if len(names) != sum(len(g["params"]) for g in osd["param_groups"]):
        raise ValueError(f"the checkpoint's optimizer holds {sum(len(g['params']) for g in osd['param_groups'])} "
                         f"parameters but this run's holds {len(names)}; resume with the settings that wrote it "
                         "(e.g. the same LoRA targets), or start a new run from its weights with init_from=")
    groups = [{**g, "params": [names[i] for i in g["params"]]} for g in osd["param_groups"]]
    return {"state": {names[i]: s for i, s in osd["state"].items()}, "param_groups": groups}


def set_optimizer_state(module, optimizer, osd: dict, options: StateDictOptions | None = None) -> None:
    """``set_optimizer_state_dict``, then any setting (lr, betas, weight decay...) a param group lacks is the run's
    own. Before the optimizer ran on local shards, its groups were split by DTensor-ness, so a checkpoint of a layout
    that mixed DTensors and plain tensors (TP without FSDP) holds more groups than the optimizer has now; the groups
    it matched by parameter name then came back without their settings (KeyError 'betas' at the first step)."""
    before = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    set_optimizer_state_dict(module, optimizer, osd, options=options)
    for group, settings in zip(optimizer.param_groups, before):
        for k, v in settings.items():
            group.setdefault(k, v)


def count_steps_as_manual(checkpoint: dict) -> None:
    """A checkpoint written before the training step moved to Lightning's manual optimization counts its optimizer
    steps under ``automatic_optimization``; copy that count to where manual optimization reads ``global_step``
    (``train_step``), so such a checkpoint resumes at its step. A no-op for newer checkpoints."""
    loop = checkpoint.get("loops", {}).get("fit_loop", {})
    auto = loop.get("epoch_loop.automatic_optimization.optim_progress", {}).get("optimizer", {}).get("step")
    manual = loop.get("epoch_loop.manual_optimization.optim_step_progress")
    if auto is None or manual is None or manual["total"]["completed"] or not auto["total"]["completed"]:
        return
    loop["epoch_loop.manual_optimization.optim_step_progress"] = {k: dict(v) for k, v in auto.items()}
