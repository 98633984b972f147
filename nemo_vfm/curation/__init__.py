"""Video curation: raw videos in, captioned clips in Energon-ready webdataset shards out.

    >>> from nemo_vfm.curation import curate, CurationConfig, make_raw_dataset
    >>> make_raw_dataset("raw/", num_videos=4, height=180, width=320, bad_files=True)
    >>> result = curate("raw/", "curated/", CurationConfig(engine="local"))
    >>> result.shards_dir   # curated/shards: shard-*.tar (mp4 + json) with .nv-meta/

Stages (:mod:`~.probe`, :mod:`~.split`, :mod:`~.transcode`, :mod:`~.filters`, :mod:`~.embed`,
:mod:`~.caption`, :mod:`~.writer`) run on worker pools that :mod:`~.engine` sizes from measured
costs (:mod:`~.balancer`), on Ray or in-process threads (:mod:`~.backends`); :mod:`~.ledger` makes
runs resumable and :mod:`~.shards` packs the output. Nothing heavy is imported until used.
"""

import importlib

_EXPORTS = {
    "curate": "pipeline", "CurationResult": "pipeline", "build_stages": "pipeline",
    "CurationConfig": "config", "apply_overrides": "config",
    "Engine": "engine", "PipelineReport": "engine", "Stage": "stage", "SleepStage": "stage",
    "ClipTask": "task", "make_raw_dataset": "synthetic", "write_raw_video": "synthetic",
    "RawVideoSpec": "synthetic", "allocate_workers": "balancer", "report_table": "report",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
