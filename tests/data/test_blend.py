"""Weighted blends through an Energon metadataset: 3:1 weights give about 3:1 samples."""

from collections import Counter

import pytest

from nemo_vfm.data.blend import write_blend
from nemo_vfm.data.energon_datamodule import EnergonDataModule


def test_blend_3_to_1(prepared, prepared_b, tmp_path):
    yaml = write_blend(tmp_path / "mix.yaml", [(prepared, 3.0), (prepared_b, 1.0)])
    dm = EnergonDataModule(str(yaml), micro_batch_size=1, shuffle_buffer_size=None)
    it = iter(dm.train_dataloader())
    counts = Counter()
    for _ in range(800):
        ds = next(it).meta[0]["dataset"]
        counts["b" if ds.rstrip("/").endswith(prepared_b.name) else "a"] += 1
    ratio = counts["a"] / counts["b"]
    assert 2.5 < ratio < 3.6, counts


def test_blend_validates(tmp_path, prepared):
    with pytest.raises(FileNotFoundError, match="not a prepared dataset"):
        write_blend(tmp_path / "m.yaml", [(tmp_path, 1.0)])
    with pytest.raises(ValueError, match="weight"):
        write_blend(tmp_path / "m.yaml", [(prepared, 0.0)])
    dm = EnergonDataModule(blend=[(prepared, 1.0)], micro_batch_size=1)
    assert dm.path.endswith(".yaml")
