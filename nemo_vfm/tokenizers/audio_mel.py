"""The log-mel front end of the LTX-2 audio VAE encoder, in plain torch (no torchaudio).

Follows the LTX-2 release (``Lightricks/LTX-2``):

* ``packages/ltx-core/src/ltx_core/model/audio_vae/ops.py`` (``AudioProcessor``): resample to the VAE's rate with
  ``torchaudio.functional.resample`` (windowed sinc, Hann window, ``lowpass_filter_width=6``, ``rolloff=0.99``), then
  ``torchaudio.transforms.MelSpectrogram(n_fft, win_length=n_fft, hop_length, f_min=0, f_max=sr/2, n_mels,
  window_fn=hann_window, center=True, pad_mode="reflect", power=1.0, mel_scale="slaney", norm="slaney")`` and
  ``log(clamp(mel, min=1e-5))``, laid out ``(B, C, frames, n_mels)``;
* ``packages/ltx-trainer/scripts/process_videos.py`` (``_encode_audio``, ``_extract_audio``): the waveform is trimmed
  to the video's duration (``int(frames / fps * sr)`` samples; zero-padded when shorter) and made stereo (mono
  duplicated; 5.1 and 7.1 downmixed with the weights below; other layouts averaged to mono, then duplicated).

:func:`mel_filterbank` is torchaudio's ``melscale_fbanks`` (Slaney mel scale and area normalisation, as librosa's
``filters.mel(htk=False, norm="slaney")``), :func:`resample` torchaudio's ``sinc_interp_hann`` kernel.
Legend: B batch, C audio channels, N samples, F stft bins (n_fft // 2 + 1), T mel frames, M mel bins.
"""

from __future__ import annotations

import math

import torch

_F_SP = 200.0 / 3  # Slaney: linear below 1 kHz (3 mels per 200 Hz), logarithmic above
_MIN_LOG_HZ = 1000.0
_MIN_LOG_MEL = _MIN_LOG_HZ / _F_SP
_LOGSTEP = math.log(6.4) / 27.0


def hz_to_mel(freq: float) -> float:
    """Slaney mel of ``freq`` Hz."""
    if freq < _MIN_LOG_HZ:
        return freq / _F_SP
    return _MIN_LOG_MEL + math.log(freq / _MIN_LOG_HZ) / _LOGSTEP


def mel_to_hz(mels: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`hz_to_mel`, elementwise."""
    freqs = mels * _F_SP
    return torch.where(mels >= _MIN_LOG_MEL, _MIN_LOG_HZ * torch.exp(_LOGSTEP * (mels - _MIN_LOG_MEL)), freqs)


def mel_filterbank(n_freqs: int, f_min: float, f_max: float, n_mels: int, sample_rate: int) -> torch.Tensor:
    """Triangular Slaney-normalised filters ``(F, M)``: ``fb[f, m]`` weighs stft bin ``f`` into mel bin ``m``."""
    all_freqs = torch.linspace(0, sample_rate // 2, n_freqs)
    m_pts = torch.linspace(hz_to_mel(f_min), hz_to_mel(f_max), n_mels + 2)
    f_pts = mel_to_hz(m_pts)
    f_diff = f_pts[1:] - f_pts[:-1]  # (M + 1)
    slopes = f_pts[None, :] - all_freqs[:, None]  # (F, M + 2)
    down = -slopes[:, :-2] / f_diff[:-1]
    up = slopes[:, 2:] / f_diff[1:]
    fb = torch.clamp(torch.minimum(down, up), min=0.0)
    return fb * (2.0 / (f_pts[2:n_mels + 2] - f_pts[:n_mels]))[None, :]  # Slaney: equal area per filter


def log_mel(waveform_BCN: torch.Tensor, sample_rate: int, n_fft: int, hop_length: int, n_mels: int) -> torch.Tensor:
    """``(B, C, N)`` waveform at ``sample_rate`` -> log-mel ``(B, C, T, M)``, ``T = 1 + N // hop_length``."""
    b, c, n = waveform_BCN.shape
    x = waveform_BCN.reshape(b * c, n).float()
    window = torch.hann_window(n_fft, device=x.device, dtype=x.dtype)
    spec = torch.stft(x, n_fft, hop_length=hop_length, win_length=n_fft, window=window, center=True,
                      pad_mode="reflect", normalized=False, onesided=True, return_complex=True).abs()  # (BC, F, T)
    fb = mel_filterbank(n_fft // 2 + 1, 0.0, sample_rate / 2.0, n_mels, sample_rate).to(x.device)
    mel = torch.matmul(spec.transpose(-1, -2), fb)  # (BC, T, M)
    return torch.log(torch.clamp(mel, min=1e-5)).reshape(b, c, -1, n_mels)


def _sinc_kernel(orig: int, new: int, width_taps: int = 6, rolloff: float = 0.99,
                 dtype=torch.float64) -> tuple[torch.Tensor, int]:
    base = min(orig, new) * rolloff
    width = math.ceil(width_taps * orig / base)
    idx = torch.arange(-width, width + orig, dtype=dtype)[None, None] / orig
    t = torch.arange(0, -new, -1, dtype=dtype)[:, None, None] / new + idx
    t = (t * base).clamp(-width_taps, width_taps)
    window = torch.cos(t * math.pi / width_taps / 2) ** 2
    t = t * math.pi
    kernel = torch.where(t == 0, torch.ones_like(t), torch.sin(t) / t)
    return kernel * window * (base / orig), width


def resample(waveform: torch.Tensor, orig_freq: int, new_freq: int) -> torch.Tensor:
    """``(..., N)`` at ``orig_freq`` -> ``(..., ceil(N * new / orig))`` at ``new_freq`` (torchaudio's
    ``functional.resample`` with its defaults: band-limited sinc, Hann window, 6 zero crossings, rolloff 0.99)."""
    if orig_freq == new_freq:
        return waveform
    g = math.gcd(int(orig_freq), int(new_freq))
    orig, new = int(orig_freq) // g, int(new_freq) // g
    kernel, width = _sinc_kernel(orig, new, dtype=torch.float64)
    shape = waveform.shape
    x = waveform.reshape(-1, shape[-1]).double()
    n = x.shape[-1]
    x = torch.nn.functional.pad(x, (width, width + orig))
    y = torch.nn.functional.conv1d(x[:, None], kernel.to(x), stride=orig).transpose(1, 2).reshape(x.shape[0], -1)
    y = y[..., :math.ceil(new * n / orig)]
    return y.reshape(*shape[:-1], y.shape[-1]).to(waveform.dtype)


def to_stereo(waveform_CN: torch.Tensor) -> torch.Tensor:
    """``(C, N)`` -> ``(2, N)`` as the release's ``_encode_audio``: mono duplicated, 5.1 / 7.1 downmixed (main
    channel 1, centre and surrounds 0.707, normalised to sum 1), other layouts averaged then duplicated."""
    c = waveform_CN.shape[0]
    if c == 2:
        return waveform_CN
    if c == 1:
        return waveform_CN.repeat(2, 1)
    w = waveform_CN
    if c == 6:  # L R C LFE Ls Rs
        main, other = 1.0 / 2.414, 0.707 / 2.414
        return torch.stack([main * w[0] + other * (w[2] + w[4]), main * w[1] + other * (w[2] + w[5])])
    if c == 8:  # L R C LFE Ls Rs Lb Rb
        main, other = 1.0 / 3.121, 0.707 / 3.121
        return torch.stack([main * w[0] + other * (w[2] + w[4] + w[6]), main * w[1] + other * (w[2] + w[5] + w[7])])
    return w.mean(dim=0, keepdim=True).repeat(2, 1)
