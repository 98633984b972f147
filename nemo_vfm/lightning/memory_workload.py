"""What the memory model of ``trainer.memory_budget_gb`` reads of a run (:mod:`nemo_vfm.lightning.memory_budget`):
parameter counts per block from the network built on the meta device, tokens and FLOPs per step."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cached_property

from nemo_vfm.models.common.memory import Clip, TokenStream


@dataclass(frozen=True)
class Params:
    """Parameter counts of one block (or of everything outside the blocks): ``trainable`` elements, and per frozen
    tensor ``(elements, output rows)``, the rows > 0 for the base weight of a LoRA-adapted linear (what fp8 stores
    in one byte, with one fp32 scale per row)."""

    trainable: int = 0
    frozen_sizes: tuple[tuple[int, int], ...] = ()

    @cached_property
    def frozen_linear(self) -> int:
        return sum(n for n, rows in self.frozen_sizes if rows)

    @cached_property
    def frozen_rows(self) -> int:
        return sum(rows for _, rows in self.frozen_sizes)

    @cached_property
    def frozen_other(self) -> int:
        return sum(n for n, rows in self.frozen_sizes if not rows)

    @property
    def total(self) -> int:
        return self.trainable + self.frozen_linear + self.frozen_other

    def frozen_bytes(self, frozen_dtype: str | None, alloc=None) -> float:
        """Bytes of the frozen weights stored as ``frozen_dtype`` (None: fp32); ``alloc``: each tensor's bytes
        through it (one allocation per weight, fp8 its row scales one more; the pinned host copies of block
        swapping)."""
        width = 2 if frozen_dtype in ("bf16", "fp16") else 4
        if alloc is not None:
            if frozen_dtype == "fp8":
                return sum(alloc(n) + alloc(4 * rows) if rows else alloc(2 * n) for n, rows in self.frozen_sizes)
            return sum(alloc(width * n) for n, _ in self.frozen_sizes)
        if frozen_dtype == "fp8":
            return self.frozen_linear + 4 * self.frozen_rows + 2 * self.frozen_other
        return width * (self.frozen_linear + self.frozen_other)


@dataclass(frozen=True, kw_only=True)
class Workload:
    """What the memory model reads of a run (per GPU and step). ``streams``: the token streams a block runs
    (:class:`~nemo_vfm.models.common.memory.TokenStream`, tokens per GPU and step: batch x tokens per sample / the
    token shards of the streams that context parallelism splits)."""

    blocks: tuple[Params, ...]
    outside: Params
    streams: tuple[TokenStream, ...]
    forward_flops: float  # per GPU and step
    attention_share: float  # attention FLOPs / forward FLOPs
    lora: bool
    model_shards: int = 1  # FSDP x TP x PP ranks the weights are split over
    compile: bool = False  # whether the blocks run compiled (activation_offload and block_swap turn that off)
    autocast: bool = True  # a *-mixed precision: fp32 frozen weights are cast to bf16 at every matmul
    ac_every: int = 2  # selective checkpointing: every n-th block
    ema: bool = False  # the module keeps an EMA copy of the network (``ema_decay``)

    def __post_init__(self):
        if not self.blocks or not self.streams or self.streams[0].tokens < 1:
            raise ValueError(f"a workload needs at least one block and one video token, got {len(self.blocks)} blocks "
                             f"and streams {self.streams}")

    @property
    def tokens(self) -> int:
        """Video tokens per GPU and step (the first stream's)."""
        return self.streams[0].tokens


def count_params(model_config, lora=None) -> tuple[tuple[Params, ...], Params]:
    """Per-block and outside-block :class:`Params` of ``model_config.build("meta")`` (with ``lora`` adapters
    applied; nothing is allocated). Every family's network keeps its transformer blocks in ``.blocks``."""
    from nemo_vfm.models.common.lora import LoRALinear, apply_lora

    net = model_config.build("meta")
    if lora is not None:
        apply_lora(net, dataclasses.replace(lora, frozen_dtype=None))  # storage dtypes are modelled, not built
    rows = {id(m.base.weight): m.base.out_features for m in net.modules() if isinstance(m, LoRALinear)}

    def tally(params) -> Params:
        params = list(params)
        return Params(sum(p.numel() for p in params if p.requires_grad),
                      tuple((p.numel(), rows.get(id(p), 0)) for p in params if not p.requires_grad))

    blocks = tuple(tally(b.parameters()) for b in net.blocks)
    inside = {id(p) for b in net.blocks for p in b.parameters()}
    return blocks, tally(p for p in net.parameters() if id(p) not in inside)


def workload(model_config, data, lora=None, *, model_shards: int = 1, token_shards: int = 1,
             ac_every: int = 2, compile: bool = False, autocast: bool = True, ema: bool = False,
             streams: tuple[str, ...] = ("video",), token_timesteps: bool = False) -> Workload:
    """The :class:`Workload` of ``model_config`` on ``data`` (its ``latent_shape``, ``batch_size`` and
    ``max_seq_length``; ``audio_shape`` / ``reference_shape`` where it has them) for an objective that trains
    ``streams`` (``("video", "audio")``: a joint objective): the token streams and FLOPs of a sample as the family
    declares them (``FamilySpec.memory_streams``, :mod:`nemo_vfm.models.common.memory`). A family that declares
    none is refused."""
    from nemo_vfm.models.families import family_spec

    spec = family_spec(model_config, fallback="unset trainer.memory_budget_gb and set the memory knobs yourself")
    if spec.memory_streams is None:
        raise NotImplementedError(f"the {spec.name} family declares no memory_streams, so trainer.memory_budget_gb "
                                  "cannot estimate it; unset trainer.memory_budget_gb and set the memory knobs yourself")
    _, t, h, w = data.latent_shape
    grid = tuple(n // p for n, p in zip((t, h, w), model_config.patch_size))
    clip = Clip(grid=grid, text_len=getattr(model_config, "text_len", 512), streams=tuple(streams),
                token_timesteps=token_timesteps,
                audio_shape=getattr(data, "audio_shape", None), reference_shape=getattr(data, "reference_shape", None))
    per_sample, flops = spec.memory_streams(model_config, clip, spec.flops)
    if token_timesteps and not any(s.token_modulation for s in per_sample):
        raise NotImplementedError(f"the objective gives per-token times, and the {spec.name} family's memory_streams "
                                  "does not count per-token modulation; unset trainer.memory_budget_gb and set the "
                                  "memory knobs yourself")
    samples = data.batch_size * (max(1, data.max_seq_length // clip.video_tokens) if data.max_seq_length else 1)
    per_gpu = tuple(dataclasses.replace(s, tokens=max(1, samples * s.tokens // (token_shards if s.split else 1))
                                        if s.tokens else 0) for s in per_sample)
    blocks, outside = count_params(model_config, lora)
    return Workload(blocks=blocks, outside=outside, streams=per_gpu,
                    forward_flops=samples * flops.forward / token_shards, attention_share=flops.attention / flops.forward,
                    lora=lora is not None, model_shards=model_shards, ac_every=ac_every, compile=compile,
                    autocast=autocast, ema=ema)
