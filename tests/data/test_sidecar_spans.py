"""A caption sidecar's clip span must be finite with 0 <= start <= end; a bad one skips that input with a reason
naming the file and the span, instead of storing ``[nan, nan]`` (issue 29, item 7)."""

import io
import json
import tarfile

import pytest
from PIL import Image

from nemo_vfm.data.sources import iter_inputs


def _png() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 10, 10)).save(buf, format="PNG")
    return buf.getvalue()


BAD = [({"caption": "a", "span": [3.0, 1.0]}, "span [3.0, 1.0]"),
       ({"caption": "a", "span": {"start_s": float("nan"), "end_s": float("nan")}}, "span [nan, nan]"),
       ({"caption": "a", "start_s": 1.0, "end_s": float("inf")}, "span [1.0, inf]")]


@pytest.mark.parametrize("meta,span", BAD)
def test_bad_span_in_a_folder_sidecar_names_the_file_and_the_span(tmp_path, meta, span):
    (tmp_path / "clip.png").write_bytes(_png())
    (tmp_path / "clip.json").write_text(json.dumps(meta))  # json writes NaN / Infinity, as a careless tool would
    (tmp_path / "ok.png").write_bytes(_png())
    (tmp_path / "ok.json").write_text(json.dumps({"caption": "b", "span": [1.0, 2.5]}))
    bad, ok = list(iter_inputs(tmp_path))
    assert bad.error.startswith(f"malformed caption sidecar clip.json: {span} is not a (start_s, end_s)")
    with pytest.raises(ValueError, match="clip.json"):
        bad.load()
    assert ok.error is None and ok.clip_span == (1.0, 2.5)


def test_bad_span_in_a_shard_names_the_sample_and_the_span(tmp_path):
    shard = tmp_path / "shard-000.tar"
    with tarfile.open(shard, "w") as tf:
        for name, data in (("k1.png", _png()), ("k1.json", json.dumps(BAD[0][0]).encode())):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    (item,) = iter_inputs(shard)
    assert item.error.startswith("bad span in the json part of shard-000.tar:k1: span [3.0, 1.0]")
