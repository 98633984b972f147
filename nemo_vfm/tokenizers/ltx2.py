"""LTX-2's text and audio encoders for ``vfm prepare``, read from a diffusers LTX-2 pipeline folder.

* :class:`LTX2TextEncoder` (registry name ``ltx2``): Gemma 3 (``text_encoder/``, ``tokenizer/``) packed as diffusers'
  ``LTX2Pipeline._get_gemma_prompt_embeds`` (left padding to ``max_length`` tokens, every hidden state stacked on the
  last axis and flattened), then the folder's ``connectors/`` (``LTX2TextConnectors``) -> the video stream's text
  ``(L, Dv)`` with its mask, and the audio stream's text ``(L, Da)`` (:meth:`LTX2TextEncoder.encode_streams`).
* :class:`LTX2AudioVAE`: a clip's waveform -> the release's log-mel spectrogram (:mod:`nemo_vfm.tokenizers.audio_mel`)
  -> ``audio_vae/`` (``AutoencoderKLLTX2Audio``) posterior mode -> normalised as diffusers'
  ``LTX2Pipeline._normalize_audio_latents`` on the packed latents ``(La, Ca * M)`` -> ``(Ca, La, M)``, the layout the
  network's ``audio`` input takes.

The video VAE is the ``ltx2`` family of :class:`~nemo_vfm.tokenizers.diffusers_vae.DiffusersVideoVAE`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from nemo_vfm.tokenizers.audio_mel import log_mel, resample, to_stereo
from nemo_vfm.tokenizers.base import TextEncoder
from nemo_vfm.tokenizers.diffusers_vae import parse_dtype, resolve_local_dir

N_FFT = 1024  # the release's AudioEncoder default (``n_fft``); diffusers' AutoencoderKLLTX2Audio config has no field


def _pipeline_part(root: Path, name: str, what: str) -> Path:
    part = root / name
    if not part.is_dir():
        raise FileNotFoundError(f"LTX-2 text encoder: {root} has no {name}/ ({what}); pass an LTX-2 pipeline folder "
                                "(diffusers layout: text_encoder/, tokenizer/, connectors/)")
    return part


class LTX2TextEncoder(TextEncoder):
    """Captions -> the video stream's text ``(B, L, Dv)`` + mask ``(B, L)`` (``encode``), and with them the audio
    stream's text ``(B, L, Da)`` (``encode_streams``). ``max_length``: Gemma tokens (the pipeline's 1024 by
    default; a multiple of the connectors' learnable registers)."""

    audio_context = True  # vfm prepare stores encode_streams' third output as the audio_text_emb part

    def __init__(self, path: str | Path, max_length: int = 1024, device: str | torch.device = "cpu",
                 dtype: str | torch.dtype | None = None):
        import transformers
        from diffusers.pipelines.ltx2.connectors import LTX2TextConnectors

        root = Path(path).expanduser()
        if not root.is_dir():
            raise FileNotFoundError(f"LTX-2 text encoder: {root} is not a local directory; download the pipeline "
                                    "(e.g. `huggingface-cli download Lightricks/LTX-2 --local-dir DIR`) and pass path=DIR")
        te, tok, conn = (_pipeline_part(root, n, w) for n, w in (("text_encoder", "Gemma 3"), ("tokenizer", "Gemma"),
                                                                   ("connectors", "LTX2TextConnectors")))
        torch_dtype = parse_dtype(dtype) or torch.float32
        config = transformers.AutoConfig.from_pretrained(str(te), local_files_only=True)
        model_cls = (transformers.Gemma3ForConditionalGeneration if config.model_type == "gemma3"
                     else transformers.AutoModelForCausalLM)
        self.model = model_cls.from_pretrained(str(te), local_files_only=True, dtype=torch_dtype)
        self.model = self.model.to(device).eval().requires_grad_(False)
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(str(tok), local_files_only=True)
        self.tokenizer.padding_side = "left"  # as the pipeline: Gemma reads chat-style left-padded prompts
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.connectors = LTX2TextConnectors.from_pretrained(str(conn), local_files_only=True,
                                                                       torch_dtype=torch_dtype)
        self.connectors = self.connectors.to(device).eval().requires_grad_(False)
        c = self.connectors.config
        self.max_length, self.path = int(max_length), str(root)
        self.dim = c.video_connector_num_attention_heads * c.video_connector_attention_head_dim
        self.audio_dim = c.audio_connector_num_attention_heads * c.audio_connector_attention_head_dim
        regs = c.video_connector_num_learnable_registers
        if not regs or not c.audio_connector_num_learnable_registers:  # then the mask stays left-padded
            raise ValueError("LTX-2 text encoder: connectors without learnable registers are not supported (their "
                             "output mask is left-padded, which the loader's right-trimmed text does not read)")
        if self.max_length % regs:
            raise ValueError(f"LTX-2 text encoder: max_length={max_length} must be a multiple of the connectors' "
                             f"{regs} learnable registers")

    @property
    def cache_key(self) -> str:
        return f"LTX2TextEncoder:{self.path}:{self.max_length}"

    @torch.no_grad()
    def encode_streams(self, captions: list[str]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(video_text (B, L, Dv), mask (B, L) bool, audio_text (B, L, Da))``, as ``LTX2Pipeline`` feeds them to
        its transformer (``connectors(prompt_embeds, prompt_attention_mask, padding_side)``)."""
        if isinstance(captions, str):
            raise TypeError("LTX2TextEncoder.encode takes a list of captions, got a single string")
        t = self.tokenizer([c.strip() for c in captions], padding="max_length", max_length=self.max_length,
                           truncation=True, add_special_tokens=True, return_tensors="pt")
        device = next(self.model.parameters()).device
        ids, mask = t.input_ids.to(device), t.attention_mask.to(device)
        out = self.model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
        dtype = next(self.connectors.parameters()).dtype
        packed = torch.stack(out.hidden_states, dim=-1).flatten(2, 3).to(dtype)  # (B, L, D * (layers + 1))
        video, audio, vmask = self.connectors(packed, mask, padding_side=self.tokenizer.padding_side)
        return video.float(), vmask.bool(), audio.float()

    def encode(self, captions: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        video, mask, _ = self.encode_streams(captions)
        return video, mask


class LTX2AudioVAE:
    """``encode(waveform (C, N), sample_rate, seconds) -> (Ca, La, M)`` normalised LTX-2 audio latents."""

    def __init__(self, path: str | Path, device: str | torch.device = "cpu", dtype: str | torch.dtype | None = None):
        import diffusers

        directory, subfolder = resolve_local_dir(path, "audio_vae", "LTX-2 audio VAE (audio_vae)")
        extra = {"subfolder": subfolder} if subfolder else {}
        # float32 by default: the release's trainer encodes audio in float32 ("needs float32 for quality")
        self.vae = diffusers.AutoencoderKLLTX2Audio.from_pretrained(
            str(directory), local_files_only=True, torch_dtype=parse_dtype(dtype) or torch.float32, **extra)
        self.vae = self.vae.to(device).eval().requires_grad_(False)
        cfg = self.vae.config
        self.sample_rate, self.hop_length, self.mel_bins = int(cfg.sample_rate), int(cfg.mel_hop_length), int(cfg.mel_bins)
        self.in_channels, self.n_fft = int(cfg.in_channels), N_FFT
        self.path = str(path)

    def _param(self) -> torch.Tensor:
        return next(self.vae.parameters())

    def mel(self, waveform_CN, sample_rate: int, seconds: float) -> torch.Tensor:
        """The encoder's input ``(1, 2, T, mel_bins)``: trimmed / zero-padded to ``seconds``, stereo, resampled,
        log-mel (the release's ``_extract_audio`` + ``_encode_audio`` + ``AudioProcessor.waveform_to_mel``)."""
        wave = torch.as_tensor(np.asarray(waveform_CN), dtype=torch.float32)
        n = int(seconds * sample_rate)
        wave = wave[:, :n] if wave.shape[1] >= n else torch.nn.functional.pad(wave, (0, n - wave.shape[1]))
        wave = to_stereo(wave) if self.in_channels == 2 else wave.mean(0, keepdim=True)
        wave = resample(wave, int(sample_rate), self.sample_rate)
        return log_mel(wave[None], self.sample_rate, self.n_fft, self.hop_length, self.mel_bins)

    @torch.no_grad()
    def encode_mel(self, mel: torch.Tensor) -> torch.Tensor:
        """Log-mel ``(B, 2, T, mel_bins)`` -> normalised latents ``(B, Ca, La, M)``."""
        p = self._param()
        z = self.vae.encode(mel.to(device=p.device, dtype=p.dtype)).latent_dist.mode().float()  # (B, Ca, La, M)
        b, c, la, m = z.shape
        packed = z.transpose(1, 2).flatten(2, 3)  # (B, La, Ca*M): LTX2Pipeline._pack_audio_latents
        mean, std = self.vae.latents_mean.float().to(z.device), self.vae.latents_std.float().to(z.device)
        if mean.numel() != c * m:
            raise ValueError(f"LTX-2 audio VAE: latents_mean has {mean.numel()} entries, the packed latents "
                             f"{c} x {m}; the folder's audio_vae config does not match its statistics")
        packed = (packed - mean) / std  # LTX2Pipeline._normalize_audio_latents
        return packed.unflatten(2, (c, m)).transpose(1, 2)

    def encode(self, waveform_CN, sample_rate: int, seconds: float) -> torch.Tensor:
        """A clip's audio ``(C, N)`` at ``sample_rate`` over its first ``seconds`` -> ``(Ca, La, M)``."""
        return self.encode_mel(self.mel(waveform_CN, sample_rate, seconds))[0].cpu()

    @torch.no_grad()
    def latent_shape(self, seconds: float) -> tuple[int, int, int]:
        """``(Ca, La, M)`` that :meth:`encode` gives for a clip of ``seconds`` (computed on a silent input; used only
        for its shape)."""
        frames = 1 + int(seconds * self.sample_rate) // self.hop_length
        p = self._param()
        z = self.vae.encode(torch.zeros(1, self.in_channels, frames, self.mel_bins, device=p.device,
                                        dtype=p.dtype)).latent_dist.mode()
        return tuple(int(v) for v in z.shape[1:])
