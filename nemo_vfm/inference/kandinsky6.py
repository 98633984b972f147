"""Sampling from published Kandinsky 6 folders with ``vfm generate --ckpt KANDINSKY6_FOLDER`` (text or image to
video, with sound when the folder has an audio VAE and a vocoder).

A *Kandinsky 6 folder* is a diffusers ``Kandinsky6TI2VAPipeline`` folder (``transformer/``, ``vae/``
(HunyuanVideo's VAE), ``text_encoder/`` + ``tokenizer/`` (Qwen2.5-VL), ``text_encoder_2/`` + ``tokenizer_2/`` (CLIP),
``scheduler/``, and optionally ``audio_vae/`` (``MMAudioVAE``) + ``vocoder/`` (``MMAudioVocoder``)), or a transformer
folder alone (which trains and exports, but has nothing to generate with). A training run samples the same way: its
transformer from the run, everything else from the pipeline folder of its ``model.pretrained``
(:func:`kandinsky6_run_info`). :func:`kandinsky6_checkpoint_info`
describes it like a training checkpoint; ``vfm generate`` then does what the pipeline's ``__call__`` does at its
defaults: ``sample_audio=True`` when the folder has ``audio_vae/`` and ``vocoder/`` (:func:`generate_kandinsky6_av`),
else, or with ``--no-audio``, ``sample_audio=False`` (:func:`generate_kandinsky6`, saying so once when the folder has
no audio parts):

1. text: the Qwen2.5-VL last hidden states of the prompt in the release's template (``qwen2_5_vl`` with
   ``template="kandinsky6"``: 129 template tokens cropped, 1024 prompt tokens) and CLIP's pooled output
   (:class:`~nemo_vfm.tokenizers.clip_pooled.ClipPooledEncoder`); the negative prompt is the pipeline's default;
2. denoise: Euler on the grid of the folder's ``FlowMatchEulerDiscreteScheduler`` (its ``shift``; ``FlowMatching``
   with ``euler_grid="diffusers"``; ``--steps`` default 50, the pipeline's), guidance ``u + g (c - u)`` (the
   pipeline's ``guidance_scale``, default 5).
   Video only: the transformer runs its video path, from ``--seed``'s noise ``(N, C, t, h, w)``. With sound: video
   and audio latents together, the same timestep, the same guidance scale and the same Euler steps for both
   streams; the noise comes from one CPU generator seeded with ``--seed`` in the pipeline's order and layout
   (:func:`initial_noise`: the video's ``(N, t, h, w, C)``, then the audio's ``(N, La, Ca)``), with ``La`` from the
   duration as the pipeline computes it (:func:`audio_length`);
3. decode: the folder's VAE (tokenizer ``hunyuan``: ``vae.decode(z / scaling_factor)``); the audio through
   ``audio_vae.decode(z / scaling_factor)`` and the vocoder (:class:`Kandinsky6Audio`): a mono waveform at the audio
   VAE's sample rate, muxed into the mp4 and written as a wav.

Image to video (``--image FIRST_FRAME``, with or without sound): the image resized (cover) and center-cropped to the
size asked, its VAE latent appended by the network as the clean tail frame (token type 1, temporal position 0), as
the pipeline does; the latent is the VAE posterior's mode (the pipeline draws a sample from its generator). With
sound the generator first skips the draw the pipeline spends on that sample, so the video and audio noise are the
pipeline's.

Under torchrun with ``--cp N`` every rank runs the same loop on the same noise while the network splits the video
tokens over the CP ranks (the family's CP plan: the audio stream and the text are replicated on every rank); rank 0
encodes the text and decodes the sound.

Not built (they raise saying so, before the weights load): sound with ``--cfg-parallel`` or ``--tp`` (pass
``--no-audio``), sound with a sampler other than ``flow-euler``, a folder with only one of ``audio_vae/`` and
``vocoder/``; also refused: distilled folders (``PiflowScheduler``) and schedulers with dynamic shifting or other
sigma schedules.

Legend: N prompts, L text tokens (1024), C latent channels, (t, h, w) latent size, La audio latent frames, Ca audio
latent channels.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from nemo_vfm.inference.generation import FamilyGeneration, timed_generation

KANDINSKY6_FPS = 24.0  # the pipeline's frame_rate default
FRAMES, HEIGHT, WIDTH, GUIDANCE, STEPS = 121, 512, 768, 5.0, 50  # the pipeline's defaults
# diffusers' Kandinsky6TI2VAPipeline._DEFAULT_NEGATIVE_PROMPT
NEGATIVE_PROMPT = ("Static, 2D cartoon, cartoon, 2d animation, paintings, images, "
                   "worst quality, low quality, ugly, deformed, walking backwards")
_PARTS = ("vae", "text_encoder", "tokenizer", "text_encoder_2", "tokenizer_2")
AUDIO_PARTS = ("audio_vae", "vocoder")


def _json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def _scheduler_shift(root: Path) -> float:
    """The folder's ``FlowMatchEulerDiscreteScheduler`` shift (1.0 without a scheduler); anything this sampler does
    not reproduce raises."""
    sched = _json(root / "scheduler" / "scheduler_config.json")
    if not sched:
        return 1.0
    name = sched.get("_class_name", "FlowMatchEulerDiscreteScheduler")
    if name != "FlowMatchEulerDiscreteScheduler":
        raise NotImplementedError(f"{root}/scheduler is a {name} (a distilled Kandinsky 6 folder?); `vfm generate` "
                                  "samples Kandinsky 6 with FlowMatchEulerDiscreteScheduler only: use diffusers' "
                                  "Kandinsky6TI2VAPipeline for this folder, or fine-tune from it with model.pretrained")
    odd = [k for k in ("use_dynamic_shifting", "shift_terminal", "use_karras_sigmas", "use_exponential_sigmas",
                       "use_beta_sigmas", "invert_sigmas", "stochastic_sampling") if sched.get(k)]
    if odd or sched.get("num_train_timesteps", 1000) != 1000:
        raise NotImplementedError(f"{root}/scheduler sets {odd or 'num_train_timesteps'}, which Kandinsky 6 sampling "
                                  "here does not reproduce; use diffusers' Kandinsky6TI2VAPipeline")
    return float(sched.get("shift", 1.0))


def kandinsky6_checkpoint_info(path: str | Path):
    """A :class:`~nemo_vfm.inference.checkpoint_info.CheckpointInfo` (kind ``"kandinsky6"``) for a Kandinsky 6
    folder: its config, the flow-matching objective with the scheduler's Euler grid and shift, and (for a pipeline
    folder) the encoders and default sizes ``vfm generate`` uses."""
    from nemo_vfm.inference.checkpoint_info import CheckpointInfo
    from nemo_vfm.models.kandinsky6.convert import read_config
    from nemo_vfm.models.kandinsky6.flavors import kandinsky6_objective

    root = Path(path)
    cfg = read_config(root, pretrained=str(root))
    objective = kandinsky6_objective("lite_3b", shift=_scheduler_shift(root), euler_grid="diffusers")
    gen = {}
    if all((root / d).is_dir() for d in _PARTS):
        vae = _json(root / "vae" / "config.json")
        tc, sc = vae.get("temporal_compression_ratio", 4), vae.get("spatial_compression_ratio", 8)
        gen = {"fps": KANDINSKY6_FPS, "sampler": "flow-euler", "guidance": GUIDANCE,
               "tokenizer": {"name": "hunyuan", "kwargs": {"path": str(root)}},
               "text_encoder": {"name": "qwen2_5_vl", "kwargs": {"path": str(root), "template": "kandinsky6"}},
               "clip_encoder": {"path": str(root)},
               "latent_shape": [cfg.out_channels, 1 + (FRAMES - 1) // tc, HEIGHT // sc, WIDTH // sc]}
    return CheckpointInfo(root, "kandinsky6", cfg, objective, gen, 0)


def clip_encoder(info, device: str = "cpu"):
    """The folder's CLIP text encoder (pooled output; build it on rank 0 only, as the text encoder)."""
    from nemo_vfm.tokenizers.clip_pooled import ClipPooledEncoder

    if "clip_encoder" not in info.generation:
        raise ValueError(f"{info.path} does not record a CLIP text encoder (Kandinsky 6 pipeline folders do, and runs "
                         "read with kandinsky6_run_info); read a run with kandinsky6_run_info(info) first")
    return ClipPooledEncoder(info.generation["clip_encoder"]["path"], device=device)


def encode_prompts(engine, clip, prompts: list[str], guided: bool = True) -> tuple[dict, dict | None]:
    """``(cond, uncond)`` network inputs: ``context (N, L, 3584)``, ``context_mask (N, L)``, ``pooled_context
    (N, 768)``; ``uncond`` (the pipeline's default negative prompt) only when ``guided``. Rank 0 encodes."""
    from nemo_vfm.inference.hunyuan import _broadcast

    n = len(prompts)
    texts = list(prompts) + ([NEGATIVE_PROMPT] * n if guided else [])
    tensors = None
    if engine.rank == 0:
        if engine.text_encoder is None or clip is None:
            raise ValueError("Kandinsky 6 generation needs the Qwen2.5-VL and CLIP text encoders on rank 0; pass "
                             "text_encoder= to the engine and clip=clip_encoder(info)")
        emb, mask = engine.text_encoder.encode(texts)
        tensors = {"context": emb.float(), "context_mask": mask.bool(), "pooled_context": clip.encode(texts).float()}
    tensors = _broadcast(engine, tensors)
    cond = {k: v[:n] for k, v in tensors.items()}
    return cond, ({k: v[n:] for k, v in tensors.items()} if guided else None)


@torch.no_grad()
def image_latents(tokenizer, image: str | Path, height: int, width: int, device=None) -> torch.Tensor:
    """``(1, C, h, w)`` normalized VAE latents of ``image`` resized (cover) and center-cropped to ``height x width``,
    as the pipeline's ``encode_image`` (which draws a posterior sample; this takes its mode, as ``vfm prepare``)."""
    from diffusers.video_processor import VideoProcessor
    from PIL import Image

    if not Path(image).is_file():
        raise FileNotFoundError(f"image not found: {image}")
    proc = VideoProcessor(vae_scale_factor=tokenizer.spatial_compression)
    pixels = proc.preprocess(Image.open(image).convert("RGB"), height=height, width=width, resize_mode="crop")
    return tokenizer.encode(pixels[:, :, None].to(device or "cpu")).float()[:, :, 0]


@torch.no_grad()
def generate_kandinsky6(engine, prompts: list[str], latent_shape, sampling, clip, extra: dict | None = None,
                        progress: bool = False, decode: bool = True) -> tuple[torch.Tensor | None, dict]:
    """Prompts -> videos ``(N, 3, T, H, W)`` in [-1, 1] on rank 0 (``None`` elsewhere; ``decode=False``: the latents
    ``(N, C, t, h, w)``) and per-stage seconds. ``latent_shape`` is ``(C, t, h, w)``; ``clip`` the
    :func:`clip_encoder` (rank 0); ``extra``: ``{"image_latents": (1, C, h, w)}`` for image-to-video (the network
    appends it as the clean tail frame), given to every prompt and both CFG passes."""

    encode = lambda: encode_prompts(engine, clip, prompts, guided=sampling.guidance != 1.0)  # noqa: E731
    return timed_generation(engine, encode, len(prompts), latent_shape, sampling, extra, progress, decode)


@dataclass
class Kandinsky6Audio:
    """The folder's audio decoder: its ``MMAudioVAE`` and ``MMAudioVocoder``."""

    vae: torch.nn.Module
    vocoder: torch.nn.Module

    @classmethod
    def load(cls, root: str | Path, device="cpu", dtype=torch.float32) -> Kandinsky6Audio:
        from diffusers import MMAudioVAE, MMAudioVocoder

        root = Path(root)
        vae = MMAudioVAE.from_pretrained(str(root / "audio_vae"), local_files_only=True, torch_dtype=dtype)
        vocoder = MMAudioVocoder.from_pretrained(str(root / "vocoder"), local_files_only=True, torch_dtype=dtype)
        return cls(vae.to(device).eval(), vocoder.to(device).eval())

    @property
    def sample_rate(self) -> int:
        return int(self.vae.config.sample_rate)

    @torch.no_grad()
    def decode(self, a: torch.Tensor) -> torch.Tensor:
        """Latents ``(N, La, Ca)`` (the network's layout, scaled) -> waveforms ``(N, 1, samples)`` in [-1, 1]."""
        p = next(self.vae.parameters())
        mel = self.vae.decode(a.permute(0, 2, 1).to(p.device, p.dtype) / self.vae.config.scaling_factor,
                              return_dict=False)[0]
        return self.vocoder(mel.to(next(self.vocoder.parameters()).dtype), return_dict=False)[0].float()


def audio_parts(root: str | Path) -> list[str]:
    """Which of ``audio_vae/`` and ``vocoder/`` the folder has."""
    return [d for d in AUDIO_PARTS if (Path(root) / d).is_dir()]


def audio_length(root: str | Path, latent_frames: int, temporal_compression: int, fps: float = KANDINSKY6_FPS) -> int:
    """``La``, the audio latent frames of a ``latent_frames``-long video, as the pipeline computes it: the pixel
    frames' duration at ``fps`` times the audio VAE's sample rate over its latent hop (``MMAudioVAE.latent_hop_length``:
    twice the mel hop)."""
    c = _json(Path(root) / "audio_vae" / "config.json")
    hop = c.get("hop_length", 512) * 2
    return math.ceil(((latent_frames - 1) * temporal_compression + 1) / fps * c.get("sample_rate", 44_100) / hop)


def initial_noise(n: int, latent_shape, audio_shape, seed: int, skip=None) -> tuple[torch.Tensor, torch.Tensor]:
    """The pipeline's noise from one CPU generator seeded ``seed``: ``skip`` (a shape: the image's posterior sample,
    which the pipeline draws first) is drawn and dropped, then the video's ``(N, t, h, w, C)`` (returned as
    ``(N, C, t, h, w)``), then the audio's ``(N, La, Ca)``; float32."""
    g = torch.Generator().manual_seed(seed)
    if skip is not None:
        torch.randn(tuple(skip), generator=g)
    c, t, h, w = latent_shape
    x = torch.randn((n, t, h, w, c), generator=g).permute(0, 4, 1, 2, 3).contiguous()
    return x, torch.randn((n, *audio_shape), generator=g)


@torch.no_grad()
def denoise_av(net, cond: dict, uncond: dict | None, x: torch.Tensor, a: torch.Tensor, times: torch.Tensor,
               guidance: float, dtype=None, progress: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Euler on ``times`` from the noise ``x (N, C, t, h, w)``, ``a (N, La, Ca)``: both streams at the same time,
    each guided ``u + g (c - u)`` (``uncond`` given: the conditional and unconditional passes in one batch) ->
    the final latents (float32)."""
    from tqdm.auto import tqdm

    from nemo_vfm.diffusion.conditioning import concat_conditions

    dtype = dtype or next(net.parameters()).dtype
    n = x.shape[0]
    cond = concat_conditions(cond, uncond) if uncond is not None else cond
    cond = {k: (v.to(dtype) if k == "context" else v) for k, v in cond.items()}  # cast once, as sample_latents
    k = 2 if uncond is not None else 1
    times = times.to(x.device)
    for i in tqdm(range(len(times) - 1), desc="denoising", disable=not progress, leave=False):
        t = times[i]
        v, va = net(torch.cat([x] * k).to(dtype), t.expand(k * n).float(), audio=torch.cat([a] * k).to(dtype), **cond)
        v, va = v.float(), va.float()
        if uncond is not None:
            (vc, vu), (vac, vau) = v.split(n), va.split(n)
            v, va = vu + guidance * (vc - vu), vau + guidance * (vac - vau)
        dt = times[i + 1] - t
        x, a = x + dt * v, a + dt * va
    return x, a


@torch.no_grad()
def generate_kandinsky6_av(engine, audio: Kandinsky6Audio | None, prompts: list[str], latent_shape, audio_len: int,
                           sampling, clip, extra: dict | None = None, progress: bool = False, decode: bool = True,
                           skip=None) -> tuple[dict, dict]:
    """Prompts -> ``{"videos": (N, 3, T, H, W) in [-1, 1], "waveforms": (N, 1, samples)}`` on rank 0 (``None``
    elsewhere; ``decode=False``: ``{"latents": (N, C, t, h, w), "audio_latents": (N, La, Ca)}``) and seconds per
    stage: the pipeline's ``sample_audio=True`` loop. ``latent_shape`` is ``(C, t, h, w)``, ``audio_len`` ``La``
    (:func:`audio_length`); ``sampling``: its ``num_steps``, ``guidance`` and ``seed``; ``audio`` decodes (rank 0);
    ``extra``: ``{"image_latents": (1, C, h, w)}`` for image to video, with ``skip`` the shape of the pipeline's
    posterior draw (:func:`initial_noise`)."""
    import time

    from nemo_vfm.inference.text_cache import clear_text_cache

    def now():
        engine._sync()
        return time.perf_counter()

    net, n = engine.net, len(prompts)
    guided = sampling.guidance > 1.0  # the pipeline's do_classifier_free_guidance
    t0 = now()
    cond, uncond = encode_prompts(engine, clip, prompts, guided=guided)
    if extra:
        extra = {k: v.to(engine.device).expand(n, *v.shape[1:]) for k, v in extra.items()}
        cond, uncond = {**cond, **extra}, (None if uncond is None else {**uncond, **extra})
    t1 = now()
    x, a = (z.to(engine.device) for z in initial_noise(n, latent_shape, (audio_len, net.cfg.audio_channels),
                                                       sampling.seed, skip))
    try:
        x, a = denoise_av(net, cond, uncond, x, a, engine.objective.euler_times(sampling.num_steps), sampling.guidance,
                          engine.dtype, progress and engine.rank == 0)
    finally:
        clear_text_cache(net)
    t2 = now()
    times = {"text_encode_s": t1 - t0, "denoise_s": t2 - t1}
    if not decode:
        return {"latents": x, "audio_latents": a}, times
    out = {"videos": engine.decode(x), "waveforms": audio.decode(a).cpu() if engine.rank == 0 else None}
    times["decode_s"] = now() - t2
    return out, times


def _check_run(info, args, layout) -> None:
    """Refuse, before the weights load, sound where it is not built; ``--no-audio`` (or no audio parts): video
    only."""
    parts = audio_parts(info.parts)
    if getattr(args, "no_audio", False) or not parts:
        return
    if len(parts) == 1:
        missing = next(d for d in AUDIO_PARTS if d not in parts)
        raise ValueError(f"{info.parts} has {parts[0]}/ but no {missing}/: Kandinsky 6 sound needs both; copy the "
                         f"pipeline's {missing}/ beside it, or pass --no-audio for video only")
    if layout.cfg_parallel or layout.tp > 1:
        raise NotImplementedError("Kandinsky 6 sound is not built with --cfg-parallel or --tp (--cp N is: the audio "
                                  "stream is replicated on every rank); drop them, or pass --no-audio for video only")
    if args.sampler not in (None, "flow-euler"):
        raise ValueError(f"--sampler {args.sampler}: Kandinsky 6 with sound samples with its pipeline's Euler steps "
                         "(flow-euler); drop --sampler, or pass --no-audio")


def _sampler(ctx):
    """The CLIP encoder beside the Qwen2.5-VL text encoder (rank 0); with sound (the folder's audio parts, no
    ``--no-audio``) the audio VAE and vocoder too: ``sample(prompts) -> (videos, seconds, (waveforms, rate))``."""
    root = ctx.info.parts  # the pipeline folder (a training run: its model.pretrained's)
    clip = clip_encoder(ctx.info, ctx.args.text_encoder_device or ctx.device) if ctx.rank == 0 else None
    shape = (ctx.channels, *ctx.thw)
    extra = skip = None
    if ctx.args.image:
        extra = {"image_latents": image_latents(ctx.engine.tokenizer, ctx.args.image, ctx.height, ctx.width,
                                                ctx.device)}
        skip = (1, ctx.channels, 1, *ctx.thw[1:])  # the pipeline's posterior sample of the image's latent
    sound = not getattr(ctx.args, "no_audio", False) and len(audio_parts(root)) == len(AUDIO_PARTS)
    if not sound:
        if ctx.rank == 0 and not getattr(ctx.args, "no_audio", False):
            print(f"{root} has no audio_vae/ and vocoder/: generating video only (the pipeline's sample_audio=False)")

        def sample(batch: list[str]):
            return generate_kandinsky6(ctx.engine, batch, shape, ctx.sampling, clip, extra, progress=True)

        return sample
    fps = ctx.info.generation.get("fps") or KANDINSKY6_FPS
    length = audio_length(root, ctx.thw[0], ctx.engine.tokenizer.temporal_compression, fps)
    audio = Kandinsky6Audio.load(root, ctx.device) if ctx.rank == 0 else None

    def sample_av(batch: list[str]):
        out, times = generate_kandinsky6_av(ctx.engine, audio, batch, shape, length, ctx.sampling, clip, extra,
                                            progress=True, skip=skip)
        return out["videos"], times, (out["waveforms"], audio.sample_rate if audio is not None else None)

    return sample_av


def _takes_image(info) -> str:
    """``"optional"`` for a network with image conditioning (``visual_cond`` and two token types), else ``"none"``."""
    cfg = info.model_config
    return "optional" if cfg.visual_cond and cfg.num_token_types >= 2 else "none"


def kandinsky6_run_info(info):
    """A training run (``lora_kandinsky6_3b``, ``finetune_kandinsky6_3b``) read for sampling: its transformer (the
    run's weights: EMA when it has them, LoRA merged) with everything else from the Kandinsky6TI2VAPipeline folder of
    its ``model.pretrained``: Qwen2.5-VL and CLIP text encoders, VAE, the scheduler's Euler grid and shift, and sound
    when that folder has ``audio_vae/`` and ``vocoder/``. Raises before the weights load when that folder is missing
    or lacks a part, or when the run's latent channels differ from the folder's."""
    import dataclasses

    from nemo_vfm.inference.generation import check_run_matches, run_pipeline

    root = run_pipeline(info, _PARTS, "Kandinsky6TI2VAPipeline")
    folder = kandinsky6_checkpoint_info(root)
    check_run_matches(info, folder, ("in_channels", "out_channels", "audio_channels", "context_dim", "pooled_dim"), root)
    return dataclasses.replace(info, objective=folder.objective, generation=folder.generation, pipeline=root)


GENERATION = FamilyGeneration(family="kandinsky6", kind="kandinsky6", published_info=kandinsky6_checkpoint_info,
                              image=_takes_image, sampler=_sampler, check_run=_check_run, run_info=kandinsky6_run_info,
                              sampling_defaults={"default_steps": STEPS, "default_guidance": GUIDANCE})
