"""Load a trained network (and what is needed to sample from it) from a training checkpoint.

Three kinds of checkpoint, all usable under any generation layout (one GPU, CP, TP):

| kind | what | written by |
|---|---|---|
| ``file`` | one ``step=N.ckpt`` file (Lightning) | single-device training |
| ``dcp`` | a sharded ``step=N.ckpt/`` folder (DCP, ``.metadata`` + ``meta.pt``) | ``VFMParallelStrategy`` |
| ``safetensors`` | one consolidated ``.safetensors`` file with the config in its header | :func:`export_safetensors` |
| ``wan`` | a published Wan 2.1 folder (diffusers / original layout, or a pipeline folder) | ``nemo_vfm.inference.wan`` |
| ``hunyuan`` | a published HunyuanVideo 1.5 folder (T2V and I2V pipeline folders sample) | ``nemo_vfm.inference.hunyuan`` |

:func:`read_checkpoint_info` reads the model config, objective and generation settings (cheap for
``dcp`` and ``safetensors``); :func:`load_weights` fills a network that may already be parallelised
(DTensor parameters get only their local piece; DCP reads only the pieces each rank needs).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from nemo_vfm.inference.checkpoint_info import CheckpointInfo, Generation
from nemo_vfm.inference.families import published_kinds
from nemo_vfm.inference.published import load_published, published_info, published_state_dict
from nemo_vfm.io.config_header import from_header_json, to_header_json
from nemo_vfm.models.common.fp8_weights import quantize_rowwise

META_KEY = "nemo_vfm"  # safetensors header entry holding the JSON config


@dataclass
class LoadedModel:
    net: torch.nn.Module  # EMA weights when the checkpoint has them
    objective: object
    model_config: object
    generation: Generation  # tokenizer / text-encoder specs, latent shape, fps (empty when unknown)
    step: int


def _latest(folder: Path, allow_pickle: bool = False) -> Path | None:
    """The newest usable ``step=N.ckpt`` (file, or DCP folder) in ``folder``; newer unusable ones are warned about."""
    from nemo_vfm.io.checkpoint_files import latest_checkpoint

    return latest_checkpoint(folder, allow_pickle=allow_pickle)


def resolve_checkpoint(path: str | Path, allow_pickle: bool = False) -> Path:
    """A checkpoint file or folder, or the newest ``step=N.ckpt`` in an experiment (or ``checkpoints/``) folder."""
    path = Path(path)
    from nemo_vfm.io.checkpoint_files import checkpoint_step, verify_checkpoint

    sharded = path.is_dir() and checkpoint_step(path) is not None
    if sharded and (why := verify_checkpoint(path, allow_pickle=allow_pickle)):
        raise ValueError(f"cannot use checkpoint {path}: {why}")  # a sharded step=N.ckpt/ folder, incomplete
    if path.is_dir() and not (path / ".metadata").exists():
        found = _latest(path / "checkpoints", allow_pickle) or _latest(path, allow_pickle)
        if found is None:
            raise FileNotFoundError(f"no step=N.ckpt checkpoint under {path}")
        path = found
    if not path.exists():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    if path.suffix != ".safetensors":
        why = verify_checkpoint(path, allow_pickle=allow_pickle)
        if why:
            raise ValueError(f"cannot use checkpoint {path}: {why}")
    return path


# -- reading ------------------------------------------------------------------------------------------
def _from_hparams(path: Path, kind: str, ckpt: dict, state=None) -> CheckpointInfo:
    from nemo_vfm.io.checkpoint_files import LORA_BASE_ENTRY

    hp = ckpt.get("hyper_parameters", {})
    if "model_config" not in hp:
        raise ValueError(f"{path} was not written by nemo_vfm.train (no model_config in its hyper-parameters)")
    return CheckpointInfo(path, kind, hp["model_config"], hp["objective"], hp.get("generation"),
                          int(ckpt.get("global_step", 0)), state, hp.get("lora"),
                          base_from=(ckpt.get(LORA_BASE_ENTRY) or {}).get("pretrained"))


def read_checkpoint_info(path: str | Path, allow_pickle: bool = False) -> CheckpointInfo:
    """Model config, objective, generation settings and step of a checkpoint (see the module docstring);
    a published Wan 2.1 folder (diffusers or original layout, or a pipeline folder) reads as kind ``wan``.
    Pickled files load with ``weights_only=True`` (our config classes allowed); ``allow_pickle=True`` unpickles
    anything (trusted files only)."""
    from nemo_vfm.io.safe_load import safe_load

    if (published := published_info(path)) is not None:
        return published
    path = resolve_checkpoint(path, allow_pickle)
    if path.is_dir():
        meta = path / "meta.pt"
        if not meta.exists():
            raise ValueError(f"{path} is a distributed checkpoint without Lightning's meta.pt (no model config); "
                             "generate from a checkpoint written by nemo_vfm.train")
        ckpt = safe_load(meta, allow_pickle=allow_pickle)
        info = _from_hparams(path, "dcp", ckpt)
        info.allow_pickle = allow_pickle
        return info
    if path.suffix == ".safetensors":
        from safetensors import safe_open

        try:
            with safe_open(str(path), "pt") as f:
                header = (f.metadata() or {}).get(META_KEY)
        except Exception as e:  # safetensors raises its own error type for a torn or foreign file
            raise ValueError(f"{path} is not a readable safetensors file ({e}); re-export it") from e
        if header is None:
            raise ValueError(f"{path} has no nemo_vfm config in its header (plain weights); write it with "
                             "nemo_vfm.inference.checkpoint.export_safetensors or `vfm generate --export-safetensors`")
        try:
            meta = from_header_json(json.loads(header), path)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: the nemo_vfm header is not valid JSON ({e})") from e
        return CheckpointInfo(path, "safetensors", meta["model_config"], meta["objective"],
                              meta.get("generation"), int(meta.get("step", 0)))
    ckpt = safe_load(path, mmap=True, allow_pickle=allow_pickle)
    return _from_hparams(path, "file", ckpt, ckpt["state_dict"])


def _dcp_metadata(info: CheckpointInfo) -> dict:
    """``{key: TensorStorageMetadata | BytesStorageMetadata}`` of a DCP checkpoint, read with the allow-list."""
    from nemo_vfm.io.dcp_metadata import safe_read_metadata

    return safe_read_metadata(info.path / ".metadata", allow_pickle=info.allow_pickle).state_dict_metadata


def _dcp_reader(info: CheckpointInfo):
    from nemo_vfm.io.dcp_metadata import SafeFileSystemReader

    return SafeFileSystemReader(info.path, allow_pickle=info.allow_pickle)


def _prefix(keys, use_ema: bool, root: str = "") -> str:
    ema = any(k.startswith(root + "ema.") for k in keys)
    return root + ("ema." if use_ema and ema else "model.")


def full_state_dict(info: CheckpointInfo, use_ema: bool = True) -> dict[str, torch.Tensor]:
    """All weights as full tensors in this process (for export and for small models); a LoRA run's
    adapters are merged into their base weights (plain model keys)."""
    state = raw_state_dict(info, use_ema)
    from nemo_vfm.models.common.lora import has_lora, merge_lora_state_dict

    if has_lora(state):
        if info.lora is None:
            raise ValueError(f"{info.path} holds LoRA adapters but no LoRA config (rank/alpha) to merge them with")
        state = merge_lora_state_dict(state, info.lora.scale)
    return state


def raw_state_dict(info: CheckpointInfo, use_ema: bool = True) -> dict[str, torch.Tensor]:
    """All weights as saved (LoRA runs: ``.base.`` / ``.lora_A.`` / ``.lora_B.`` keys), full tensors; a LoRA
    checkpoint saved without its frozen base (``info.base_from``) gets it from that folder, under the saved names."""
    saved = _saved_state_dict(info, use_ema)
    paths = {k.split(".lora_A.")[0] for k in saved if ".lora_A." in k}
    frozen = getattr(info.lora, "frozen_dtype", None)  # the base as the run stored it (apply_lora)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.bfloat16}.get(frozen)
    base = published_state_dict(_base_info(info), None if frozen == "fp8" else dtype) if info.base_from else {}
    for name, v in base.items():  # plain names; an FP8 base quantised from the folder's values, as in training
        head, _, leaf = name.rpartition(".")
        if frozen == "fp8" and head in paths and leaf == "weight":  # e4m3 bits + row scales, as trained
            saved[f"{head}.base.weight"], saved[f"{head}.base.weight_scale"] = quantize_rowwise(v)
            continue
        v = v.to(dtype) if dtype is not None and v.is_floating_point() else v
        saved.setdefault(f"{head}.base.{leaf}" if head in paths else name, v)
    return saved


def _base_info(info: CheckpointInfo) -> CheckpointInfo:
    """The published folder a LoRA checkpoint's frozen base comes from (read as its own checkpoint)."""
    if not Path(info.base_from).is_dir():
        raise FileNotFoundError(f"{info.path} holds LoRA adapters without their frozen base, which comes from "
                                f"{info.base_from}: that folder is not here; put the published weights there (or "
                                f"link them) to load this checkpoint")
    base = read_checkpoint_info(info.base_from)
    if base.kind not in published_kinds():
        raise ValueError(f"{info.path}'s frozen base comes from {info.base_from}, which is not a published weights "
                         f"folder ({', '.join(published_kinds())})")
    return dataclasses.replace(base, model_config=info.model_config)


def _saved_state_dict(info: CheckpointInfo, use_ema: bool = True) -> dict[str, torch.Tensor]:
    if info.kind == "file":
        p = _prefix(info._state, use_ema)
        return {k[len(p):]: v for k, v in info._state.items() if k.startswith(p)}
    if info.kind == "safetensors":
        from safetensors.torch import load_file

        return load_file(str(info.path))
    if info.kind in published_kinds():  # a published folder: its safetensors shards, under our names
        return published_state_dict(info)
    import torch.distributed.checkpoint as dcp

    md = _dcp_metadata(info)
    p = _prefix(md, use_ema, "state_dict.")
    state = {k[len(p):]: torch.empty(m.size, dtype=m.properties.dtype) for k, m in md.items()
             if k.startswith(p) and hasattr(m, "size")}
    dcp.load({"state_dict": {p[len("state_dict."):] + k: v for k, v in state.items()}},
             storage_reader=_dcp_reader(info), no_dist=True)
    return state


# -- loading into a (possibly parallelised) network -----------------------------------------------------
def _local_piece(full: torch.Tensor, like) -> torch.Tensor:
    """The part of ``full`` that the DTensor ``like`` holds on this rank (torch.chunk semantics)."""
    from torch.distributed.tensor import Shard

    mesh, coord = like.device_mesh, like.device_mesh.get_coordinate()
    for i, placement in enumerate(like.placements):
        if isinstance(placement, Shard):
            full = full.chunk(mesh.size(i), dim=placement.dim)[coord[i]]
    return full


@torch.no_grad()
def _copy_full(dst: torch.Tensor, full: torch.Tensor, name: str) -> None:
    from torch.distributed.tensor import DTensor

    if tuple(dst.shape) != tuple(full.shape):
        raise ValueError(f"checkpoint weight {name} has shape {tuple(full.shape)} but the model expects "
                         f"{tuple(dst.shape)}; is it the same model config?")
    if isinstance(dst, DTensor):
        dst.to_local().copy_(_local_piece(full, dst))
    else:
        dst.copy_(full)


def _base_view(own: dict) -> dict:
    """A LoRA network's state dict under the plain model's names: ``p.base.weight`` as ``p.weight`` (the same
    tensors), adapters left out, and an FP8 base's ``p.base.weight_scale`` too (quantised from the weight on load)."""
    from nemo_vfm.models.common.lora import plain_param_name

    paths = {k.split(".lora_A.")[0] for k in own if ".lora_A." in k}
    return {name: v for k, v in own.items() if (name := plain_param_name(k, paths)) is not None
            and not (k.endswith(".base.weight_scale") and k.rsplit(".", 2)[0] in paths)}


def _mismatch(info: CheckpointInfo, missing, have, unexpected=()) -> ValueError:
    """The error for a checkpoint that lacks weights of the model (``have``: the checkpoint's keys)."""
    foreign = [k for k in missing if k.rpartition(".")[2] not in {h.rpartition(".")[2] for h in have}]
    why = (f"; {foreign[:3]} are of a kind no checkpoint of this model holds: this loader does not fill them (report "
           "it with the LoRA / model options used)" if foreign else "; it was written for another model config")
    return ValueError(f"{info.path} does not match this model: missing {len(missing)} weight(s), e.g. {missing[:3]}, "
                      f"unexpected {list(unexpected)[:3]}{why if missing else ''}")


def load_weights(net: torch.nn.Module, info: CheckpointInfo, use_ema: bool = True) -> None:
    """Fill ``net`` (plain or parallelised, any dtype/device) with the checkpoint's weights (strict); refuses
    weights that hold NaN or Inf. A network with LoRA adapters takes a plain checkpoint's weights as its base
    weights (adapters keep their values), and a LoRA run's weights as saved; a plain network takes a LoRA run's
    weights merged."""
    _load_weights(net, info, use_ema)
    check_finite_weights(net, info.path)


def check_finite_weights(net: torch.nn.Module, path) -> None:
    """Raise when a weight of ``net`` holds NaN/Inf (this rank's pieces; agreed over all ranks when distributed)."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    bad = [name for name, t in net.state_dict().items()
           if torch.is_tensor(t) and t.is_floating_point()
           and not bool(torch.isfinite(t.to_local() if isinstance(t, DTensor) else t).all())]
    flag = torch.tensor([float(len(bad))])
    if dist.is_initialized() and dist.get_world_size() > 1:
        dev = "cuda" if dist.get_backend() == "nccl" else "cpu"
        flag = flag.to(dev)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    if float(flag) > 0:
        where = f" (e.g. {', '.join(bad[:3])})" if bad else " (on another rank)"
        raise ValueError(f"{path} holds NaN/Inf weights{where}: it cannot generate; use an earlier checkpoint of the run")


def _load_weights(net: torch.nn.Module, info: CheckpointInfo, use_ema: bool = True) -> None:
    own = net.state_dict()
    net_lora = any(".lora_A." in k for k in own)
    if info.kind in published_kinds():  # streamed from the folder's safetensors shards, each rank its own pieces
        return load_published(net, info)
    from nemo_vfm.models.common.fp8_weights import fill_quantized_from, quantized_bases

    quantized = {}  # FP8 LoRA bases (frozen_dtype="fp8") by plain name: quantised from the checkpoint's float weights
    if net_lora and info.lora is None:  # a plain checkpoint into a LoRA network: its base weights, adapters kept
        own = _base_view(own)
        quantized = quantized_bases(net, own)
    fill = lambda k, v, full: fill_quantized_from(quantized[k], full) if k in quantized else _copy_full(v, full, k)
    raw = net_lora and info.lora is not None  # LoRA run into a LoRA network: the saved keys as they are
    if info.kind == "dcp" and (info.lora is None or raw) and not info.base_from:  # else: full tensors (below)
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp

        md = _dcp_metadata(info)
        p = _prefix(md, use_ema, "state_dict.")
        missing = sorted(k for k in own if p + k not in md)
        if missing:
            raise _mismatch(info, missing, [k.removeprefix(p) for k in md])
        dst = {k: torch.empty_like(v, dtype=md[p + k].properties.dtype) if k in quantized else v for k, v in own.items()}
        dcp.load({"state_dict": {p[len("state_dict."):] + k: v for k, v in dst.items()}},
                 storage_reader=_dcp_reader(info), no_dist=not dist.is_initialized())
        for k in (k for k in own if k in quantized):  # every rank in the same order (a row split needs a gather)
            fill(k, own[k], dst[k])
        return
    if info.kind == "safetensors":
        from safetensors import safe_open

        with safe_open(str(info.path), "pt") as f:
            missing = sorted(set(own) - set(f.keys()))
            if missing:
                raise _mismatch(info, missing, f.keys())
            for k, v in own.items():
                fill(k, v, f.get_tensor(k))
        return
    state = raw_state_dict(info, use_ema) if raw else full_state_dict(info, use_ema)
    missing, unexpected = sorted(set(own) - set(state)), sorted(set(state) - set(own))
    if missing or unexpected:
        raise _mismatch(info, missing, state, unexpected)
    for k, v in own.items():
        fill(k, v, state[k])


def load_checkpoint(path: str | Path, device: str | torch.device = "cpu", use_ema: bool = True,
                    allow_pickle: bool = False) -> LoadedModel:
    """Rebuild the network in this process from any checkpoint kind (a ``.ckpt`` file, a DCP folder, a
    safetensors export, or an experiment folder: its newest checkpoint)."""
    info = read_checkpoint_info(path, allow_pickle)
    cfg = info.model_config
    if getattr(cfg, "pretrained", None):  # the checkpoint holds every weight: do not read the base model again
        cfg = dataclasses.replace(cfg, pretrained=None)
    net = cfg.build()
    load_weights(net, info, use_ema)
    return LoadedModel(net.to(device).eval(), info.objective, info.model_config, info.generation, info.step)


def export_safetensors(path: str | Path, out_file: str | Path, use_ema: bool = True,
                       dtype: torch.dtype | None = None, allow_pickle: bool = False) -> Path:
    """Write a checkpoint's weights (EMA by default) and its config as one ``.safetensors`` file for inference."""
    import os

    from safetensors.torch import save_file

    info = read_checkpoint_info(path, allow_pickle)
    state = full_state_dict(info, use_ema)
    if dtype is not None:
        state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}
    header = json.dumps(to_header_json({"model_config": info.model_config, "objective": info.objective,
                                  "generation": dict(info.generation), "step": info.step}))
    out_file = Path(out_file)
    out_file.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_file.with_name(f".{out_file.name}.tmp{os.getpid()}")
    save_file({k: v.contiguous() for k, v in state.items()}, str(tmp), metadata={META_KEY: header})
    os.replace(tmp, out_file)
    return out_file


def load_pretrained(net: torch.nn.Module, path: str | Path) -> None:
    """Initialise a freshly built network from pretrained weights (fine-tuning; not a resume: no optimizer
    state, step 0): one of our checkpoints (``.ckpt`` file, DCP folder, experiment folder, safetensors
    export; EMA weights when present, LoRA runs merged) or a published release that the family's weights adapter
    reads (``spec.weights.load_weights(net, path)``: e.g. a Wan folder in the diffusers or original layout)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"pretrained weights not found: {path}; set init_from to a checkpoint, an experiment "
                                "folder or a published weights folder/file")
    ours = False
    if path.is_dir():
        ours = (path / ".metadata").exists() or _latest(path / "checkpoints") or _latest(path)
    elif path.suffix == ".ckpt":
        ours = True
    elif path.suffix == ".safetensors":
        from safetensors import safe_open

        with safe_open(str(path), "pt") as f:
            ours = META_KEY in (f.metadata() or {})
    if ours:
        load_weights(net, read_checkpoint_info(path))
        return
    weights = family_weights(net)
    if weights is None:
        raise ValueError(f"{path} is not a nemo_vfm checkpoint and {type(net).__name__} has no converter for published "
                         "weights (its family declares no weights adapter); pass a checkpoint written by nemo_vfm")
    weights.load_weights(net, path)


def family_weights(net_or_config):
    """The weights adapter (:class:`~nemo_vfm.models.common.weights.WeightsAdapter`) of a network's or config's
    family, or None (no published layout, or no declared family)."""
    from nemo_vfm.models.families import family_spec

    try:
        return family_spec(net_or_config).weights
    except NotImplementedError:
        return None
