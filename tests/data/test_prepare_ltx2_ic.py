"""LTX-2 IC-LoRA reference videos through ``vfm prepare reference_dir=`` and the Energon loader: the stored reference
latents equal the tiny pipeline folder's video VAE (with LTX2Pipeline's normalisation) applied to the reference's first
``num_frames`` frames resized to the clip's size / ``reference_downscale``; a missing or short reference is skipped
(recorded) or stops the run; a resumed prepare; batches carry ``reference_latents``; ``lora_ltx2_ic`` trains on the
shards, and a downscale mismatch between the data and the model stops before training, naming both values."""

import json
import shutil
import tarfile
from io import BytesIO

import numpy as np
import pytest
import torch
from ltx2_folder import build_pipeline_folder, on_prepared, write_clip  # tests/data/ltx2_folder.py

from nemo_vfm.data.prepare import MissingReferenceError, PrepareConfig, prepare

pytest.importorskip("diffusers")
CAPTIONS = {"a": "a red circle moving left", "b": "blue square on black background", "c": "green triangle up",
            "d": "navy circle moving down"}
K = 2  # reference_downscale


@pytest.fixture(scope="module")
def ltx2_dir(tmp_path_factory):
    return build_pipeline_folder(tmp_path_factory.mktemp("ltx2_ic_pipe"))


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    """Clips a-d (32 x 32, 9 frames, audio); references in raw/refs/ (inside the input: not read as clips): a's has 13
    frames (the first 9 are used), b's is 24 x 40 (resized to cover 16 x 16, centre-cropped), c has none, d's has 5
    frames (too short)."""
    raw = tmp_path_factory.mktemp("ltx2_ic_raw")
    for i, (k, v) in enumerate(CAPTIONS.items()):
        write_clip(raw / f"{k}.mp4", size=32, audio_rate=16000, seed=i)
        (raw / f"{k}.txt").write_text(v)
    (raw / "refs").mkdir()
    write_clip(raw / "refs" / "a.mp4", frames=13, size=24, audio_rate=None, seed=10)
    write_clip(raw / "refs" / "b.mp4", size=24, width=40, audio_rate=None, seed=11)
    write_clip(raw / "refs" / "d.mp4", frames=5, size=16, audio_rate=None, seed=13)
    return raw


def _prepare(raw, out, ltx2_dir, **kw):
    cfg = dict(input=str(raw), output=str(out), tokenizer="ltx2", tokenizer_kwargs={"path": str(ltx2_dir)},
               text_encoder="ltx2", text_encoder_kwargs={"path": str(ltx2_dir), "max_length": 8},
               audio_vae=str(ltx2_dir), patch_multiple=(1, 1, 1), latent_dtype="float32", progress=False,
               samples_per_shard=2, reference_dir=str(raw / "refs"), reference_downscale=K)
    cfg.update(kw)
    return prepare(PrepareConfig(**cfg))


def _samples(out) -> dict[str, dict]:
    got: dict[str, dict] = {}
    for shard in sorted(out.glob("*.tar")):
        with tarfile.open(shard) as tf:
            for m in tf:
                key, _, part = m.name.partition(".")
                data = tf.extractfile(m).read()
                got.setdefault(key.removesuffix("_mp4"), {})[part] = (json.loads(data) if part == "json"
                                                                      else np.load(BytesIO(data)))
    return got


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, clips, ltx2_dir):
    out = tmp_path_factory.mktemp("ltx2_ic_out")
    res = _prepare(clips, out, ltx2_dir)
    assert res.written == 2 and res.indexed
    return out, res


def test_reference_latents_equal_the_vae_on_the_resized_reference(prepared, clips, ltx2_dir):
    import diffusers
    from diffusers.pipelines.ltx2.pipeline_ltx2 import LTX2Pipeline

    from nemo_vfm.io.video import frames_to_tensor, read_video

    out, _ = prepared
    s = _samples(out)
    assert set(s) == {"a", "b"}  # refs/*.mp4 are not clips; c and d are skipped (next test)
    vae = diffusers.AutoencoderKLLTX2Video.from_pretrained(str(ltx2_dir / "vae")).eval()

    def encode(video_3THW):
        with torch.no_grad():
            z = vae.encode(video_3THW[None]).latent_dist.mode()
        return LTX2Pipeline._normalize_latents(z, vae.latents_mean, vae.latents_std, vae.config.scaling_factor)[0]

    for key, (top, left) in (("a", (0, 0)), ("b", (0, 5))):  # 24 x 40 covers 16 x 16 at 16 x 27: 5 columns cut left
        frames, _ = read_video(clips / "refs" / f"{key}.mp4")
        ref = frames_to_tensor(np.array(frames[:9])).transpose(0, 1)  # the clip's 9 frames, (T, 3, H, W)
        scale = 16 / min(ref.shape[2:])
        size = (max(16, round(ref.shape[2] * scale)), max(16, round(ref.shape[3] * scale)))
        ref = torch.nn.functional.interpolate(ref, size=size, mode="bilinear", antialias=True, align_corners=False)
        ref = ref[:, :, top:top + 16, left:left + 16].transpose(0, 1)  # (3, 9, 32 / K, 32 / K)
        np.testing.assert_allclose(s[key]["reference_latent.npy"], encode(ref).numpy(), rtol=1e-4, atol=1e-5)
        meta = s[key]["json"]
        assert meta["latent_shape"] == [8, 3, 4, 4] and (meta["height"], meta["width"]) == (32, 32)
        assert meta["reference"] == {"source": f"{key}.mp4", "latent_shape": [8, 3, 2, 2], "downscale": K,
                                     "height": 16, "width": 16}
    clip, _ = read_video(clips / "a.mp4")  # the target itself is unchanged by the reference
    np.testing.assert_allclose(s["a"]["latent.npy"], encode(frames_to_tensor(np.array(clip[:9]))).numpy(),
                               rtol=1e-4, atol=1e-5)
    spec = json.loads((out / ".prepare" / "config.json").read_text())
    assert spec["reference_downscale"] == K and spec["missing_reference"] == "skip"


def test_missing_reference_policies_and_resume(prepared, clips, ltx2_dir, tmp_path):
    _, res = prepared
    reasons = {e["key"]: e["reason"] for e in res.errors}
    assert set(reasons) == {"c_mp4", "d_mp4"}
    assert "no reference video" in reasons["c_mp4"] and "refs/c.*" in reasons["c_mp4"]
    assert "no reference video of 9 frames" in reasons["d_mp4"] and "has 5 frames" in reasons["d_mp4"]
    raw = tmp_path / "raw"
    shutil.copytree(clips, raw)
    out = tmp_path / "out"
    assert _prepare(raw, out, ltx2_dir, audio_vae=None).written == 2
    again = _prepare(raw, out, ltx2_dir, audio_vae=None)  # resumed: done clips skipped, unchanged failures too
    assert (again.written, again.skipped_done, again.skipped_failed) == (0, 2, 2)
    write_clip(raw / "refs" / "c.mp4", size=16, audio_rate=None, seed=12)  # c's reference appears: c is retried
    fixed = _prepare(raw, out, ltx2_dir, audio_vae=None)
    assert (fixed.written, fixed.skipped_done, fixed.skipped_failed) == (1, 2, 1)
    assert _samples(out)["c"]["reference_latent.npy"].shape == (8, 3, 2, 2)
    write_clip(raw / "refs" / "d.mp4", size=16, fps=16, audio_rate=None, seed=13)  # changed: d retried, wrong rate
    rate = _prepare(raw, out, ltx2_dir, audio_vae=None)
    assert rate.written == 0 and "d.mp4 runs at 16 fps, the clip at 8" in rate.errors[0]["reason"]
    with pytest.raises(ValueError, match="was prepared with reference_dir= and reference_downscale=2"):
        _prepare(raw, out, ltx2_dir, audio_vae=None, reference_downscale=1)
    with pytest.raises(MissingReferenceError, match=r"d\.mp4: no reference video at the clip's frame rate.*=err"):
        _prepare(raw, out, ltx2_dir, audio_vae=None, missing_reference="error")  # retries d, skipped before: stops
    (raw / "refs" / "c.mp4").unlink()
    with pytest.raises(MissingReferenceError, match=r"c\.mp4: no reference video.*missing_reference=error"):
        _prepare(raw, tmp_path / "err", ltx2_dir, audio_vae=None, missing_reference="error")
    with pytest.raises(ValueError, match="missing_reference must be one of"):
        PrepareConfig(input=str(raw), output=str(tmp_path / "x"), reference_dir=str(raw / "refs"),
                      missing_reference="zeros")
    with pytest.raises(ValueError, match="give reference_dir=DIR"):
        PrepareConfig(input=str(raw), output=str(tmp_path / "x"), reference_downscale=2)


def test_loader_carries_reference_latents_and_packing_refuses_them(prepared):
    from nemo_vfm.data.energon_datamodule import EnergonDataModule, check_reference_downscale
    from nemo_vfm.models.ltx2.flavors import ltx2_config

    out, _ = prepared
    dm = EnergonDataModule(path=str(out), micro_batch_size=2, patch_size=(1, 1, 1), num_workers=0,
                           shuffle_buffer_size=None, max_samples_per_sequence=None)
    assert dm.reference_downscale == K
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    s = _samples(out)
    assert batch.reference_latents.shape == (2, 8, 3, 2, 2) and batch.latents.shape == (2, 8, 3, 4, 4)
    for i, key in enumerate(batch.sample_keys):
        np.testing.assert_allclose(batch.reference_latents[i].numpy(), s[key.removesuffix("_mp4")]["reference_latent.npy"])
    with pytest.raises(ValueError, match="reference_dir=.*packed batches do not carry"):
        EnergonDataModule(path=str(out), micro_batch_size=1, patch_size=(1, 1, 1), max_seq_length=64)
    check_reference_downscale(ltx2_config("tiny", reference_downscale=K), K, "data/x")
    with pytest.raises(ValueError, match="takes no reference_latents"):
        check_reference_downscale(object(), K, "data/x")


def test_lora_ltx2_ic_trains_on_prepared_references_and_refuses_another_downscale(prepared, tmp_path, monkeypatch,
                                                                                   cpu_steps):
    import nemo_vfm_recipes.ltx2 as L
    from nemo_vfm.models.ltx2.model import LTX2Model

    out, _ = prepared
    seen, forward = [], LTX2Model.forward

    def spy(self, x, *args, reference_latents=None, **kw):
        seen.append(None if reference_latents is None else (tuple(x.shape), tuple(reference_latents.shape)))
        return forward(self, x, *args, reference_latents=reference_latents, **kw)

    monkeypatch.setattr(LTX2Model, "forward", spy)
    with pytest.raises(ValueError, match=r"reference_downscale=2 but model\.reference_downscale=1"):
        cpu_steps(on_prepared(L.lora_ltx2_ic(), {"reference_downscale": 1}, out), tmp_path / "mismatch")
    assert not seen and not list((tmp_path / "mismatch").rglob("metrics.jsonl"))  # stopped before any step
    cpu_steps(on_prepared(L.lora_ltx2_ic(), {"reference_downscale": K}, out), tmp_path / "ic")
    assert seen == [((2, 8, 3, 4, 4), (2, 8, 3, 2, 2))] * 2  # the network read the prepared references every step
    rows = [json.loads(x) for x in next((tmp_path / "ic").rglob("metrics.jsonl")).read_text().splitlines()]
    assert len([r for r in rows if any(k.endswith("mse_audio") for k in r)]) == 2, rows
