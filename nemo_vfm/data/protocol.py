"""The data-module interface: what ``train()``, the strategy and the preview/class-sample writers read.

A data module is a ``LightningDataModule`` (loaders, ``state_dict``) that also declares every member of
:class:`VideoDataModule`, with ``None`` (or a method returning ``None``) where a member does not apply.
``train()`` calls :func:`check_data_module` before it builds anything, so a custom module that lacks a member
fails at once with the list of what to add. Every module in ``nemo_vfm.data`` satisfies it
(``MockLatentDataModule``, ``ShapesDataModule``, ``DreamBoothDataModule``, ``EnergonDataModule``).
"""

import inspect
from typing import Protocol, runtime_checkable


@runtime_checkable
class VideoDataModule(Protocol):
    """Members a video data module declares (plain attributes or properties; ``build_encoders`` a method)."""

    @property
    def latent_shape(self) -> tuple[int, int, int, int]:
        """``(C, T, H, W)`` of a latent (the most common one for bucketed data): checked against the model's
        channels and patch size, the size of preview and class samples."""

    @property
    def context_dim(self) -> int | None:
        """Width ``D`` of the text embeddings ``(B, L, D)``; ``None`` when batches carry no text."""

    @property
    def fps(self) -> float | None:
        """Frame rate of the clips (written into previews and generation metadata); ``None`` if unknown."""

    @property
    def batch_size(self) -> int:
        """Samples (bins when packing) per batch on one data-parallel rank; pipeline parallelism splits it into
        micro-batches. ``EnergonDataModule`` takes it as ``micro_batch_size`` (this is an alias)."""

    @property
    def max_seq_length(self) -> int | None:
        """Tokens per packed THD sequence (:class:`~nemo_vfm.data.batch.PackedBatch`); ``None`` for
        ``(B, C, T, H, W)`` batches."""

    @property
    def missing_class_samples(self) -> int:
        """Class videos ``train()`` must draw before training (DreamBooth prior preservation); 0 elsewhere. A
        module returning more than 0 also has ``class_data`` (a folder) and ``class_prompt``."""

    @property
    def tokenizer_spec(self) -> dict | None:
        """``{"name", "kwargs"}`` of the registry tokenizer the latents come from (recorded in checkpoints for
        ``vfm generate``); ``None`` when the module has no encoders: no training previews then."""

    @property
    def text_encoder_spec(self) -> dict | None:
        """``{"name", "kwargs"}`` of the registry text encoder of the captions; ``None`` with no encoders."""

    @property
    def captions(self) -> list[str]:
        """Prompts the training previews sample (filled by ``setup()`` where they come from the data)."""

    def build_encoders(self):
        """``(tokenizer, text_encoder)`` built from the specs (once, then cached), or ``None`` without specs."""


MEMBERS: tuple[str, ...] = tuple(n for n in vars(VideoDataModule) if not n.startswith("_"))


def missing_members(data) -> list[str]:
    """The :class:`VideoDataModule` members ``data`` lacks (read statically: no property is evaluated)."""
    missing = []
    for name in MEMBERS:
        try:
            inspect.getattr_static(data, name)
        except AttributeError:
            missing.append(name)
    return missing


def check_data_module(data) -> None:
    """Raise ``TypeError`` naming every member of :class:`VideoDataModule` that ``data`` lacks."""
    if missing := missing_members(data):
        raise TypeError(f"data module {type(data).__name__} lacks {', '.join(missing)} of the VideoDataModule "
                        "interface (nemo_vfm/data/protocol.py); declare each of them (None where it does not apply)")
