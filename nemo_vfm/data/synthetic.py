"""In-memory data modules for smoke runs, the CPU demo and benchmarks.

- :class:`ShapesDataModule`: moving-shape videos (``synthetic_video.py``) with captions, encoded once
  by a tokenizer and a text encoder, then served in a deterministic, resumable order.
- :class:`MockLatentDataModule`: random latents and text embeddings of a given shape (throughput runs).

Both serve batch dicts ``{latents (B, C, T, H, W), context (B, L, D), context_mask (B, L), fps (B,)}`` and
keep a ``consumed_samples`` counter in the checkpoint, so a resumed run continues with exactly the
samples the uninterrupted run would have seen.
"""

from collections.abc import Iterator

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset, Sampler
from tqdm.auto import tqdm

from nemo_vfm.data.synthetic_video import ShapeClipSpec, make_clip


class ResumableSampler(Sampler[int]):
    """Endless indices: a fresh permutation of ``range(n)`` per epoch (seeded by ``(seed, epoch)``),
    strided over data-parallel ranks, starting after ``start`` already-consumed samples (per rank)."""

    def __init__(self, n: int, seed: int = 0, rank: int = 0, world_size: int = 1, start: int = 0):
        self.n, self.seed, self.rank, self.world_size, self.start = n, seed, rank, world_size, start

    def __iter__(self) -> Iterator[int]:
        i = self.start * self.world_size + self.rank  # global position of this rank's next sample
        while True:
            epoch, pos = divmod(i, self.n)
            perm = torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed * 7919 + epoch))
            yield int(perm[pos])
            i += self.world_size


class _DictDataset(Dataset):
    def __init__(self, tensors: dict[str, torch.Tensor]):
        self.tensors = tensors
        self.n = len(next(iter(tensors.values())))

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {k: v[i] for k, v in self.tensors.items()}


class _ResumableDataModule(L.LightningDataModule):
    """Shared loader logic: a resumable sampler over an in-memory dataset (``nemo_vfm.data.protocol``'s
    ``VideoDataModule``: in-memory batches are never packed, and only DreamBooth draws class samples)."""

    batch_size: int
    seed: int
    num_workers: int = 0
    max_seq_length: int | None = None
    missing_class_samples: int = 0

    def __init__(self):
        super().__init__()
        self._start = 0
        self.dataset: _DictDataset | None = None

    def _rank_world(self) -> tuple[int, int]:
        """Data-parallel rank and size: ranks of one TP/CP/PP group get the same samples."""
        t = self.trainer
        if t is None:
            return 0, 1
        s = t.strategy
        return getattr(s, "data_parallel_rank", t.global_rank), getattr(s, "data_parallel_size", t.world_size)

    def train_dataloader(self):
        rank, world = self._rank_world()
        sampler = ResumableSampler(len(self.dataset), self.seed, rank, world, self._start)
        # pinned host memory: the host-to-device copy is asynchronous and overlaps the previous step
        return DataLoader(self.dataset, batch_size=self.batch_size, sampler=sampler, num_workers=self.num_workers,
                          drop_last=True, persistent_workers=self.num_workers > 0, pin_memory=torch.cuda.is_available())

    def state_dict(self) -> dict:
        t = self.trainer
        consumed = t.global_step * t.accumulate_grad_batches * self.batch_size if t is not None else 0
        return {"consumed_samples_per_rank": consumed}

    def load_state_dict(self, state: dict) -> None:
        self._start = int(state.get("consumed_samples_per_rank", 0))


class _EncodedDataModule(_ResumableDataModule):
    """Pixels encoded by a registry tokenizer and captions by a registry text encoder (``tokenizer_spec``,
    ``text_encoder_spec``: ``{"name", "kwargs"}``), built on first use; ``vfm generate`` rebuilds the same pair."""

    tokenizer_spec: dict
    text_encoder_spec: dict
    num_frames: int
    height: int
    width: int

    def build_encoders(self):
        from nemo_vfm.data.encoders import build_text_encoder, build_tokenizer

        if self.tokenizer is None:
            self.tokenizer = build_tokenizer(self.tokenizer_spec["name"], **self.tokenizer_spec["kwargs"])
            self.text_encoder = build_text_encoder(self.text_encoder_spec["name"], **self.text_encoder_spec["kwargs"])
        return self.tokenizer, self.text_encoder

    @property
    def latent_shape(self) -> tuple[int, int, int, int]:
        tok, _ = self.build_encoders()
        return (tok.latent_channels, *tok.latent_shape(self.num_frames, self.height, self.width))

    @property
    def context_dim(self) -> int:
        return self.build_encoders()[1].dim


class ShapesDataModule(_EncodedDataModule):
    """``num_clips`` moving-shape clips of ``num_frames x height x width`` pixels, tokenized once.

    ``tokenizer``/``text_encoder`` are registry names with ``*_kwargs``; they are also what
    ``vfm generate`` rebuilds to decode samples and encode prompts. ``position_jitter``: where the shapes are in
    the middle of a clip (``ShapeClipSpec``: 0.5 +- jitter of the frame); ``shape_size``: their size as a
    fraction of the frame (``ShapeClipSpec.size``).
    """

    def __init__(self, *, num_clips: int = 256, num_frames: int = 8, height: int = 32, width: int = 32,
                 fps: float = 8.0, batch_size: int = 8, seed: int = 0, tokenizer: str = "identity",
                 tokenizer_kwargs: dict | None = None, text_encoder: str = "hash",
                 text_encoder_kwargs: dict | None = None, num_workers: int = 0, position_jitter: float = 0.3,
                 shape_size: float = 0.35):
        super().__init__()
        self.save_hyperparameters()
        if num_clips < batch_size:
            raise ValueError(f"ShapesDataModule.num_clips ({num_clips}) must be >= batch_size ({batch_size})")
        self.num_clips, self.num_frames, self.height, self.width, self.fps = num_clips, num_frames, height, width, fps
        self.batch_size, self.seed, self.num_workers = batch_size, seed, num_workers
        self.position_jitter, self.shape_size = position_jitter, shape_size
        _ = self.spec  # validates the clip settings now
        self.tokenizer_spec = {"name": tokenizer, "kwargs": dict(tokenizer_kwargs or {})}
        self.text_encoder_spec = {"name": text_encoder, "kwargs": dict(text_encoder_kwargs or {})}
        self.tokenizer = self.text_encoder = None
        self.captions: list[str] = []

    @property
    def spec(self) -> ShapeClipSpec:
        """The generator's settings for these clips."""
        return ShapeClipSpec(num_frames=self.num_frames, height=self.height, width=self.width,
                             position_jitter=self.position_jitter, size=self.shape_size)

    def setup(self, stage: str | None = None):
        if self.dataset is not None:
            return
        from nemo_vfm.io.video import frames_to_tensor

        tok, text = self.build_encoders()
        tok.latent_shape(self.num_frames, self.height, self.width)  # fail early on sizes the tokenizer rejects
        spec = self.spec
        latents, captions = [], []
        with torch.no_grad():
            for i in tqdm(range(self.num_clips), desc="encoding synthetic clips", leave=False):
                clip = make_clip(spec, self.seed, i)
                latents.append(tok.encode(frames_to_tensor(clip.frames)[None])[0])
                captions.append(clip.caption)
        context, mask = text.encode(captions)
        self.captions = captions
        self.dataset = _DictDataset({"latents": torch.stack(latents).float(), "context": context,
                                     "context_mask": mask, "fps": torch.full((self.num_clips,), float(self.fps))})


class MockLatentDataModule(_ResumableDataModule):
    """Random latents ``(C, T, H, W)`` and text embeddings ``(L, D)``: for throughput runs and smoke tests.

    ``match_model=True`` (the CLI's ``data=mock``): ``latent_channels`` / ``context_dim`` left ``None`` take the
    model's when ``train()`` starts (:meth:`take_model_shape`); otherwise ``context_dim=None`` means no text.
    ``audio_shape (Ca, La, M)``: also random audio latents ``audio_latents`` and the audio stream's text
    ``audio_context`` / ``audio_context_mask`` (LTX-2's second stream); ``reference_shape (C, T, H, W)``: random
    ``reference_latents`` (LTX-2 IC-LoRA reference videos)."""

    def __init__(self, *, latent_channels: int | None = 16, num_frames: int = 8, height: int = 32, width: int = 32,
                 context_dim: int | None = 1024, context_length: int = 512, num_classes: int = 0,
                 batch_size: int = 2, num_samples: int = 64, seed: int = 0, fps: float = 24.0, num_workers: int = 0,
                 match_model: bool = False, audio_shape: tuple[int, int, int] | None = None,
                 reference_shape: tuple[int, int, int, int] | None = None, pooled_dim: int | None = None):
        super().__init__()
        if num_workers < 0:
            raise ValueError(f"MockLatentDataModule.num_workers must be >= 0, got {num_workers}")
        if latent_channels is None and not match_model:
            raise ValueError("MockLatentDataModule.latent_channels is None; set it, or match_model=True to take the "
                             "model's")
        self.match_model = match_model
        self.save_hyperparameters()
        self.num_workers = num_workers  # loader processes: batches are collated and pinned off the training loop
        self.shape = (latent_channels, num_frames, height, width)
        self.context_dim, self.context_length, self.num_classes = context_dim, context_length, num_classes
        self.pooled_dim = pooled_dim  # also a pooled text embedding ``pooled_context (Dp,)`` per sample (Kandinsky 6)
        self.batch_size, self.num_samples, self.seed, self.fps = batch_size, num_samples, seed, fps
        self.audio_shape = None if audio_shape is None else tuple(audio_shape)
        self.reference_shape = None if reference_shape is None else tuple(reference_shape)
        if self.audio_shape is not None and (len(self.audio_shape) != 3 or not context_dim):
            raise ValueError("MockLatentDataModule.audio_shape must be (channels, frames, mel bins) and needs "
                             "context_dim (the audio stream's text)")
        self.tokenizer_spec = self.text_encoder_spec = None  # no encoders
        self.captions: list[str] = []

    @property
    def latent_shape(self) -> tuple[int, int, int, int]:
        return self.shape

    def take_model_shape(self, model) -> None:
        """``match_model``: unset latent channels become the model's noise channels (``in_channels`` less its
        conditioning channels), an unset ``context_dim`` (None: no text) and ``pooled_dim`` the model's."""
        if not self.match_model:
            return
        if self.shape[0] is None:
            self.shape = (model.in_channels - getattr(model, "cond_channels", 0), *self.shape[1:])
        if self.context_dim is None:
            self.context_dim = getattr(model, "context_dim", None)
        if self.pooled_dim is None:  # a model that takes a pooled text embedding (Kandinsky 6) gets one
            self.pooled_dim = getattr(model, "pooled_dim", None)

    def build_encoders(self) -> None:
        """None: random latents come from no tokenizer (no previews; ``tokenizer_spec`` is None)."""
        return None

    def setup(self, stage: str | None = None):
        if self.dataset is not None:
            return
        g = torch.Generator().manual_seed(self.seed)
        n = self.num_samples
        t = {"latents": torch.randn(n, *self.shape, generator=g), "fps": torch.full((n,), self.fps)}
        if self.context_dim:
            t["context"] = torch.randn(n, self.context_length, self.context_dim, generator=g)
            t["context_mask"] = torch.ones(n, self.context_length, dtype=torch.bool)
        if self.pooled_dim:
            t["pooled_context"] = torch.randn(n, self.pooled_dim, generator=g)
        if self.num_classes:
            t["class_labels"] = torch.randint(0, self.num_classes, (n,), generator=g)
        if self.audio_shape is not None:
            t["audio_latents"] = torch.randn(n, *self.audio_shape, generator=g)
            t["audio_context"] = torch.randn(n, self.context_length, self.context_dim, generator=g)
            t["audio_context_mask"] = torch.ones(n, self.context_length, dtype=torch.bool)
        if self.reference_shape is not None:
            t["reference_latents"] = torch.randn(n, *self.reference_shape, generator=g)
        self.dataset = _DictDataset(t)
