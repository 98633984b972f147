"""Lightning DataModule over prepared Energon datasets (or blends), resumable to the exact sample.

* Data is split by data-parallel rank only (``rank_mapping``): TP/CP/PP peers get the same batches.
* ``state_dict()`` holds the Energon loader state of every DP rank at the last batch the training
  loop actually consumed (Lightning prefetches ahead, so the loader's own position would skip
  batches); ``load_state_dict()`` restores it, and the resumed run sees exactly the samples the
  uninterrupted run would have seen.
* With ``max_seq_length`` set, batches are packed THD :class:`~nemo_vfm.data.batch.PackedBatch`;
  without, bucketed :class:`~nemo_vfm.data.batch.VideoBatch` (with ``cond_latents`` when the data was prepared
  with ``image_condition=wan_i2v``). ``setup()`` checks that a model declaring it takes such data (its config's ``image_conditions``) gets it.
"""

import json
import logging
import math
import pickle
from collections import deque
from pathlib import Path

import lightning.pytorch as pl
import torch

from nemo_vfm.data.batch import PackedBatch
from nemo_vfm.data.dataset_trust import check_dataset

log = logging.getLogger(__name__)
STATE_FORMAT = "nemo_vfm.energon/1"


class StatefulLoader:
    """Iterates an Energon savable loader and remembers its state after every batch it yields.

    :meth:`mark_consumed` (called when the training loop takes a batch) advances the consumed state,
    so a checkpoint names the position after the last *trained* batch, whatever was prefetched.
    """

    def __init__(self, loader, log_every_n_batches: int = 100):
        self.loader = loader
        self.pending: deque = deque()
        self.consumed_state = None
        self.log_every = log_every_n_batches
        self.real_tokens = self.capacity = self.batches = 0

    def __iter__(self):
        for batch in self.loader:
            self.pending.append(self.loader.save_state_rank())
            yield batch

    def mark_consumed(self, batch) -> None:
        if self.pending:
            self.consumed_state = self.pending.popleft()
        self.batches += 1
        if isinstance(batch, PackedBatch):
            self.real_tokens += batch.num_real_tokens
            self.capacity += batch.capacity
            if self.log_every and self.batches % self.log_every == 0:
                log.info("packing efficiency %.3f over %d batches", self.packing_efficiency, self.batches)

    @property
    def packing_efficiency(self) -> float:
        """Real tokens over bin capacity, over all consumed packed batches (0 when not packing)."""
        return self.real_tokens / self.capacity if self.capacity else 0.0


def _blend_file(blend) -> Path:
    import hashlib
    import tempfile

    from nemo_vfm.data.blend import write_blend

    pairs = [(str(Path(p).resolve()), float(w)) for p, w in blend]
    digest = hashlib.sha1(json.dumps(pairs).encode()).hexdigest()[:12]
    return write_blend(Path(tempfile.gettempdir()) / "nemo_vfm_blends" / f"blend-{digest}.yaml", pairs)


def dataset_folders(path: str | Path) -> list[Path]:
    """The prepared dataset folders behind ``path`` (itself, or every entry of a blend yaml)."""
    import yaml

    p = Path(path)
    if p.suffix not in (".yaml", ".yml"):
        return [p]
    doc = yaml.safe_load(p.read_text())
    entries = (doc.get("splits", {}).get("train", {}) or {}).get("blend", [])
    return [(p.parent / e["path"]).resolve() for e in entries if "path" in e]


def peek(path: str | Path, n: int = 16) -> list[dict]:
    """Metadata of the first ``n`` samples of the first shard (plus ``text_dim``), read straight from the tar."""
    import io
    import json
    import tarfile

    import numpy as np

    from nemo_vfm.data.schema import META, TEXT_EMB

    folder = dataset_folders(path)[0]
    shards = sorted(folder.glob("*.tar"))
    if not shards:
        raise FileNotFoundError(f"no *.tar shards in {folder}")
    out: dict[str, dict] = {}
    with tarfile.open(shards[0]) as tf:
        for m in tf:
            key, _, part = m.name.rpartition("/")[2].partition(".")
            if part == META:
                out.setdefault(key, {}).update(json.loads(tf.extractfile(m).read()))
            elif part == TEXT_EMB:
                out.setdefault(key, {})["text_dim"] = int(np.load(io.BytesIO(tf.extractfile(m).read())).shape[1])
            if len(out) > n:
                break
    return [v for v in out.values() if "latent_shape" in v][:n]


class EnergonDataModule(pl.LightningDataModule):
    """Training batches from a prepared dataset folder or a blend (metadataset ``.yaml``).

    Args:
        path: a folder written by ``vfm prepare`` or a metadataset yaml (see :func:`write_blend`).
        blend: instead of ``path``: ``[(folder, weight), ...]``, written to a metadataset yaml here.
        micro_batch_size: bins per micro-batch (packing) or samples per bucket batch.
        patch_size: the DiT patch ``(pt, ph, pw)``.
        max_seq_length: bin capacity in tokens; ``None`` = no packing, resolution/length buckets.
        pad_to_multiple: pad each sample's tokens to this multiple; when training under the strategy's
            mesh it is raised to a multiple of cp*tp(sp), so that every packed sequence splits evenly
            (:meth:`fit_layout`).
        packing_buffer_size: samples first-fit-decreasing sees at once.
        num_workers: loader worker processes per rank (0 = in the main process).
        shuffle_buffer_size / max_samples_per_sequence: Energon shuffling knobs.
        seed: shuffling seed (Energon ``seed_offset``).
        mesh / dp_dims: the device mesh and its data-parallel dims; default: the trainer strategy's mesh.
        allow_dataset_code: load datasets whose yaml names code outside megatron.energon's and nemo_vfm's sample,
            dataset and metadataset types (:mod:`nemo_vfm.data.dataset_trust`); only for datasets you trust.
    """

    def __init__(self, path: str | None = None, *, blend: list | None = None, micro_batch_size: int = 1, patch_size=(1, 2, 2),
                 max_seq_length: int | None = None, pad_to_multiple: int = 1, packing_buffer_size: int = 64,
                 num_workers: int = 0, shuffle_buffer_size: int | None = 64,
                 max_samples_per_sequence: int | None = None, seed: int = 0, mesh=None,
                 dp_dims: tuple[str, ...] | None = None, log_every_n_batches: int = 100,
                 allow_dataset_code: bool = False):
        super().__init__()
        if (path is None) == (blend is None):
            raise ValueError("EnergonDataModule needs exactly one of path= (a prepared folder or blend yaml) or "
                             "blend=[(folder, weight), ...]")
        if blend is not None:
            path = str(_blend_file(blend))
        p = Path(path)
        if not (p.is_file() and p.suffix in (".yaml", ".yml")) and not (p / ".nv-meta" / "dataset.yaml").is_file():
            raise FileNotFoundError(f"{path} is neither a prepared dataset (no .nv-meta/dataset.yaml) nor a blend yaml; "
                                    "run `vfm prepare input=... output=...` first")
        if micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
        if num_workers < 0:
            raise ValueError(f"num_workers must be >= 0, got {num_workers}")
        if max_seq_length is not None and packing_buffer_size < 1:
            raise ValueError(f"packing_buffer_size must be >= 1 when packing, got {packing_buffer_size}")
        self.path, self.micro_batch_size, self.patch_size = str(path), micro_batch_size, tuple(patch_size)
        self.max_seq_length, self.pad_to_multiple = max_seq_length, pad_to_multiple
        self.packing_buffer_size, self.num_workers = packing_buffer_size, num_workers
        self.shuffle_buffer_size, self.max_samples_per_sequence = shuffle_buffer_size, max_samples_per_sequence
        self.seed, self.mesh, self.dp_dims, self.log_every_n_batches = seed, mesh, dp_dims, log_every_n_batches
        self.allow_dataset_code = allow_dataset_code
        check_dataset(path, allow_code=allow_dataset_code)  # before anything reads it; again before Energon does
        from nemo_vfm.data.task_encoder import VideoTaskEncoder  # validates the packing arguments early

        self.task_encoder = VideoTaskEncoder(patch_size=self.patch_size, max_seq_length=max_seq_length,
                                             pad_to_multiple=pad_to_multiple, micro_batch_size=micro_batch_size)
        self._loader: StatefulLoader | None = None
        self._restore: dict | None = None
        self.save_hyperparameters(ignore=["mesh"])
        self._peek = peek(path)
        if not self._peek:
            raise ValueError(f"{path}: the first shard holds no readable samples; re-run `vfm prepare`")
        spec_file = dataset_folders(path)[0] / ".prepare" / "config.json"
        spec = json.loads(spec_file.read_text()) if spec_file.is_file() else {}
        self.tokenizer_spec = spec.get("tokenizer", {"name": self._peek[0].get("tokenizer"), "kwargs": {}})
        self.text_encoder_spec = spec.get("text_encoder", {"name": self._peek[0].get("text_encoder"), "kwargs": {}})
        self.clip_pooled = spec.get("clip_pooled")  # the CLIP folder of pooled_context (vfm prepare clip_pooled=)
        self._encoders = None
        if self.image_condition is not None and max_seq_length is not None:
            raise ValueError(f"{path} was prepared with image_condition={self.image_condition}, which packed "
                             "batches do not carry; set max_seq_length=None (bucketed batches)")
        if self.reference_downscale is not None and max_seq_length is not None:
            raise ValueError(f"{path} was prepared with reference_dir= (IC-LoRA reference latents), which packed "
                             "batches do not carry; set max_seq_length=None (bucketed batches)")
        if spec.get("clip_pooled") and max_seq_length is not None:
            raise ValueError(f"{path} was prepared with clip_pooled= (pooled text embeddings), which packed batches "
                             "do not carry; set max_seq_length=None (bucketed batches)")

    @property
    def image_condition(self) -> str | None:
        """``"wan_i2v"`` when batches carry ``cond_latents`` (``vfm prepare image_condition=wan_i2v``), else None."""
        return self._peek[0].get("image_condition")

    @property
    def reference_downscale(self) -> int | None:
        """``k`` when batches carry IC-LoRA ``reference_latents`` at 1/k of the target's size (``vfm prepare
        reference_dir=DIR reference_downscale=k``), else None. Read from the first samples' meta."""
        found = {int(m["reference"]["downscale"]) for m in self._peek if m.get("reference")}
        if len(found) > 1:
            raise ValueError(f"{self.path} mixes reference_downscale values {sorted(found)}; prepare it again with one")
        if found and any(not m.get("reference") for m in self._peek):
            raise ValueError(f"{self.path} mixes samples with and without IC-LoRA reference latents; prepare every "
                             "dataset of the blend with vfm prepare reference_dir=")
        return next(iter(found), None)

    def setup(self, stage: str | None = None) -> None:
        """Before the model is built: the trainer's model must take the image conditioning this data has, or lacks,
        and the reference downscale of its IC-LoRA references."""
        module = getattr(getattr(self, "trainer", None), "lightning_module", None)
        check_image_condition(getattr(module, "model_config", None), self.image_condition, self.path)
        check_reference_downscale(getattr(module, "model_config", None), self.reference_downscale, self.path)

    # ---- what train() reads (nemo_vfm.data.protocol.VideoDataModule) ------------------------------------
    missing_class_samples = 0  # no DreamBooth class samples

    @property
    def batch_size(self) -> int:
        """Alias of ``micro_batch_size`` (the constructor argument and the recipes' override)."""
        return self.micro_batch_size

    @property
    def context_dim(self) -> int:
        return self._peek[0]["text_dim"]

    @property
    def latent_shape(self) -> tuple[int, int, int, int]:
        """The most common latent shape among the first samples (used for preview samples)."""
        shapes = [tuple(m["latent_shape"]) for m in self._peek]
        return max(set(shapes), key=shapes.count)

    @property
    def captions(self) -> list[str]:
        return [m["caption"] for m in self._peek]

    @property
    def fps(self) -> float | None:
        return next((m["fps"] for m in self._peek if m.get("fps")), None)

    def build_encoders(self):
        from nemo_vfm.data.encoders import build_text_encoder, build_tokenizer

        if self._encoders is None:
            self._encoders = (build_tokenizer(self.tokenizer_spec["name"], **self.tokenizer_spec.get("kwargs", {})),
                              build_text_encoder(self.text_encoder_spec["name"], **self.text_encoder_spec.get("kwargs", {})))
        return self._encoders

    # ---- rank mapping -----------------------------------------------------------------------------------
    def _mesh(self):
        if self.mesh is not None:
            return self.mesh
        trainer = self._trainer if hasattr(self, "_trainer") else None
        strategy = getattr(trainer, "strategy", None)
        for attr in ("parallel_mesh", "device_mesh", "mesh"):
            try:
                mesh = getattr(strategy, attr, None)
            except (AttributeError, RuntimeError):  # Lightning raises before its mesh exists
                mesh = None
            if mesh is not None and (hasattr(mesh, "subs") or getattr(mesh, "mesh_dim_names", None)):
                return mesh
        return None

    def worker_config(self):
        from nemo_vfm.data.rank_mapping import worker_config

        return worker_config(self.num_workers, self.seed, self._mesh(), self.dp_dims)

    def fit_layout(self, token_split: int) -> None:
        """Make packed sequences divide into ``token_split`` = cp*tp(sp) slices: ``pad_to_multiple`` becomes
        its least common multiple with ``token_split`` (logged); no-op without packing."""
        if self.max_seq_length is None or self.pad_to_multiple % token_split == 0:
            return
        m = math.lcm(self.pad_to_multiple, token_split)
        if self.max_seq_length % m:
            raise ValueError(f"packed sequences must divide into cp*tp(sp) = {token_split} slices, so samples are "
                             f"padded to a multiple of {m} (lcm with pad_to_multiple={self.pad_to_multiple}), but "
                             f"max_seq_length={self.max_seq_length} is not a multiple of {m}; set "
                             f"data.max_seq_length={self.max_seq_length // m * m or m}.")
        log.info("pad_to_multiple %d -> %d so that packed sequences split over cp*tp(sp) = %d ranks",
                 self.pad_to_multiple, m, token_split)
        self.pad_to_multiple = self.task_encoder.pad_to_multiple = m

    def _token_split(self) -> int:
        dims = getattr(self._mesh(), "dims", None)  # a ParallelMesh carries its ParallelDims
        return dims.token_split if dims is not None else 1

    # ---- loaders ----------------------------------------------------------------------------------------
    def build_loader(self):
        """A fresh Energon savable loader for this rank (restored if a checkpoint state is pending)."""
        from megatron.energon import get_savable_loader, get_train_dataset

        self.fit_layout(self._token_split())
        wc = self.worker_config()
        check_dataset(self.path, allow_code=self.allow_dataset_code)
        ds = get_train_dataset(
            self.path, worker_config=wc, batch_size=self.micro_batch_size,
            packing_buffer_size=self.packing_buffer_size if self.max_seq_length else None,
            shuffle_buffer_size=self.shuffle_buffer_size, max_samples_per_sequence=self.max_samples_per_sequence,
            task_encoder=self.task_encoder,
        )
        loader = get_savable_loader(ds)
        if self._restore is not None:
            if self._restore["dp_world_size"] != wc.world_size:
                raise ValueError(f"the checkpoint's data state was saved with {self._restore['dp_world_size']} "
                                 f"data-parallel ranks but this run has {wc.world_size}; resume with the same DP size")
            loader.restore_state_rank(_loads_state(self._restore["states"][wc.rank]))
        return loader, wc

    def train_dataloader(self) -> StatefulLoader:
        loader, _ = self.build_loader()
        self._loader = StatefulLoader(loader, self.log_every_n_batches)
        if self._restore is not None:  # a checkpoint taken before the next batch names the same position
            self._loader.consumed_state = _loads_state(self._restore["states"][self._dp_rank_world()[0]])
            self._restore = None
        return self._loader

    def on_before_batch_transfer(self, batch, dataloader_idx: int):
        trainer = self._trainer if hasattr(self, "_trainer") else None
        if self._loader is not None and (trainer is None or trainer.training):
            self._loader.mark_consumed(batch)
        return batch

    def transfer_batch_to_device(self, batch, device, dataloader_idx: int):
        return batch.to(device) if hasattr(batch, "to") else super().transfer_batch_to_device(batch, device, dataloader_idx)

    @property
    def packing_efficiency(self) -> float:
        return self._loader.packing_efficiency if self._loader is not None else 0.0

    # ---- checkpointing ----------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Loader state of every data-parallel rank (pickled Energon state; restored with a restricted unpickler
        that builds only Energon's plain data classes)."""
        if self._loader is None:
            return dict(self._restore) if self._restore is not None else {}
        rank, world = self._dp_rank_world()
        mine = pickle.dumps(self._loader.consumed_state)
        if torch.distributed.is_available() and torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
            gathered: list = [None] * torch.distributed.get_world_size()
            torch.distributed.all_gather_object(gathered, (rank, mine))
        else:
            gathered = [(rank, mine)]
        states: list = [None] * world
        for r, s in gathered:
            states[r] = s
        return {"format": STATE_FORMAT, "dp_world_size": world, "states": states}

    def load_state_dict(self, state_dict: dict) -> None:
        if not state_dict:
            return
        if state_dict.get("format") != STATE_FORMAT:
            raise ValueError(f"unknown data state format {state_dict.get('format')!r}; expected {STATE_FORMAT!r}")
        self._restore = dict(state_dict)

    def _dp_rank_world(self) -> tuple[int, int]:
        from nemo_vfm.data.rank_mapping import dp_rank_world

        r, w, _ = dp_rank_world(self._mesh(), self.dp_dims)
        return r, w


def check_image_condition(model_config, image_condition: str | None, path: str) -> None:
    """Raise when the model and the data disagree on image conditioning: the model's config declares the ``vfm prepare
    image_condition=`` values it trains on (``image_conditions``; a config without it takes none: ``(None,)``), and
    ``image_condition`` is what ``path`` was prepared with (None: no ``cond_latents``). A config accepting both
    (Wan 2.1 I2V: ``vfm prepare`` does not store its CLIP image tokens, so its model asks at the first step) is not
    checked here."""
    if model_config is None:
        return
    accepts = tuple(getattr(model_config, "image_conditions", (None,)))
    if image_condition in accepts:
        return
    model = type(model_config).__name__
    if image_condition is None:
        wanted = next(c for c in accepts if c is not None)
        raise ValueError(f"the model ({model}) takes image conditioning (cond_latents, image_condition={wanted}) but "
                         f"{path} was prepared without image conditioning; prepare the clips again with `vfm prepare "
                         f"... image_condition={wanted}` (same tokenizer and text encoder) and point data.path at "
                         "that output")
    raise ValueError(f"{path} was prepared with image_condition={image_condition} (batches carry its cond_latents) "
                     f"but the model ({model}) takes no cond_latents; train an image-to-video model that takes them "
                     "(e.g. lora_wan2_2_i2v_a14b) or prepare without image_condition")


def check_reference_downscale(model_config, reference_downscale: int | None, path: str) -> None:
    """Raise when ``path`` was prepared with IC-LoRA references (at ``1 / reference_downscale`` of the target's size)
    and the model takes none, or places them at another downscale (``model_config.reference_downscale``)."""
    if model_config is None or reference_downscale is None:
        return
    model = type(model_config).__name__
    k = getattr(model_config, "reference_downscale", None)
    if k is None:
        raise ValueError(f"{path} was prepared with reference_dir= (IC-LoRA reference_latents at reference_downscale="
                         f"{reference_downscale}) but the model ({model}) takes no reference_latents; train "
                         "lora_ltx2_ic or prepare without reference_dir")
    if int(k) != reference_downscale:
        raise ValueError(f"{path} was prepared with reference_downscale={reference_downscale} but "
                         f"model.reference_downscale={k}; set model.reference_downscale={reference_downscale} or "
                         f"prepare the data again with reference_downscale={k}")


def _loads_state(data: bytes):
    from nemo_vfm.io.safe_load import restricted_loads

    return restricted_loads(data, ("megatron.energon",), "the data loader state in the checkpoint")

