"""How generation is spread over processes: context parallel (CP), CFG-parallel and tensor parallel (TP).

    world = cfg_groups x cp x tp        cfg_groups = 2 with --cfg-parallel, else 1

- **CP**: every denoising step, each of the ``cp`` ranks holds a contiguous slice of the video tokens
  (after the patch embedding) and self-attention runs as ring or all-to-all attention over the group;
  the final layer's tokens are gathered, so every rank sees the full prediction and steps the sampler
  on identical numbers.
- **CFG-parallel**: the conditional and the unconditional network passes run on two rank groups at
  once (each a full CP x TP layout); one all-gather per network call combines them.
- **TP** (+ sequence parallel): heads and MLP columns split, for models that do not fit one GPU.

The layout maps onto the training mesh ``(pp, dp_replicate, dp_shard, cp, tp)`` with the CFG groups
on ``dp_replicate`` (they hold the same weights and see different conditions, like data parallel).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

CP_KINDS = ("auto", "ring", "a2a")


@dataclass(kw_only=True)
class InferenceLayout:
    """Sizes of the generation layout. ``cp_kind="auto"`` picks all-to-all when the heads per TP rank
    divide by ``cp`` (fewer bytes moved than the ring, and the single-GPU attention kernel), else ring."""

    cp: int = 1
    tp: int = 1
    cfg_parallel: bool = False
    cp_kind: str = "auto"
    attention_backend: str = "auto"  # ring attention's block kernel: auto | flash | cudnn | math

    def __post_init__(self):
        for name in ("cp", "tp"):
            if getattr(self, name) < 1:
                raise ValueError(f"InferenceLayout.{name} must be >= 1, got {getattr(self, name)}")
        if self.cp_kind not in CP_KINDS:
            raise ValueError(f"InferenceLayout.cp_kind must be one of {CP_KINDS}, got {self.cp_kind!r}")

    @property
    def cfg_groups(self) -> int:
        return 2 if self.cfg_parallel else 1

    @property
    def world_size(self) -> int:
        return self.cfg_groups * self.cp * self.tp

    @property
    def token_split(self) -> int:
        """Pieces each sample's token sequence is cut into (cp, times tp: TP runs with sequence parallel)."""
        return self.cp * self.tp

    @classmethod
    def for_world(cls, world_size: int, *, cp: int | None = None, tp: int = 1, cfg_parallel: bool = False,
                  **kwargs) -> InferenceLayout:
        """The layout for ``world_size`` processes; ``cp=None`` takes all ranks left after TP and CFG."""
        groups = 2 if cfg_parallel else 1
        if cp is None:
            if world_size % (groups * tp):
                raise ValueError(f"{world_size} processes cannot be split into {groups} CFG group(s) x tp={tp}; "
                                 f"launch a multiple of {groups * tp} processes or change --tp/--cfg-parallel")
            cp = world_size // (groups * tp)
        layout = cls(cp=cp, tp=tp, cfg_parallel=cfg_parallel, **kwargs)
        if layout.world_size != world_size:
            raise ValueError(f"{world_size} processes do not match the layout {layout.describe()} "
                             f"({layout.world_size} processes); launch {layout.world_size} processes "
                             f"(torchrun --nproc-per-node {layout.world_size}) or change --cp/--tp/--cfg-parallel")
        return layout

    def resolved_cp_kind(self, num_heads: int) -> str:
        if self.cp_kind != "auto":
            return self.cp_kind
        return "a2a" if self.cp > 1 and (num_heads // self.tp) % self.cp == 0 else "ring"

    def dims(self, num_heads: int):
        """The :class:`~nemo_vfm.parallel.dims.ParallelDims` of this layout (no FSDP, no PP)."""
        from nemo_vfm.parallel.dims import ParallelDims

        return ParallelDims(world_size=self.world_size, dp_replicate=self.cfg_groups, dp_shard=1, cp=self.cp,
                            tp=self.tp, sequence_parallel=self.tp > 1, cp_kind=self.resolved_cp_kind(num_heads),
                            fsdp=False)

    def describe(self) -> str:
        parts = [f"cp={self.cp}"] + ([f"tp={self.tp}"] if self.tp > 1 else []) + (
            ["cfg-parallel"] if self.cfg_parallel else [])
        return ", ".join(parts)


def family_spec(model_or_config):
    """:func:`nemo_vfm.models.spec.family_spec`, for generation."""
    from nemo_vfm.models.families import family_spec as spec

    return spec(model_or_config, "generate with it in one process")


def check_model_layout(model_config, layout: InferenceLayout, latent_thw: tuple[int, int, int] | None = None,
                       ) -> None:
    """Raise ``ValueError`` (naming the numbers) when the model or the latent size does not divide along the
    layout: heads by TP (and CP for all-to-all), tokens by ``cp * tp`` where the family cannot pad them
    (ST-DiT; the DiT and MovieGen pad). Call before building anything."""
    family_spec(model_config).check_layout(model_config, layout.dims(model_config.num_heads), latent_thw)


def init_distributed(device: str | None = None) -> tuple[int, int, torch.device]:
    """Join the torchrun process group if launched by torchrun (``WORLD_SIZE`` > 1).

    Returns ``(rank, world_size, device)``: NCCL and ``cuda:LOCAL_RANK`` when CUDA is there (or
    ``device`` says so), else gloo on the CPU. A single process starts no process group.
    """
    import torch.distributed as dist

    world = int(os.environ.get("WORLD_SIZE", "1"))
    want_cuda = torch.cuda.is_available() if device is None else str(device).startswith("cuda")
    if world == 1 and not dist.is_initialized():
        dev = torch.device(device) if device is not None else torch.device("cuda" if want_cuda else "cpu")
        return 0, 1, dev
    if want_cuda:
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        dev = torch.device("cuda", local)
    else:
        dev = torch.device("cpu")
    if not dist.is_initialized():
        kwargs = {"device_id": dev} if dev.type == "cuda" else {}
        dist.init_process_group("nccl" if dev.type == "cuda" else "gloo", **kwargs)
    return dist.get_rank(), dist.get_world_size(), dev


def build_inference_mesh(layout: InferenceLayout, num_heads: int, device_type: str):
    """The :class:`~nemo_vfm.parallel.mesh.ParallelMesh` for ``layout`` (None for one process)."""
    if layout.world_size == 1:
        return None
    from nemo_vfm.parallel.mesh import build_mesh

    return build_mesh(layout.dims(num_heads), device_type)
