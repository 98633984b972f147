"""Prior-preservation class samples for DreamBooth: the base model draws ``class_prompt`` videos.

    write_class_samples(net, objective, data, n, sampling)   # -> data.class_data/class_00000.mp4 ...

``train()`` calls it (one process) when a ``DreamBoothDataModule`` with ``prior_preservation`` finds fewer
than ``num_class_samples`` videos in its ``class_data`` folder; the network is the base model of
``init_from``, before any fine-tuning.
"""

from dataclasses import replace
from pathlib import Path

import torch


@torch.no_grad()
def write_class_samples(net, objective, data, n: int, sampling, batch: int = 8, device=None) -> list[Path]:
    """Sample ``n`` videos of ``data.class_prompt`` at ``data``'s latent size and write them as mp4 files
    into ``data.class_data`` (numbered after the files already there)."""
    from nemo_vfm.data.dreambooth import list_media
    from nemo_vfm.inference.generate import generate_videos
    from nemo_vfm.io.video import tensor_to_frames, write_video

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    out_dir = Path(data.class_data)
    out_dir.mkdir(parents=True, exist_ok=True)
    start = len(list_media(out_dir))
    tok, text = data.build_encoders()
    net = net.to(device).eval()
    written = []
    for i in range(0, n, batch):
        k = min(batch, n - i)
        cfg = replace(sampling, seed=sampling.seed + 1000 + start + i)  # new noise per chunk and per refill
        videos, _ = generate_videos(net, objective, tok, text, [data.class_prompt] * k, data.latent_shape, cfg,
                                    device=device, fps=data.fps)
        for j, v in enumerate(videos):
            written.append(write_video(out_dir / f"class_{start + i + j:05d}.mp4", tensor_to_frames(v),
                                       fps=data.fps or 8.0))
    return written
