"""Writing a state dict as a diffusers-style weights folder: one ``diffusion_pytorch_model.safetensors``, or
numbered shards of at most ``max_shard_bytes`` with a ``.safetensors.index.json`` weight map."""

from __future__ import annotations

import json
from pathlib import Path

import torch


def save_sharded(state: dict[str, torch.Tensor], folder: Path, max_shard_bytes: int,
                 base: str = "diffusion_pytorch_model") -> Path:
    """Write ``state`` into ``folder`` (which must exist) as one file or shards; returns ``folder``."""
    from safetensors.torch import save_file

    shards, cur, size = [], {}, 0
    for k, v in state.items():
        n = v.numel() * v.element_size()
        if cur and size + n > max_shard_bytes:
            shards.append(cur)
            cur, size = {}, 0
        cur[k] = v.detach().contiguous().cpu()
        size += n
    shards.append(cur)
    if len(shards) == 1:
        save_file(shards[0], str(folder / f"{base}.safetensors"), metadata={"format": "pt"})
        return folder
    weight_map, total = {}, 0
    for i, sh in enumerate(shards):
        name = f"{base}-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(sh, str(folder / name), metadata={"format": "pt"})
        weight_map.update({k: name for k in sh})
        total += sum(v.numel() * v.element_size() for v in sh.values())
    (folder / f"{base}.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    return folder
