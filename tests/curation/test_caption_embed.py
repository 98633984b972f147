"""Captions from sidecars (by time overlap), templates, and the VLM option's errors; embeddings."""

from __future__ import annotations

import json

import numpy as np
import pytest

from nemo_vfm.curation.caption import CaptionStage, pick_caption, read_sidecar
from nemo_vfm.curation.config import CurationConfig
from nemo_vfm.curation.embed import EmbedStage
from nemo_vfm.curation.stage import run_stage
from nemo_vfm.curation.task import ClipTask


def _clip(path, start, end):
    return ClipTask(source=str(path), rel=path.name, clip_index=1, span={"start_s": start, "end_s": end},
                    out={"duration_s": end - start, "width": 64, "height": 48, "fps": 24.0})


def test_sidecar_caption_by_overlap(tmp_path):
    video = tmp_path / "v.mp4"
    (tmp_path / "v.json").write_text(json.dumps({"captions": [{"start": 0, "end": 2, "text": "first"},
                                                              {"start": 2, "end": 5, "text": "second"}]}))
    assert read_sidecar(str(video))[1]["text"] == "second"
    stage = CaptionStage(mode="sidecar")
    assert stage.process(_clip(video, 1.5, 4.0))[0].caption == "second"
    assert stage.process(_clip(video, 0.0, 1.9))[0].caption == "first"
    assert stage.process(_clip(video, 6.0, 7.0))[0].reason.startswith("no_caption")
    assert pick_caption([{"start": 0, "end": 1, "text": "a"}], 2, 3) is None


def test_txt_sidecar_template_and_auto(tmp_path):
    (tmp_path / "a.txt").write_text("a cat\n")
    assert CaptionStage(mode="auto").process(_clip(tmp_path / "a.mp4", 0, 1))[0].caption == "a cat"
    auto = CaptionStage(mode="auto", template="{source_name} #{clip_index} {duration_s:.1f}s {width}x{height}")
    assert auto.process(_clip(tmp_path / "b.mp4", 0, 1.5))[0].caption == "b #1 1.5s 64x48"


def test_vlm_needs_a_local_model(tmp_path):
    with pytest.raises(ValueError, match="vlm_model"):
        CurationConfig(caption="vlm")
    stage = CaptionStage(mode="vlm", vlm_model=str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError, match="not a local folder"):
        stage.setup()


def test_thumb_embedding_and_plugin():
    thumbs = np.random.default_rng(0).integers(0, 255, (4, 16, 24, 3), np.uint8)
    task = ClipTask(source="x", rel="x", clip_index=0, thumbs=thumbs)
    (out,), _ = run_stage(EmbedStage(kind="thumb"), task)
    assert len(out.embedding) == 64 and abs(np.linalg.norm(out.embedding) - 1) < 1e-3
    (bad,), _ = run_stage(EmbedStage(kind="no.such.module:fn"), ClipTask(source="x", rel="x", thumbs=thumbs))
    assert bad.status == "error" and "cannot import" in bad.reason


def _tiny_blip(folder):
    """A randomly initialised, tiny BLIP captioner saved like a downloaded model (no network)."""
    tr = pytest.importorskip("transformers")
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[DEC]", "a", "photo", "of", "red", "circle", "moving"]
    (folder / "vocab.txt").write_text("\n".join(words) + "\n")
    processor = tr.BlipProcessor(image_processor=tr.BlipImageProcessor(size={"height": 32, "width": 32}),
                                 tokenizer=tr.BertTokenizer(str(folder / "vocab.txt"), bos_token="[DEC]"))
    tiny = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)
    config = tr.BlipConfig(vision_config=dict(tiny, image_size=32, patch_size=16), projection_dim=32,
                           text_config=dict(tiny, vocab_size=len(words), max_position_embeddings=32, bos_token_id=5,
                                            sep_token_id=3, pad_token_id=0))
    tr.BlipForConditionalGeneration(config).save_pretrained(folder)
    processor.save_pretrained(folder)
    return words


def test_vlm_captions_with_a_local_model(tmp_path):
    from nemo_vfm.curation.transcode import encode_mp4
    from nemo_vfm.data.synthetic_video import ShapeClipSpec, render_shape_clip

    words = _tiny_blip(tmp_path)
    frames = render_shape_clip(ShapeClipSpec(num_frames=8, height=32, width=48), "circle", "red", "gray", "left")
    task = ClipTask(source="x", rel="x", clip_index=0, span={"start_s": 0.0, "end_s": 1.0}, mp4=encode_mp4(frames, 8.0))
    stage = CaptionStage(mode="vlm", vlm_model=str(tmp_path), vlm_prompt="a photo of", max_new_tokens=4)
    stage.setup()
    (out,), _ = run_stage(stage, task)
    assert out.status == "ok", out.reason
    assert isinstance(out.caption, str) and set(out.caption.split()) <= set(words)  # random weights: random words


def test_frames_embedding_calibration_for_dedup():
    """Re-encoded or slightly trimmed copies score >= the default dedup threshold; other clips do not."""
    import io

    import av

    from nemo_vfm.curation.config import CurationConfig
    from nemo_vfm.curation.embed import frames_embedding
    from nemo_vfm.curation.transcode import encode_mp4, thumbnails
    from nemo_vfm.data.synthetic_video import ShapeClipSpec, render_shape_clip

    def clip(shape="circle", motion="right", start=(0.3, 0.5), n=26):
        spec = ShapeClipSpec(num_frames=n, height=96, width=128, speed=0.04, size=0.4)
        return render_shape_clip(spec, shape, "yellow", "gray", motion, start)

    def emb(frames):
        return frames_embedding(thumbnails(frames, 48))

    base = clip()[1:25]
    with av.open(io.BytesIO(encode_mp4(base, 24.0, crf=30))) as c:
        reencoded = np.stack([f.to_ndarray(format="rgb24") for f in c.decode(video=0)])
    thr = CurationConfig().dedup_threshold
    near = {"reencoded": emb(reencoded), "trimmed": emb(clip()[:24]), "same": emb(clip()[1:25])}
    far = {"other_way": emb(clip(motion="left")[1:25]), "other_shape": emb(clip("square", "down")[1:25]),
           "shifted": emb(clip(start=(0.45, 0.5))[1:25])}
    e = emb(base)
    assert all(float(e @ v) >= thr for v in near.values()), {k: float(e @ v) for k, v in near.items()}
    assert all(float(e @ v) < thr for v in far.values()), {k: float(e @ v) for k, v in far.items()}
