"""The context-parallel inference engine: one network spread over N GPUs, generating one video fast.

    engine = InferenceEngine.from_checkpoint("run/checkpoints", InferenceLayout.for_world(4))  # under torchrun
    videos, times = engine.generate(["a red fox in the snow"], latent_shape=(16, 8, 64, 64),
                                    sampling=SamplingConfig(num_steps=50, sampler="res", guidance=7))

Pipeline, per batch of prompts (``times`` records each stage in seconds):

1. **text encode**: rank 0 runs the text encoder once and broadcasts the embeddings.
2. **denoise**: every rank draws the same full-size noise from the seed and runs the same sampler loop;
   inside each network call the video tokens are split over the CP (and SP) ranks, attention runs as
   ring or all-to-all attention, and the output is gathered again; with CFG-parallel the conditional
   and unconditional passes run on two rank groups. All ranks end with the same latents.
3. **decode**: tiles (or videos) dealt to all ranks, summed on rank 0 (:mod:`nemo_vfm.inference.decode`).

Legend: N prompts, C latent channels, (t, h, w) latent size.
"""

from __future__ import annotations

import time

import torch

from nemo_vfm.inference.checkpoint_info import Generation
from nemo_vfm.inference.distributed import (
    InferenceLayout,
    build_inference_mesh,
    check_model_layout,
    family_spec,
)
from nemo_vfm.inference.text_cache import cache_text_projections, clear_text_cache

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def _dtype(d) -> torch.dtype:
    if isinstance(d, torch.dtype):
        return d
    if d not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {d!r}")
    return DTYPES[d]


def parallelize_for_inference(model: torch.nn.Module, layout: InferenceLayout, pmesh,
                              compile: bool = False) -> torch.nn.Module:
    """Apply the model family's parallel plan (TP/SP, CP; no FSDP, no checkpointing) for ``layout``;
    ``compile``: ``torch.compile`` each block (``nemo_vfm.parallel.compile``)."""
    if pmesh is None:
        if compile:
            from nemo_vfm.parallel.compile import compile_blocks

            compile_blocks(model.blocks)
        return model
    spec = family_spec(model)
    knobs = dict(attention_backend=layout.attention_backend, param_dtype=None, reduce_dtype=None, compile=compile)
    return spec.parallelize(model, pmesh, **{k: v for k, v in knobs.items() if k in spec.knobs})


def select_attention(layout: InferenceLayout, device: torch.device) -> None:
    """On CUDA, pick the SDPA kernel for ``layout.attention_backend`` (``auto``: cuDNN, as in training; measured
    fastest for long videos, ``nemo_vfm.parallel.sdpa_backend``) before anything is compiled."""
    if device.type == "cuda":
        from nemo_vfm.parallel.sdpa_backend import SDPA_BACKENDS, select_sdpa_backend

        select_sdpa_backend(layout.attention_backend if layout.attention_backend in SDPA_BACKENDS else "auto")


class InferenceEngine:
    """A network ready to sample on this process's share of an :class:`InferenceLayout`."""

    def __init__(self, net, objective, *, layout: InferenceLayout | None = None, pmesh=None, device=None,
                 dtype: torch.dtype | str | None = None, tokenizer=None, text_encoder=None,
                 generation: dict | None = None, step: int = 0):
        import torch.distributed as dist

        self.net, self.objective = net.eval(), objective
        self.layout = layout or InferenceLayout()
        self.pmesh = pmesh
        self.device = torch.device(device) if device is not None else next(net.parameters()).device
        self.dtype = None if dtype is None else _dtype(dtype)
        self.tokenizer, self.text_encoder = tokenizer, text_encoder
        self.generation = generation if isinstance(generation, Generation) else Generation.from_dict(generation)
        self.step = step
        self.distributed = dist.is_initialized() and self.layout.world_size > 1
        self.rank = dist.get_rank() if self.distributed else 0
        self.cfg_group = pmesh.group("dp") if (pmesh is not None and self.layout.cfg_parallel) else None
        self.last_latents: torch.Tensor | None = None

    # -- construction -----------------------------------------------------------------------------------
    @classmethod
    def from_model(cls, model, objective, layout: InferenceLayout | None = None, *, device=None, dtype=None,
                   cache_text_kv: bool = True, compile: bool = False, **kwargs) -> InferenceEngine:
        """Parallelise a plain network whose weights are loaded (the same on every rank) for ``layout``.

        ``cache_text_kv``: compute the text keys/values of cross-attention once per generation
        (:mod:`nemo_vfm.inference.text_cache`; exact; not combined with ``compile``, which compiles the blocks)."""
        layout = layout or InferenceLayout()
        device = torch.device(device) if device is not None else next(model.parameters()).device
        check_model_layout(model.cfg, layout)
        pmesh = build_inference_mesh(layout, model.cfg.num_heads, device.type)
        model = model.to(device)
        if dtype is not None:
            model = model.to(_dtype(dtype))
        select_attention(layout, device)
        parallelize_for_inference(model, layout, pmesh, compile)
        if cache_text_kv and not compile:
            cache_text_projections(model)
        return cls(model, objective, layout=layout, pmesh=pmesh, device=device, dtype=dtype, **kwargs)

    @classmethod
    def from_checkpoint(cls, path, layout: InferenceLayout | None = None, *, device=None, dtype="bf16",
                        use_ema: bool = True, latent_thw=None, tokenizer=None, text_encoder=None,
                        build_encoders: bool = True, cache_text_kv: bool = True,
                        compile: bool = False, text_encoder_device=None) -> InferenceEngine:
        """Build the network on the meta device, parallelise it, materialise it in ``dtype`` on ``device``
        and load the checkpoint's weights (each rank reads only its own pieces of a DCP checkpoint).

        The tokenizer and (on rank 0 only) the text encoder come from the checkpoint's generation settings
        unless given; the text encoder sits on ``text_encoder_device`` (default ``device``; bf16 on a GPU, see
        :func:`~nemo_vfm.tokenizers.registry.text_encoder_placed`). ``latent_thw`` checks the latent size
        against the layout before anything is built.
        """
        import torch.distributed as dist

        from nemo_vfm.inference.checkpoint import load_weights, read_checkpoint_info
        from nemo_vfm.inference.checkpoint_info import CheckpointInfo

        layout = layout or InferenceLayout()
        device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        info = path if isinstance(path, CheckpointInfo) else read_checkpoint_info(path)
        cfg = info.model_config
        check_model_layout(cfg, layout, latent_thw)
        pmesh = build_inference_mesh(layout, cfg.num_heads, device.type)
        model = cfg.build("meta").to(_dtype(dtype))
        select_attention(layout, device)
        parallelize_for_inference(model, layout, pmesh, compile)
        model.to_empty(device=device)
        kept = set(model.state_dict())
        if any(name not in kept for name, _ in model.named_buffers()):
            raise NotImplementedError(f"{type(model).__name__} has non-persistent buffers, which a checkpoint does "
                                      "not restore after building on the meta device; load it with load_checkpoint")
        load_weights(model, info, use_ema)
        if cache_text_kv and not compile:
            cache_text_projections(model)
        rank = dist.get_rank() if dist.is_initialized() else 0
        gen = info.generation
        if build_encoders and gen:
            from nemo_vfm.data.encoders import build_text_encoder, build_tokenizer

            if tokenizer is None:
                tokenizer = build_tokenizer(gen["tokenizer"]["name"], **gen["tokenizer"]["kwargs"])
                tokenizer = tokenizer.to(device).eval()
            if text_encoder is None and rank == 0:
                from nemo_vfm.tokenizers.registry import text_encoder_placed

                name = gen["text_encoder"]["name"]
                text_encoder = build_text_encoder(name, **text_encoder_placed(
                    name, gen["text_encoder"]["kwargs"], text_encoder_device or device))
        return cls(model, info.objective, layout=layout, pmesh=pmesh, device=device, dtype=dtype,
                   tokenizer=tokenizer, text_encoder=text_encoder, generation=gen, step=info.step)

    # -- stages -----------------------------------------------------------------------------------------
    def _sync(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def encode_text(self, prompts: list[str], fps: float | None = None) -> tuple[dict, dict]:
        """``(cond, uncond)`` on this rank's device; rank 0 encodes, the others receive a broadcast."""
        import torch.distributed as dist

        from nemo_vfm.diffusion.conditioning import null_condition

        negative = self.generation.get("negative_prompt")  # Wan: CFG against an encoded negative prompt
        if self.rank == 0:
            if self.text_encoder is None:
                raise ValueError("this engine has no text encoder; pass text_encoder= (rank 0) to encode prompts")
            emb, mask = self.text_encoder.encode(list(prompts) + ([negative] * len(prompts) if negative is not None
                                                                  else []))
            emb, mask = emb.float().to(self.device), mask.to(self.device)
        if self.distributed:
            shape = [tuple(emb.shape) if self.rank == 0 else None]
            dist.broadcast_object_list(shape, src=0)
            if self.rank != 0:
                emb = torch.empty(shape[0], device=self.device)
                mask = torch.empty(shape[0][:2], dtype=torch.bool, device=self.device)
            m8 = mask.to(torch.uint8)
            dist.broadcast(emb, src=0)
            dist.broadcast(m8, src=0)
            mask = m8.bool()
        n = len(prompts)
        cond = {"context": emb[:n], "context_mask": mask[:n]}
        if fps is not None:
            cond["fps"] = torch.full((n,), float(fps), device=self.device)
        if negative is not None:
            return cond, {**cond, "context": emb[n:], "context_mask": mask[n:]}
        return cond, null_condition(cond)

    @torch.no_grad()
    def denoise(self, cond: dict, uncond: dict | None, latent_shape, sampling, progress: bool = False) -> torch.Tensor:
        """``(N, C, t, h, w)`` float32 latents, the same on every rank. ``latent_shape`` is ``(C, t, h, w)``."""
        from nemo_vfm.inference.sampling import sample_latents

        n = next(v for v in cond.values() if torch.is_tensor(v)).shape[0]
        if self.layout.cfg_parallel and (uncond is None or sampling.guidance == 1.0):
            raise ValueError("CFG-parallel needs classifier-free guidance (guidance != 1); drop --cfg-parallel "
                             "or set --guidance")
        try:
            return sample_latents(self.net, self.objective, (n, *latent_shape), cond, uncond,
                                  guidance=sampling.guidance, num_steps=sampling.num_steps, sampler=sampling.sampler,
                                  seed=sampling.seed, device=self.device, dtype=self.dtype, cfg_group=self.cfg_group,
                                  progress=progress and self.rank == 0, levels=sampling.levels)
        finally:
            clear_text_cache(self.net)

    def decode(self, latents: torch.Tensor) -> torch.Tensor | None:
        """``(N, 3, T, H, W)`` videos in [-1, 1] on rank 0 (CPU), ``None`` elsewhere; all ranks decode."""
        from nemo_vfm.inference.decode import decode_latents

        if self.tokenizer is None:
            raise ValueError("this engine has no tokenizer; pass tokenizer= to decode latents")
        out = decode_latents(self.tokenizer, latents) if self.distributed else \
            self.tokenizer.decode(latents.float()).float().clamp(-1, 1)
        return None if out is None else out.cpu()

    def generate(self, prompts: list[str], latent_shape=None, sampling=None, fps: float | None = None,
                 progress: bool = False, decode: bool = True,
                 extra_cond: dict | None = None) -> tuple[torch.Tensor | None, dict]:
        """Prompts -> videos ``(N, 3, T, H, W)`` on rank 0 (latents ``(N, C, t, h, w)`` with ``decode=False``;
        ``None`` on other ranks when decoding) and per-stage seconds ``{text_encode_s, denoise_s, decode_s}``.
        ``extra_cond``: further network inputs for both CFG passes (Wan I2V: ``image_embeds``, ``cond_latents``),
        the same on every rank."""
        from nemo_vfm.inference.generate import SamplingConfig

        sampling = sampling or SamplingConfig()
        latent_shape = tuple(latent_shape or self.generation["latent_shape"])
        fps = fps if fps is not None else self.generation.get("fps")
        times = {}
        t0 = time.perf_counter()
        cond, uncond = self.encode_text(prompts, fps)
        if extra_cond:
            extra = {k: v.to(self.device) for k, v in extra_cond.items()}
            cond, uncond = {**cond, **extra}, {**uncond, **extra}
        self._sync()
        times["text_encode_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        latents = self.denoise(cond, uncond, latent_shape, sampling, progress)
        self._sync()
        times["denoise_s"] = time.perf_counter() - t0
        self.last_latents = latents  # (N, C, t, h, w), kept for inspection (e.g. comparing layouts)
        if not decode:
            return latents, times
        t0 = time.perf_counter()
        videos = self.decode(latents)
        self._sync()
        times["decode_s"] = time.perf_counter() - t0
        return videos, times
