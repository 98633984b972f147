"""Data recipes: Energon datasets (one folder or a weighted blend), packing, and ``vfm prepare`` as a recipe.

Python::

    from nemo_vfm_recipes import data, dit
    recipe = dit.pretrain_xl()
    recipe.data = data.energon_datamodule(path="/data/webvid_prepared", max_seq_length=8192, pad_to_multiple=8)
    recipe.data = data.energon_blend([("/data/videos", 3.0), ("/data/images", 1.0)], max_seq_length=8192)

CLI (``launchers/train.py`` imports this module): ``data=energon`` / ``data=energon_packed`` / ``data=mock`` are
registered for ``train``'s ``data`` argument; nemo-run resolves them once that argument carries a type annotation.
``data=mock`` (random latents and text states of a given size) times a recipe without prepared data::

    python launchers/train.py --factory lora_wan_1_3b --yes model.pretrained=None data=mock \
        data.num_frames=21 data.height=60 data.width=104 trainer.max_steps=20
"""

from __future__ import annotations

import nemo_run as run
from lightning import LightningDataModule

from nemo_vfm.data.energon_datamodule import EnergonDataModule
from nemo_vfm.data.prepare import PrepareConfig, prepare
from nemo_vfm.data.synthetic import MockLatentDataModule
from nemo_vfm.train import train


def energon_datamodule(path: str = "data/prepared", *, micro_batch_size: int = 1, patch_size=(1, 2, 2),
                       max_seq_length: int | None = None, pad_to_multiple: int = 1, packing_buffer_size: int = 64,
                       num_workers: int = 2, shuffle_buffer_size: int | None = 100,
                       max_samples_per_sequence: int | None = 100, seed: int = 0) -> run.Config[EnergonDataModule]:
    """A prepared dataset folder (``vfm prepare`` output) or a metadataset yaml. ``max_seq_length`` set = packed
    THD batches of ``micro_batch_size`` bins; unset = resolution/length buckets of ``micro_batch_size`` samples."""
    return run.Config(EnergonDataModule, path=path, micro_batch_size=micro_batch_size, patch_size=tuple(patch_size),
                      max_seq_length=max_seq_length, pad_to_multiple=pad_to_multiple,
                      packing_buffer_size=packing_buffer_size, num_workers=num_workers,
                      shuffle_buffer_size=shuffle_buffer_size, max_samples_per_sequence=max_samples_per_sequence,
                      seed=seed)


def energon_blend(datasets: list[tuple[str, float]], **kwargs) -> run.Config[EnergonDataModule]:
    """Several prepared folders sampled with relative weights, e.g. ``[("videos", 3.0), ("images", 1.0)]``
    (the metadataset yaml is written when the data module is built, not here)."""
    cfg = energon_datamodule(**kwargs)
    cfg.path = None
    cfg.blend = [[str(p), float(w)] for p, w in datasets]
    return cfg


def packed(cfg: run.Config[EnergonDataModule], max_seq_length: int = 8192, pad_to_multiple: int = 8,
           micro_batch_size: int = 1) -> run.Config[EnergonDataModule]:
    """Switch an Energon data config to sequence packing (mixed images/videos/resolutions per micro-batch)."""
    cfg.max_seq_length, cfg.pad_to_multiple, cfg.micro_batch_size = max_seq_length, pad_to_multiple, micro_batch_size
    return cfg


@run.cli.factory(target=LightningDataModule, name="energon")  # found when overriding a --factory recipe
@run.cli.factory(target=train, target_arg="data", name="energon")
def energon() -> run.Config[EnergonDataModule]:
    """CLI ``data=energon data.path=DIR``: bucketed batches from a prepared folder."""
    return energon_datamodule()


@run.cli.factory(target=LightningDataModule, name="energon_packed")
@run.cli.factory(target=train, target_arg="data", name="energon_packed")
def energon_packed() -> run.Config[EnergonDataModule]:
    """CLI ``data=energon_packed data.path=DIR data.max_seq_length=N``: packed THD batches."""
    return packed(energon_datamodule())


@run.cli.factory(target=LightningDataModule, name="mock")
@run.cli.factory(target=train, target_arg="data", name="mock")
def mock() -> run.Config[MockLatentDataModule]:
    """CLI ``data=mock``: random latents ``(latent_channels, num_frames, height, width)`` and text states
    ``(context_length, context_dim)``, batch 1, for throughput and memory runs; ``latent_channels`` and
    ``context_dim`` left unset take the model's (``train()`` fills them in)."""
    return run.Config(MockLatentDataModule, latent_channels=None, num_frames=21, height=60, width=104,
                      context_dim=None, context_length=512, batch_size=1, num_samples=4, num_workers=0,
                      match_model=True)


def prepare_recipe(input: str, output: str, *, tokenizer: str = "identity", tokenizer_kwargs: dict | None = None,
                   text_encoder: str = "hash", text_encoder_kwargs: dict | None = None,
                   samples_per_shard: int = 64, **kwargs) -> run.Partial:
    """``vfm prepare`` as a NeMo-Run task (e.g. ``run.run(prepare_recipe(...), executor=slurm_executor)``;
    under a torchrun launcher the inputs are split over ranks)."""
    return run.Partial(prepare, cfg=run.Config(PrepareConfig, input=input, output=output, tokenizer=tokenizer,
                                                  tokenizer_kwargs=dict(tokenizer_kwargs or {}),
                                                  text_encoder=text_encoder,
                                                  text_encoder_kwargs=dict(text_encoder_kwargs or {}),
                                                  samples_per_shard=samples_per_shard, **kwargs))
