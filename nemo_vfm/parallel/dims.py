"""Parallel layout: sizes of the five mesh dimensions, validated before anything is built.

The mesh is ``(pp, dp_replicate, dp_shard, cp, tp)``, outermost first, so that TP (the most
communication-hungry dimension) sits on neighbouring ranks (same node) and PP across nodes.

- ``dp_replicate`` x ``dp_shard``: data parallel. With ``fsdp=True`` parameters, gradients and
  optimizer state are sharded with FSDP2 over ``dp_shard * cp`` ranks (CP ranks hold the same
  parameters, so they share the sharding, as torchtitan does); ``dp_replicate > 1`` with it is
  HSDP. Without FSDP, gradients are all-reduced over ``dp_replicate * cp``.
- ``cp``: context parallel; every CP rank holds a slice of each sample's video tokens.
- ``tp``: tensor parallel (heads / MLP columns); ``sequence_parallel`` also splits the tokens
  between TP ranks outside attention and MLP.
- ``pp``: pipeline stages of the transformer blocks.
- ``ep``: expert parallel. Not a mesh dimension of its own: it divides ``dp_shard`` (ranks that see
  different data). Each group of ``ep`` such ranks splits every MoE layer's experts between them and
  exchanges tokens by all-to-all; the experts are sharded with FSDP2 over the remaining
  ``dp_shard / ep * cp`` ranks (``nemo_vfm.parallel.expert_parallel``).

Validation happens in two steps, both before any model is built: ``__post_init__`` checks the
layout against itself and the world size; :meth:`ParallelDims.check_model` checks it against
the model's heads, layers and tokens. Errors name the numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

CP_KINDS = ("ring", "a2a")
PP_SCHEDULES = ("1f1b", "interleaved", "gpipe")
MESH_DIMS = ("pp", "dp_replicate", "dp_shard", "cp", "tp")


@dataclass(kw_only=True)
class ParallelDims:
    """Sizes of the parallel dimensions; ``dp_shard=-1`` takes whatever the others leave."""

    world_size: int
    dp_replicate: int = 1
    dp_shard: int = -1
    cp: int = 1
    tp: int = 1
    pp: int = 1
    sequence_parallel: bool = False
    cp_kind: str = "ring"
    pp_schedule: str = "1f1b"
    pp_microbatches: int | None = None
    pp_virtual_stages: int = 1
    fsdp: bool | None = None
    ep: int = 1

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {self.world_size}.")
        for name in ("dp_replicate", "cp", "tp", "pp", "pp_virtual_stages", "ep"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}.")
        if self.dp_shard == 0 or self.dp_shard < -1:
            raise ValueError(f"dp_shard must be -1 (use the remaining ranks) or >= 1, got {self.dp_shard}.")
        if self.cp_kind not in CP_KINDS:
            raise ValueError(f"cp_kind must be one of {CP_KINDS}, got {self.cp_kind!r}.")
        if self.pp_schedule not in PP_SCHEDULES:
            raise ValueError(f"pp_schedule must be one of {PP_SCHEDULES}, got {self.pp_schedule!r}.")
        fixed = self.dp_replicate * self.cp * self.tp * self.pp
        if self.dp_shard == -1:
            if self.world_size % fixed:
                raise ValueError(
                    f"world size {self.world_size} is not divisible by dp_replicate*cp*tp*pp = "
                    f"{self.dp_replicate}*{self.cp}*{self.tp}*{self.pp} = {fixed}; change the layout "
                    f"or the number of processes."
                )
            self.dp_shard = self.world_size // fixed
        product = fixed * self.dp_shard
        if product != self.world_size:
            raise ValueError(
                f"layout pp*dp_replicate*dp_shard*cp*tp = {self.pp}*{self.dp_replicate}*{self.dp_shard}*"
                f"{self.cp}*{self.tp} = {product} does not match world size {self.world_size}; make them equal."
            )
        if self.fsdp is None:
            self.fsdp = self.dp_shard > 1
        elif self.dp_shard * self.cp == 1 and self.dp_replicate == 1:
            # one rank per FSDP group and no replicas (one process, or TP/PP over all of them): nothing to shard
            # over. FSDP2 skips its collectives there but still copies each gradient in (fp32) and runs per-block
            # hooks. Without it the compute dtype is autocast's (the precision setting), not param_dtype's.
            # With replicas (dp_replicate > 1) it stays: HSDP then reduces the gradients across them.
            self.fsdp = False
        if self.dp_shard > 1 and not self.fsdp:
            raise ValueError(
                f"dp_shard={self.dp_shard} shards parameters, which needs fsdp=True; set fsdp=True or "
                f"use dp_replicate={self.dp_replicate * self.dp_shard} for plain data parallel."
            )
        if self.ep > 1 and self.dp_shard % self.ep:
            raise ValueError(f"expert parallel size ep={self.ep} must divide the data-parallel shard size dp_shard="
                             f"{self.dp_shard} (world {self.world_size} / (dp_replicate*cp*tp*pp)); change ep or the "
                             f"number of processes.")
        if self.ep > 1 and self.dp_replicate > 1:
            raise NotImplementedError("expert parallelism with data_parallel_replicate_size > 1 (HSDP) is not "
                                      "supported; use dp_replicate=1 (FSDP over the remaining ranks).")
        if self.sequence_parallel and self.tp == 1:
            raise ValueError("sequence_parallel=True needs tp > 1 (tensor_model_parallel_size); set tp or turn it off.")
        if self.pp_schedule == "interleaved" and self.pp > 1 and self.pp_virtual_stages < 2:
            self.pp_virtual_stages = 2
        if self.pp_microbatches is not None and self.pp_microbatches < 1:
            raise ValueError(f"pp_microbatches must be >= 1, got {self.pp_microbatches}.")

    # ----------------------------------------------------------------------------------------------
    @property
    def dp(self) -> int:
        """Number of distinct data streams (dp_replicate * dp_shard)."""
        return self.dp_replicate * self.dp_shard

    @property
    def fsdp_size(self) -> int:
        """Ranks one parameter is sharded over with FSDP (dp_shard * cp), 1 when FSDP is off."""
        return self.dp_shard * self.cp if self.fsdp else 1

    @property
    def num_stages(self) -> int:
        """Pipeline stages in total (pp * virtual stages per rank)."""
        return self.pp * (self.pp_virtual_stages if self.pp > 1 else 1)

    def check_model(
        self,
        *,
        num_heads: int,
        num_layers: int,
        num_tokens: int | None = None,
        pad_tokens: bool = False,
    ) -> None:
        """Raise ``ValueError`` if the model does not divide along this layout (call before building it).

        ``num_tokens``: video tokens per sample (t*h*w after patchify); with ``pad_tokens`` the
        caller pads to a multiple of the split instead of failing.
        """
        if num_heads % self.tp:
            raise ValueError(
                f"num_heads={num_heads} is not divisible by tensor parallel size tp={self.tp}; "
                f"pick tp among the divisors of {num_heads}."
            )
        if self.cp > 1 and self.cp_kind == "a2a" and (num_heads // self.tp) % self.cp:
            raise ValueError(
                f"all-to-all context parallel needs heads per TP rank ({num_heads}/{self.tp} = "
                f"{num_heads // self.tp}) divisible by cp={self.cp}; use cp_kind='ring' or change cp."
            )
        if num_layers % self.num_stages:
            raise ValueError(
                f"num_layers={num_layers} is not divisible by {self.num_stages} pipeline stages "
                f"(pp={self.pp} x virtual={self.pp_virtual_stages if self.pp > 1 else 1}); change pp or the model depth."
            )
        split = self.token_split
        if num_tokens is not None and split > 1 and num_tokens % split and not pad_tokens:
            raise ValueError(
                f"{num_tokens} video tokens per sample are not divisible by cp*tp(sp) = {split}; "
                f"pad the sequence to {math.ceil(num_tokens / split) * split} tokens or change cp/tp."
            )

    @property
    def token_split(self) -> int:
        """How many pieces each sample's token sequence is cut into (cp, times tp under SP)."""
        return self.cp * (self.tp if self.sequence_parallel else 1)

    def ep_mesh_shape(self) -> tuple[int, ...]:
        """Shape of the expert mesh ``(pp, dp_shard / ep, cp, ep, tp)`` (same ranks as the main mesh)."""
        return (self.pp, self.dp_shard // self.ep, self.cp, self.ep, self.tp)

    def mesh_shape(self) -> tuple[int, ...]:
        return (self.pp, self.dp_replicate, self.dp_shard, self.cp, self.tp)

    def describe(self) -> str:
        parts = [f"{n}={s}" for n, s in zip(MESH_DIMS, self.mesh_shape()) if s > 1]
        if self.ep > 1:
            parts.append(f"ep={self.ep}")
        if self.sequence_parallel:
            parts.append("sp")
        if self.cp > 1:
            parts.append(f"cp_kind={self.cp_kind}")
        if self.pp > 1:
            parts.append(f"schedule={self.pp_schedule}")
        return ", ".join(parts) or "single process"
