"""Sampling from LTX-2 pipeline folders with ``vfm generate --ckpt LTX2_FOLDER`` (text or image to video, with sound).

An *LTX-2 folder* is a diffusers ``LTX2Pipeline`` folder: ``transformer/``, ``vae/`` (``AutoencoderKLLTX2Video``),
``audio_vae/`` (``AutoencoderKLLTX2Audio``), ``vocoder/`` (``LTX2Vocoder``), ``text_encoder/`` + ``tokenizer/``
(Gemma 3), ``connectors/`` (``LTX2TextConnectors``) and ``scheduler/``. :func:`ltx2_checkpoint_info` describes it
like a training checkpoint; :func:`generate_ltx2` then does what ``LTX2Pipeline.__call__`` does at its defaults:

1. text: Gemma 3's packed hidden states through the folder's connectors, one context per stream and a mask
   (:class:`~nemo_vfm.tokenizers.ltx2.LTX2TextEncoder`, rank 0); the negative prompt is the pipeline's
   default, the empty prompt;
2. denoise: video and audio latents together, Euler on the pipeline's sigmas (``linspace(1, 1/n, n)`` through the
   folder's ``FlowMatchEulerDiscreteScheduler`` with the dynamic shift ``mu = calculate_shift(video tokens)``),
   and its guidance, in x0 space per stream (:class:`LTX2Guidance`): CFG (video 3, audio 7), STG at blocks
   ``(28,)`` (scale 1, both streams), modality isolation (3, both) and guidance rescale 0.7;
3. decode: the video through the folder's VAE (timestep-conditioned at ``decode_timestep=0`` when its config says
   so), the audio through the audio VAE and the vocoder, a waveform at the vocoder's sample rate.

The initial noise is ``torch.randn`` on a CPU generator seeded with ``--seed``: the video's ``(N, C, t, h, w)``
first, then the audio's ``(N, Ca, La, M)`` (:func:`initial_noise`), both in the normalized latent space the
network sees (give diffusers the same noise denormalized, as ``latents=`` / ``audio_latents=``).

Image to video (``--image FIRST_FRAME``): as ``LTX2ImageToVideoPipeline``, the image (re-compressed as one H.264
frame at CRF 33, resized, encoded: :func:`image_latents`) is the clean first latent frame, seen at time 0 and kept.

Under torchrun with ``--cp N`` every rank runs the same loop on the same noise while the network splits the video
tokens over the CP ranks (the audio stream is replicated), rank 0 encodes the text and decodes.

A training run (``lora_ltx2``, ``lora_ltx2_video``, ``finetune_ltx2``) samples the same way: its transformer from the
run, everything else from the pipeline folder of its ``model.pretrained`` (:func:`ltx2_run_info`).

Deviation: STG runs only when the folder's transformer is built with ``perturbed_attn`` (LTX-2.3 folders); without
it diffusers' STG pass is the plain conditional pass (its delta is zero), so it is skipped here.
Not built (they raise saying so): ``--cfg-parallel`` (``--tp`` is refused by the family's layout
check: sequence parallelism), other samplers and schedulers, vocoders other than ``LTX2Vocoder``.

Legend: N prompts, C / Ca latent channels, (t, h, w) video latent size, La audio latent frames, M latent mel bins.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from nemo_vfm.inference.generation import FamilyGeneration

FPS, FRAMES, HEIGHT, WIDTH, STEPS = 24.0, 121, 512, 768, 30  # LTX2Pipeline's defaults
NEGATIVE_PROMPT = ""  # LTX2Pipeline's default negative prompt (None -> "")
_PARTS = ("transformer", "vae", "audio_vae", "vocoder", "text_encoder", "tokenizer", "connectors", "scheduler")


@dataclass(frozen=True, kw_only=True)
class LTX2Guidance:
    """LTX2Pipeline's guidance, per stream, at its defaults: CFG scales (> 1: on), STG scales (> 0: on) at
    ``stg_blocks``, modality-isolation scales (> 1: on), guidance rescale (> 0: on)."""

    video_cfg: float = 3.0
    audio_cfg: float = 7.0
    video_stg: float = 1.0
    audio_stg: float = 1.0
    video_modality: float = 3.0
    audio_modality: float = 3.0
    video_rescale: float = 0.7
    audio_rescale: float = 0.7
    stg_blocks: tuple[int, ...] = (28,)


@dataclass
class LTX2Audio:
    """The folder's audio decoder: its audio VAE (with the latents' statistics) and vocoder."""

    vae: torch.nn.Module
    vocoder: torch.nn.Module

    @classmethod
    def load(cls, root: str | Path, device="cpu", dtype=torch.float32) -> LTX2Audio:
        from diffusers import AutoencoderKLLTX2Audio
        from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder

        root = Path(root)
        vae = AutoencoderKLLTX2Audio.from_pretrained(str(root / "audio_vae"), local_files_only=True, torch_dtype=dtype)
        if _json(root / "vocoder" / "config.json").get("_class_name", "LTX2Vocoder") != "LTX2Vocoder":
            raise NotImplementedError(f"{root}/vocoder is not an LTX2Vocoder (LTX-2.3's vocoder with bandwidth "
                                      "extension?); vfm generate decodes LTX-2 audio with LTX2Vocoder only: use "
                                      "diffusers' LTX2Pipeline for this folder")
        vocoder = LTX2Vocoder.from_pretrained(str(root / "vocoder"), local_files_only=True, torch_dtype=dtype)
        return cls(vae.to(device).eval(), vocoder.to(device).eval())

    @property
    def sample_rate(self) -> int:
        return int(self.vocoder.config.output_sampling_rate)

    def _stats(self, z: torch.Tensor):
        ca, m = z.shape[1], z.shape[3]  # the buffers are per packed feature (Ca M)
        mean, std = (b.to(z.device, z.dtype).reshape(ca, m)[None, :, None] for b in (self.vae.latents_mean,
                                                                                    self.vae.latents_std))
        return mean, std

    @torch.no_grad()
    def decode(self, z: torch.Tensor) -> torch.Tensor:
        """Normalized latents ``(N, Ca, La, M)`` -> waveforms ``(N, channels, samples)`` in [-1, 1]."""
        mean, std = self._stats(z)
        p = next(self.vae.parameters())
        mel = self.vae.decode((z * std + mean).to(p.device, p.dtype), return_dict=False)[0]
        return self.vocoder(mel.to(next(self.vocoder.parameters()).dtype)).float()


def _json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def audio_latent_shape(root: str | Path, frames: int, fps: float) -> tuple[int, int, int]:
    """``(Ca, La, M)`` of the folder's audio latents for a ``frames``-long video at ``fps``, as the pipeline computes
    it from the duration (the audio VAE's config; it compresses time and mel bins by 4)."""
    from diffusers.models.autoencoders.autoencoder_kl_ltx2_audio import LATENT_DOWNSAMPLE_FACTOR as k

    c = _json(Path(root) / "audio_vae" / "config.json")
    per_second = c.get("sample_rate", 16000) / c.get("mel_hop_length", 160) / float(k)
    return c.get("latent_channels", 8), round(frames / fps * per_second), (c.get("mel_bins") or 64) // k


def _check_scheduler(root: Path) -> None:
    sched = _json(root / "scheduler" / "scheduler_config.json")
    name = sched.get("_class_name", "FlowMatchEulerDiscreteScheduler")
    stochastic = bool(sched.get("stochastic_sampling"))
    if name != "FlowMatchEulerDiscreteScheduler" or stochastic:
        raise NotImplementedError(f"{root}/scheduler is a {name}{' with stochastic_sampling' * stochastic}; vfm "
                                  "generate samples LTX-2 with FlowMatchEulerDiscreteScheduler's deterministic steps "
                                  "only: use diffusers' LTX2Pipeline for this folder")


def ltx2_checkpoint_info(path: str | Path):
    """A :class:`~nemo_vfm.inference.checkpoint_info.CheckpointInfo` (kind ``"ltx2"``) for an LTX-2 folder: its
    transformer's config (with the pipeline's ``use_cross_timestep=True``), the audio + video flow-matching objective
    and, for a whole pipeline folder, the video VAE, the text encoder and the default size ``vfm generate`` uses."""
    from nemo_vfm.diffusion.audio_video import AudioVideoFlowMatching
    from nemo_vfm.inference.checkpoint_info import CheckpointInfo
    from nemo_vfm.models.ltx2.convert import read_config

    root = Path(path)
    overrides = {}
    audio_vae = _json(root / "audio_vae" / "config.json")
    if audio_vae and "audio_mel_bins" not in _json(root / "transformer" / "config.json"):
        from diffusers.models.autoencoders.autoencoder_kl_ltx2_audio import LATENT_DOWNSAMPLE_FACTOR

        overrides["audio_mel_bins"] = (audio_vae.get("mel_bins") or 64) // LATENT_DOWNSAMPLE_FACTOR  # the latents' M
    cfg = read_config(root, pretrained=str(root), cross_timestep=True, **overrides)
    gen = {}
    if all((root / d).is_dir() for d in _PARTS):
        vae = _json(root / "vae" / "config.json")
        tc, sc = vae.get("temporal_compression_ratio") or 8, vae.get("spatial_compression_ratio") or 32
        gen = {"fps": FPS, "sampler": "flow-euler", "guidance": LTX2Guidance().video_cfg,
               "negative_prompt": NEGATIVE_PROMPT,
               "tokenizer": {"name": "ltx2", "kwargs": {"path": str(root)}},
               "text_encoder": {"name": "ltx2", "kwargs": {"path": str(root)}},
               "latent_shape": [vae.get("latent_channels", 128), 1 + (FRAMES - 1) // tc, HEIGHT // sc, WIDTH // sc]}
    return CheckpointInfo(root, "ltx2", cfg, AudioVideoFlowMatching(), gen, 0)


def _check(info) -> None:
    """Refuse, before anything is loaded, what LTX-2 sampling here does not do."""
    missing = [d for d in _PARTS if not (Path(info.path) / d).is_dir()]
    if missing:
        raise ValueError(f"{info.path} has no {', '.join(f'{d}/' for d in missing)}: vfm generate samples LTX-2 from "
                         "a whole LTX2Pipeline folder (transformer, vae, audio_vae, vocoder, text_encoder, tokenizer, "
                         "connectors, scheduler); copy the pipeline's other folders beside this transformer")
    _check_scheduler(Path(info.path))


def initial_noise(n: int, video_shape, audio_shape, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(N, C, t, h, w)`` then ``(N, Ca, La, M)`` standard normal noise from one CPU generator seeded ``seed``."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn((n, *video_shape), generator=g), torch.randn((n, *audio_shape), generator=g)


def sigma_schedule(root: str | Path, num_steps: int, video_tokens: int) -> torch.Tensor:
    """The pipeline's ``num_steps + 1`` sigmas (float32, ending at 0): ``linspace(1, 1/n, n)`` set on the folder's
    scheduler with ``mu = calculate_shift(video_tokens, ...)`` from the scheduler's config."""
    import numpy as np
    from diffusers import FlowMatchEulerDiscreteScheduler
    from diffusers.pipelines.ltx2.pipeline_ltx2 import calculate_shift

    sched = FlowMatchEulerDiscreteScheduler.from_pretrained(str(Path(root) / "scheduler"), local_files_only=True)
    c = sched.config
    mu = calculate_shift(video_tokens, c.get("base_image_seq_len", 1024), c.get("max_image_seq_len", 4096),
                         c.get("base_shift", 0.95), c.get("max_shift", 2.05))
    sched.set_timesteps(sigmas=np.linspace(1.0, 1 / num_steps, num_steps), mu=mu)
    return sched.sigmas.float().cpu()


def _rescale(guided: torch.Tensor, cond: torch.Tensor, phi: float) -> torch.Tensor:
    """Guidance rescale (diffusers' ``rescale_noise_cfg``): per sample, toward ``cond``'s standard deviation."""
    if phi <= 0:
        return guided
    dims = list(range(1, guided.dim()))
    rescaled = guided * (cond.std(dim=dims, keepdim=True) / guided.std(dim=dims, keepdim=True))
    return phi * rescaled + (1 - phi) * guided


def encode_prompts(engine, prompts: list[str], guided: bool) -> tuple[dict, dict | None]:
    """``(cond, uncond)`` network inputs ``context``, ``audio_context`` and the mask of both; ``uncond`` (the
    empty negative prompt) only when ``guided``. Rank 0 encodes."""
    from nemo_vfm.inference.hunyuan import _broadcast

    n = len(prompts)
    tensors = None
    if engine.rank == 0:
        video, mask, audio = engine.text_encoder.encode_streams(list(prompts) + ([NEGATIVE_PROMPT] * n if guided else []))
        tensors = {"context": video.float(), "audio_context": audio.float(), "context_mask": mask}
    tensors = _broadcast(engine, tensors)
    tensors["audio_context_mask"] = tensors["context_mask"]
    cond = {k: v[:n] for k, v in tensors.items()}
    return cond, ({k: v[n:] for k, v in tensors.items()} if guided else None)


def _x0(net, x, a, sigma, cond, fps, dtype, noisy=None, **flags):
    """One network pass -> the x0 estimates ``(x - v sigma, a - v_a sigma)`` in float32. ``noisy (S,)``: 0 for the
    video tokens that are clean (image to video: the first latent frame, at time 0), 1 elsewhere."""
    n = x.shape[0]
    t = sigma.expand(n).to(x.device)
    tv = t if noisy is None else t[:, None] * noisy  # the pipeline's timestep * (1 - conditioning_mask)
    v, va = net(x.to(dtype), tv, cond["context"].to(dtype), cond["context_mask"], audio=a.to(dtype), audio_timesteps=t,
                audio_context=cond["audio_context"].to(dtype), audio_context_mask=cond["audio_context_mask"], fps=fps,
                sigma=t, **flags)
    return x - v.float() * sigma, a - va.float() * sigma


@torch.no_grad()
def denoise_ltx2(net, cond: dict, uncond: dict | None, x: torch.Tensor, a: torch.Tensor, sigmas: torch.Tensor,
                 guidance: LTX2Guidance, fps: float, stg: bool = True, dtype=None, progress: bool = False,
                 first_frame_clean: bool = False):
    """Euler on ``sigmas`` from the noise ``x (N, C, t, h, w)``, ``a (N, Ca, La, M)`` with LTX2Pipeline's guidance in
    x0 space; ``stg``: run the STG pass (the transformer has perturbed attention); ``first_frame_clean``: image to
    video (LTX2ImageToVideoPipeline): ``x``'s first latent frame is the image's, kept and seen at time 0.
    -> the final latents (float32)."""
    from tqdm.auto import tqdm

    g = guidance
    dtype = dtype or next(net.parameters()).dtype
    noisy = None
    if first_frame_clean:
        if tuple(net.cfg.patch_size) != (1, 1, 1):
            raise NotImplementedError(f"LTX-2 image to video needs patch_size (1, 1, 1) (the pipeline's conditioning "
                                      f"mask is per latent pixel), got {net.cfg.patch_size}")
        noisy = torch.ones(x.shape[2:], device=x.device)
        noisy[0] = 0
        noisy = noisy.flatten()  # (S,): t-major, as the network packs tokens
    both = {k: torch.cat([cond[k], uncond[k]]) for k in cond} if uncond is not None else None
    n, sigmas = x.shape[0], sigmas.to(x.device)
    for i in tqdm(range(len(sigmas) - 1), desc="denoising", disable=not progress, leave=False):
        s = sigmas[i]
        if both is not None:
            xv, xa = _x0(net, torch.cat([x, x]), torch.cat([a, a]), s, both, fps, dtype, noisy)
            (xv, xv_u), (xa, xa_u) = xv.split(n), xa.split(n)
            gv, ga = xv + (g.video_cfg - 1) * (xv - xv_u), xa + (g.audio_cfg - 1) * (xa - xa_u)
        else:
            xv, xa = _x0(net, x, a, s, cond, fps, dtype, noisy)
            gv, ga = xv, xa
        if stg and (g.video_stg > 0 or g.audio_stg > 0):
            pv, pa = _x0(net, x, a, s, cond, fps, dtype, noisy, stg_blocks=g.stg_blocks)
            gv, ga = gv + g.video_stg * (xv - pv), ga + g.audio_stg * (xa - pa)
        if g.video_modality > 1 or g.audio_modality > 1:
            pv, pa = _x0(net, x, a, s, cond, fps, dtype, noisy, isolate_modalities=True)
            gv, ga = gv + (g.video_modality - 1) * (xv - pv), ga + (g.audio_modality - 1) * (xa - pa)
        gv, ga = _rescale(gv, xv, g.video_rescale), _rescale(ga, xa, g.audio_rescale)
        dt = sigmas[i + 1] - s
        stepped = x + dt * ((x - gv) / s)
        x = torch.cat([x[:, :, :1], stepped[:, :, 1:]], 2) if first_frame_clean else stepped
        a = a + dt * ((a - ga) / s)
    return x, a


@torch.no_grad()
def generate_ltx2(engine, audio: LTX2Audio | None, prompts: list[str], frames: int, height: int, width: int, sampling,
                  guidance: LTX2Guidance | None = None, fps: float = FPS, stg: bool = True, progress: bool = False,
                  decode: bool = True, first_frame: torch.Tensor | None = None) -> tuple[dict, dict]:
    """Prompts -> ``{"videos": (N, 3, T, H, W) in [-1, 1], "waveforms": (N, channels, samples)}`` (with
    ``decode=False``: ``{"latents", "audio_latents"}``, normalized) and seconds per stage. ``sampling``: its
    ``num_steps`` and ``seed``; the guidance is ``guidance`` (default :class:`LTX2Guidance`). Under several
    processes every rank runs the same loop on the same noise (the network splits the video tokens over its CP / TP
    ranks, the text comes from rank 0); the decoded outputs are rank 0's (``None`` elsewhere). ``first_frame``: image
    to video, the image's latents ``(1, C, 1, h, w)`` (:func:`image_latents`) as every video's clean first latent
    frame, as LTX2ImageToVideoPipeline does."""
    import math
    import time

    guidance = guidance or LTX2Guidance()
    tok, net = engine.tokenizer, engine.net
    thw = tok.latent_shape(frames, height, width)
    video_shape = (tok.latent_channels, *thw)
    audio_shape = audio_latent_shape(engine.generation["tokenizer"]["kwargs"]["path"], frames, fps)
    t0 = time.perf_counter()
    cond, uncond = encode_prompts(engine, prompts, guided=guidance.video_cfg > 1 or guidance.audio_cfg > 1)
    t1 = time.perf_counter()
    x, a = (z.to(engine.device) for z in initial_noise(len(prompts), video_shape, audio_shape, sampling.seed))
    if first_frame is not None:  # the pipeline's init_latents * mask + noise * (1 - mask): frame 0 is the image's
        x[:, :, :1] = first_frame.to(x)
    sigmas = sigma_schedule(engine.generation["tokenizer"]["kwargs"]["path"], sampling.num_steps,
                            math.prod(net.grid(*thw)))
    x, a = denoise_ltx2(net, cond, uncond, x, a, sigmas, guidance, fps, stg, engine.dtype, progress,
                        first_frame_clean=first_frame is not None)
    t2 = time.perf_counter()
    times = {"text_encode_s": t1 - t0, "denoise_s": t2 - t1}
    if not decode:
        return {"latents": x, "audio_latents": a}, times
    out = {"videos": engine.decode(x), "waveforms": audio.decode(a).cpu() if engine.rank == 0 else None}
    times["decode_s"] = time.perf_counter() - t2
    return out, times


@torch.no_grad()
def image_latents(tokenizer, image, height: int, width: int, device=None, crf: int | None = None) -> torch.Tensor:
    """``(1, C, 1, h, w)`` latents of ``image`` (a path or PIL image) as LTX2ImageToVideoPipeline makes them:
    re-compressed as one H.264 frame at ``crf`` (default: Gemma 3 generations' 33; 0: as it is), resized (bilinear)
    to ``height x width``, the VAE posterior's mode, normalized by ``latents_mean`` / ``latents_std`` (without the
    VAE's ``scaling_factor``, as that pipeline; 1 in LTX-2's VAE)."""
    import numpy as np
    from diffusers.pipelines.ltx2.utils import DEFAULT_IMAGE_CRF, apply_image_conditioning_crf
    from diffusers.video_processor import VideoProcessor
    from PIL import Image

    if not isinstance(image, Image.Image):
        if not Path(image).is_file():
            raise FileNotFoundError(f"image not found: {image}")
        image = Image.open(image)
    crf = DEFAULT_IMAGE_CRF if crf is None else crf
    pixels = Image.fromarray(apply_image_conditioning_crf(np.array(image.convert("RGB")), crf))
    proc = VideoProcessor(vae_scale_factor=tokenizer.spatial_compression, resample="bilinear")  # the pipeline's
    pixels = proc.preprocess(pixels, height=height, width=width)
    inner = getattr(tokenizer, "inner", tokenizer)  # under --decode-tile: the VAE adapter itself
    raw = inner.encode_raw(pixels[:, :, None].to(device or "cpu"))
    return inner.normalize_latents(raw) / inner.vae.config.scaling_factor  # (z - mean) sf / std / sf


def _sampler(ctx):
    """Loads the audio VAE and vocoder once; ``sample(prompts) -> (videos, seconds, (waveforms, sample rate))``."""
    root = ctx.info.parts  # the pipeline folder (a training run: its model.pretrained's)
    if ctx.sampling.sampler != "flow-euler":
        raise ValueError(f"--sampler {ctx.sampling.sampler}: LTX-2 samples with its pipeline's Euler steps "
                         "(flow-euler); drop --sampler")
    if ctx.args.flow_shift is not None:
        raise ValueError("--flow-shift: LTX-2 shifts its sigmas with the scheduler's dynamic shift; drop --flow-shift")
    if ctx.layout.cfg_parallel:
        raise NotImplementedError("--cfg-parallel is not built for LTX-2 (its guidance runs up to four passes per "
                                  "step); drop it: --cp N splits the video tokens over the GPUs instead")
    audio = LTX2Audio.load(root, ctx.device) if ctx.rank == 0 else None  # decodes on rank 0
    stg = bool(_json(Path(root) / "transformer" / "config.json").get("perturbed_attn", False))
    guidance = LTX2Guidance(video_cfg=ctx.sampling.guidance)
    fps = ctx.info.generation.get("fps") or FPS
    first = None
    if ctx.args.image:
        first = image_latents(ctx.engine.tokenizer, ctx.args.image, ctx.height, ctx.width, ctx.device)

    def sample(batch: list[str]):
        out, times = generate_ltx2(ctx.engine, audio, batch, ctx.frames, ctx.height, ctx.width, ctx.sampling,
                                   guidance, fps, stg, progress=True, first_frame=first)
        return out["videos"], times, (out["waveforms"], audio.sample_rate if audio is not None else None)

    return sample


def _check_run(info, args, layout) -> None:
    if getattr(args, "no_audio", False):
        raise ValueError("--no-audio: LTX-2 samples video and sound together (video only is not built); drop it")


def ltx2_run_info(info):
    """A training run (``lora_ltx2``, ``lora_ltx2_video``, ``finetune_ltx2``) read for sampling: its transformer (the
    run's weights: EMA when it has them, LoRA merged) with everything else from the LTX2Pipeline folder of its
    ``model.pretrained``: text encoder, connectors, VAEs, vocoder, scheduler, the pipeline's ``use_cross_timestep``
    and the joint audio + video objective (a video-only run samples both streams, its audio from the base, as the
    pipeline does). Raises before the weights load when that folder is missing or lacks a part, or when the run's
    latent channels differ from the folder's."""
    import dataclasses

    from nemo_vfm.inference.generation import check_run_matches, run_pipeline

    root = run_pipeline(info, _PARTS, "LTX2Pipeline")
    folder = ltx2_checkpoint_info(root)
    _check(folder)
    check_run_matches(info, folder, ("in_channels", "out_channels", "audio_in_channels", "audio_mel_bins",
                                     "caption_channels"), root)
    return dataclasses.replace(info, model_config=dataclasses.replace(info.model_config, cross_timestep=True),
                               objective=folder.objective, generation=folder.generation, pipeline=root)


GENERATION = FamilyGeneration(family="ltx2", kind="ltx2", published_info=ltx2_checkpoint_info, published_only=True,
                              check=_check, check_run=_check_run, sampler=_sampler, image=lambda info: "optional",
                              sampling_defaults={"default_steps": STEPS, "default_guidance": LTX2Guidance().video_cfg})
TRAINED = FamilyGeneration(family="ltx2", run_info=ltx2_run_info, check_run=_check_run, sampler=_sampler,
                           image=lambda info: "optional",
                           sampling_defaults={"default_steps": STEPS, "default_guidance": LTX2Guidance().video_cfg})
"""The adapter of LTX-2 training runs: sampled as their pipeline folder is (:func:`ltx2_run_info`)."""
