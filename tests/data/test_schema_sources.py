"""Sample schema round trip; input discovery for folders (txt/json captions) and webdataset shards."""

import json

import numpy as np
import pytest

from nemo_vfm.data.schema import SampleMeta, decode_parts, encode_sample
from nemo_vfm.data.sources import iter_inputs
from nemo_vfm.data.synthetic_inputs import write_folder, write_shards


def test_schema_round_trip():
    meta = SampleMeta(caption="a red circle", source="x.mp4", fps=8.0, num_frames=4, height=16, width=16,
                      clip_span=(1.0, 1.5), latent_shape=(3, 4, 8, 8), is_image=False, tokenizer="identity",
                      text_encoder="hash")
    lat = np.random.randn(3, 4, 8, 8).astype(np.float32)
    parts = encode_sample(lat, np.ones((5, 4), np.float32), np.array([1, 1, 0, 0, 0], bool), meta, "float32")
    lat2, emb, mask, m = decode_parts(parts)
    np.testing.assert_array_equal(lat, lat2)
    assert mask.tolist() == [True, True, False, False, False] and emb.shape == (5, 4)
    assert SampleMeta.from_dict(m) == meta
    with pytest.raises(ValueError, match="latent_dtype"):
        encode_sample(lat, emb, mask, meta, "int8")


def test_folder_and_shard_inputs(tmp_path):
    write_folder(tmp_path / "f", 6, caption_format="json")
    items = list(iter_inputs(tmp_path / "f"))
    assert len(items) == 6 and all(i.caption for i in items)
    assert sum(i.is_image for i in items) == 2
    frames, fps = items[0].load()
    assert frames.shape == (8, 32, 32, 3) and fps == pytest.approx(8.0)
    assert "shape" in items[0].extra  # json fields besides the caption are kept
    write_shards(tmp_path / "s", 5, per_shard=2)
    items = list(iter_inputs(tmp_path / "s"))
    assert len(items) == 5 and items[0].clip_span == (1.0, 2.0)
    assert items[0].load()[0].shape[0] == 8
    assert json.loads(json.dumps(items[0].extra)) == {"scores": {"motion": 0.5}}
