"""Sampling previews of a training run (``SampleVideos``): the dataset's first captions sampled with the module's
network and decoded by the data's tokenizer, written as videos and, for synthetic-shapes captions, scored."""

from pathlib import Path


def training_previews(data, sampling, fps):
    """``(sample, write)`` for SampleVideos: the first captions of the dataset sampled with the module's network
    and decoded by the data's tokenizer (every rank), then written (rank 0). When the captions are
    synthetic-shapes captions, the videos are scored against them (:mod:`nemo_vfm.evaluation.shapes`): the
    per-video table goes to ``stem.json``, the rates to the logs."""
    import importlib.util

    from nemo_vfm.evaluation.shapes import is_shapes_caption, metric_logs, score_videos
    from nemo_vfm.inference.generate import generate_videos, write_videos

    if importlib.util.find_spec("av") is None:  # found now, not after the steps before the first preview
        raise ModuleNotFoundError("sampling previews are written as mp4 with PyAV, which is not installed: "
                                  "pip install av (a dependency of nemo-vfm), or set sampling.enabled=false")

    def sample(module):
        tokenizer, text_encoder = data.build_encoders()
        prompts = data.captions[: sampling.num_samples]  # known once the data module is set up
        videos, _ = generate_videos(module.sampling_model(), module.objective, tokenizer, text_encoder, prompts,
                                    data.latent_shape, sampling, device=module.device, fps=fps)
        return videos

    def write(videos, stem):
        import json

        prompts = data.captions[: sampling.num_samples]
        upscale = max(1, 128 // max(videos.shape[-2:]))
        files = write_videos(videos, stem, fps=fps or 8.0, upscale=upscale, captions=prompts)
        if not prompts or not all(is_shapes_caption(p) for p in prompts):
            return files
        report = score_videos(videos, prompts)
        Path(stem).with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
        return files + [Path(stem).with_suffix(".json")], metric_logs(report)

    return sample, write
