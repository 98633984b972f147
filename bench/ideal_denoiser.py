"""The quickstart's sampler with the *exact* denoiser of its training set instead of a network.

    python bench/ideal_denoiser.py

``D*(x; sigma) = sum_i w_i x_i`` with ``w = softmax(-|x - x_i|^2 / (2 sigma^2))`` over the 512 training
latents is the minimiser of the EDM loss on that set. Sampled with the quickstart's EDM settings (Heun, 24
steps, sigma 80 -> 0.002 -> 0, guidance off: D* is conditioned by restricting the set to clips with the
caption), decoded by the identity tokenizer and clamped as in training previews, the videos are scored with
:mod:`nemo_vfm.evaluation.shapes`. Then the same with a denoiser that leaves a fraction ``a`` of the noise
in its estimate (``D = D* + a (x - D*)``, what an under-fitted network does) within one band of noise
levels, to see which band's errors give speckle and which give fragments. Prints one line per setting.
"""

import sys
from pathlib import Path

import torch

if not __package__:  # run as `python bench/NAME.py`: import bench as a package
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from nemo_vfm.data.synthetic_video import ShapeClipSpec, make_clip  # noqa: E402
from nemo_vfm.diffusion import samplers  # noqa: E402
from nemo_vfm.evaluation.shapes import score_videos  # noqa: E402
from nemo_vfm.io.video import frames_to_tensor  # noqa: E402
from nemo_vfm.tokenizers.identity import IdentityTokenizer  # noqa: E402


def main() -> None:
    torch.manual_seed(0)
    spec = ShapeClipSpec(num_frames=8, height=32, width=32)
    tok = IdentityTokenizer(spatial_compression=2)
    clips = [make_clip(spec, 1234, i) for i in range(512)]
    data = torch.stack([tok.encode(frames_to_tensor(c.frames)[None])[0] for c in clips])  # (512, 12, 8, 16, 16)
    captions = [c.caption for c in clips]
    n = 16
    # condition: each sample's denoiser only sees the training clips with its caption
    sets = [data[[j for j, c in enumerate(captions) if c == captions[i]]].flatten(1) for i in range(n)]

    def ideal(x, sigma):
        out = torch.empty_like(x)
        s2 = float(sigma[0]) ** 2
        for i in range(len(x)):
            d2 = ((sets[i] - x[i].flatten()) ** 2).sum(1)
            w = torch.softmax(-d2 / (2 * s2), 0)
            out[i] = (w[:, None] * sets[i]).sum(0).view_as(x[i])
        return out

    def run(label, band=None, a=0.0):
        def den(x, sigma):
            d = ideal(x, sigma)
            if band and band[0] <= float(sigma[0]) < band[1]:
                d = d + a * (x - d)
            return d

        sig = samplers.karras_sigmas(24, 0.002, 80.0)
        x = torch.randn(n, *data.shape[1:], generator=torch.Generator().manual_seed(0)) * 80.0
        x = samplers.heun(den, x, sig)
        videos = tok.decode(x).clamp(-1, 1)
        r = score_videos(videos, captions[:n])
        rates = ", ".join(f"{k} {v:.0%}" for k, v in r["rates"].items())
        print(f"{label:<42} pass {r['pass_rate']:.0%} ({rates})", flush=True)

    run("exact denoiser")
    for band in ((2.0, 80.0), (0.3, 2.0), (0.03, 0.3), (0.0, 0.03)):
        for a in (0.1, 0.3):
            run(f"{a:.0%} of the noise left at sigma in [{band[0]}, {band[1]})", band, a)


if __name__ == "__main__":
    main()
