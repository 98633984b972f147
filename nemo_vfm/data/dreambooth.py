"""DreamBooth data: a few images or clips of one subject with one instance prompt, and optional prior
preservation from class samples.

    instance_data/   3-20 videos or images of the subject (any size: resized and centre-cropped)
    class_data/      videos of the class ("a square") drawn from the base model before training

Every clip becomes ``num_frames x height x width`` pixels (an image is repeated over the frames: a still
video), is encoded once by the tokenizer, and its prompt once by the text encoder. Batches mix instance
and class samples at random; each sample carries a ``loss_mask`` filled with its weight (1 for the
subject, ``prior_loss_weight`` for the class), so the masked-mean loss is the weighted mean
``(sum_inst + w * sum_class) / (n_inst + w * n_class)`` over the batch's latent positions.

``class_data`` with fewer than ``num_class_samples`` videos is filled by ``train()`` before training
(``nemo_vfm.train``: the base model of ``init_from`` samples ``class_prompt``; see docs/finetuning.md).
"""

from pathlib import Path

import numpy as np
import torch

from nemo_vfm.data.synthetic import _DictDataset, _EncodedDataModule


def fit_frames(frames_THWC: np.ndarray, num_frames: int, height: int, width: int) -> np.ndarray:
    """Resize (shorter side to fit) and centre-crop to ``height x width``; take ``num_frames`` evenly spaced
    frames (repeating frames of a shorter clip, or an image)."""
    from PIL import Image

    t = frames_THWC.shape[0]
    idx = np.linspace(0, t - 1, num_frames).round().astype(int) if t > 1 else np.zeros(num_frames, int)
    out = []
    for i in idx:
        img = Image.fromarray(frames_THWC[i])
        s = max(height / img.height, width / img.width)
        img = img.resize((max(width, round(img.width * s)), max(height, round(img.height * s))), Image.BICUBIC)
        left, top = (img.width - width) // 2, (img.height - height) // 2
        out.append(np.asarray(img.crop((left, top, left + width, top + height)).convert("RGB")))
    return np.stack(out)


def list_media(folder: str | Path) -> list[Path]:
    from nemo_vfm.data.sources import IMAGE_EXTS, VIDEO_EXTS

    folder = Path(folder)
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in VIDEO_EXTS + IMAGE_EXTS)


def load_media(path: Path) -> np.ndarray:
    from nemo_vfm.data.sources import IMAGE_EXTS, read_image
    from nemo_vfm.io.video import read_video

    return (read_image(path) if path.suffix.lower() in IMAGE_EXTS else read_video(path))[0]


class DreamBoothDataModule(_EncodedDataModule):
    """Instance clips/images with ``instance_prompt`` (+ class clips with ``class_prompt`` when
    ``prior_preservation``). Tokenizer and text encoder are registry names, as in ``vfm prepare``."""

    def __init__(self, *, instance_data: str, instance_prompt: str, class_data: str | None = None,
                 class_prompt: str | None = None, prior_preservation: bool = False, num_class_samples: int = 16,
                 prior_loss_weight: float = 1.0, num_frames: int = 8, height: int = 32, width: int = 32,
                 fps: float = 8.0, batch_size: int = 4, seed: int = 0, tokenizer: str = "identity",
                 tokenizer_kwargs: dict | None = None, text_encoder: str = "hash",
                 text_encoder_kwargs: dict | None = None, num_workers: int = 0):
        super().__init__()
        self.save_hyperparameters()
        if not instance_prompt:
            raise ValueError("DreamBoothDataModule.instance_prompt must name the subject, e.g. 'a sks square'")
        if prior_preservation and (not class_data or not class_prompt):
            raise ValueError("DreamBoothDataModule.prior_preservation needs class_data (a folder) and class_prompt "
                             "(e.g. 'a square')")
        if prior_loss_weight <= 0 or num_class_samples < 1:
            raise ValueError("DreamBoothDataModule.prior_loss_weight must be > 0 and num_class_samples >= 1")
        self.instance_data, self.instance_prompt = instance_data, instance_prompt
        self.class_data, self.class_prompt = class_data, class_prompt
        self.prior_preservation, self.num_class_samples = prior_preservation, num_class_samples
        self.prior_loss_weight = prior_loss_weight
        self.num_frames, self.height, self.width, self.fps = num_frames, height, width, fps
        self.batch_size, self.seed, self.num_workers = batch_size, seed, num_workers
        self.tokenizer_spec = {"name": tokenizer, "kwargs": dict(tokenizer_kwargs or {})}
        self.text_encoder_spec = {"name": text_encoder, "kwargs": dict(text_encoder_kwargs or {})}
        self.tokenizer = self.text_encoder = None
        self.captions = [instance_prompt]  # what the training previews sample

    @property
    def missing_class_samples(self) -> int:
        """How many class videos ``train()`` must generate before training (0 without prior preservation)."""
        if not self.prior_preservation:
            return 0
        return max(0, self.num_class_samples - len(list_media(self.class_data)))

    def _encode(self, paths: list[Path]) -> torch.Tensor:
        from nemo_vfm.io.video import frames_to_tensor

        tok, _ = self.build_encoders()
        with torch.no_grad():
            return torch.stack([tok.encode(frames_to_tensor(fit_frames(load_media(p), self.num_frames, self.height,
                                                                       self.width))[None])[0].float() for p in paths])

    def setup(self, stage: str | None = None):
        if self.dataset is not None:
            return
        inst = list_media(self.instance_data)
        if not inst:
            raise ValueError(f"no videos or images under instance_data={self.instance_data}; put the subject's "
                             "clips or pictures there")
        groups = [(inst, self.instance_prompt, 1.0)]
        if self.prior_preservation:
            cls = list_media(self.class_data)[: self.num_class_samples]
            if len(cls) < self.num_class_samples:
                raise ValueError(f"class_data={self.class_data} holds {len(cls)} of num_class_samples="
                                 f"{self.num_class_samples} videos; train() generates them from init_from, or "
                                 "lower num_class_samples")
            groups.append((cls, self.class_prompt, self.prior_loss_weight))
        _, text = self.build_encoders()
        latents, contexts, masks, weights = [], [], [], []
        for paths, prompt, w in groups:
            lat = self._encode(paths)
            ctx, m = text.encode([prompt])
            latents.append(lat)
            contexts.append(ctx.expand(len(paths), *ctx.shape[1:]))
            masks.append(m.expand(len(paths), *m.shape[1:]))
            weights.append(torch.full((len(paths), *lat.shape[2:]), float(w)))
        latents = torch.cat(latents)
        if len(latents) < self.batch_size:  # a handful of clips: repeat them to fill a batch
            reps = -(-self.batch_size // len(latents))
            latents, contexts, masks, weights = ([t.repeat_interleave(reps, 0) for t in (latents,)][0],
                                                 [c.repeat_interleave(reps, 0) for c in contexts],
                                                 [m.repeat_interleave(reps, 0) for m in masks],
                                                 [w.repeat_interleave(reps, 0) for w in weights])
        n = len(latents)
        self.dataset = _DictDataset({"latents": latents, "context": torch.cat(contexts), "context_mask": torch.cat(masks),
                                     "loss_mask": torch.cat(weights), "fps": torch.full((n,), float(self.fps))})
