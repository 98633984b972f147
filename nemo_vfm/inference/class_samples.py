"""Prior-preservation class samples for DreamBooth: the base model draws ``class_prompt`` videos.

    write_class_samples(net, objective, data, n, sampling)   # -> data.class_data/class_00000.mp4 ...

``train()`` calls it (one process) when a ``DreamBoothDataModule`` with ``prior_preservation`` finds fewer
than ``num_class_samples`` videos in its ``class_data`` folder; the network is the base model of
``init_from``, before any fine-tuning.
"""

import os
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


def draw_missing_class_samples(model, objective, data, init_from, sampling) -> None:
    """DreamBooth prior preservation: the base model (``init_from``) draws the missing class videos."""
    if init_from is None and not getattr(model, "pretrained", None):
        raise ValueError("prior preservation draws class samples from the base model: set init_from (or "
                         f"model.pretrained), or fill data.class_data={data.class_data} with class videos yourself")
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ValueError(f"data.class_data={data.class_data} lacks {data.missing_class_samples} class videos; draw them "
                         "in one process first (the same command without torchrun), then launch the distributed run")
    from nemo_vfm.inference.checkpoint import load_pretrained

    net = model.build()  # a config with `pretrained` (Wan) loads its weights here
    if init_from is not None:
        load_pretrained(net, init_from)
    n = data.missing_class_samples
    print(f"prior preservation: drawing {n} videos of {data.class_prompt!r} from the base model")
    write_class_samples(net, objective, data, n, sampling)
    del net
