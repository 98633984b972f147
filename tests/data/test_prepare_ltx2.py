"""LTX-2 through ``vfm prepare`` and the Energon loader: the Slaney mel front end against a hand computation; the
prepared video latents, video + audio text and audio latents equal the tiny pipeline folder's VAEs / Gemma 3 +
connectors applied directly with diffusers' LTX2Pipeline normalisation (the audio through the same mel front end,
which is checked on its own by hand); the missing-audio policies; a resumed prepare;
batches with a per-sample audio mask; ``lora_ltx2`` training on the prepared shards (audio, and a video-only clip
mixed in)."""

import json
import math
import tarfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from ltx2_folder import (  # tests/data/ltx2_folder.py (pytest puts tests/data on the path)
    build_pipeline_folder,
    on_prepared,
    write_clip,
)

from nemo_vfm.data.prepare import MissingAudioError, PrepareConfig, prepare
from nemo_vfm.tokenizers import audio_mel

pytest.importorskip("diffusers")
CAPTIONS = {"a": "a red circle moving left", "b": "blue square on black background", "c": "green triangle up"}


@pytest.fixture(scope="module")
def ltx2_dir(tmp_path_factory):
    return build_pipeline_folder(tmp_path_factory.mktemp("ltx2_pipe"))


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    raw = tmp_path_factory.mktemp("ltx2_raw")
    write_clip(raw / "a.mp4", audio_rate=22050, audio_channels=1, seed=1)
    write_clip(raw / "b.mp4", audio_rate=16000, audio_channels=2, seed=2)
    write_clip(raw / "c.mp4", audio_rate=None, seed=3)  # no audio track
    for k, v in CAPTIONS.items():
        (raw / f"{k}.txt").write_text(v)
    return raw


def _prepare(raw, out, ltx2_dir, **kw):
    cfg = dict(input=str(raw), output=str(out), tokenizer="ltx2", tokenizer_kwargs={"path": str(ltx2_dir)},
               text_encoder="ltx2", text_encoder_kwargs={"path": str(ltx2_dir), "max_length": 8},
               audio_vae=str(ltx2_dir), patch_multiple=(1, 1, 1), latent_dtype="float32", progress=False,
               samples_per_shard=2)
    cfg.update(kw)
    return prepare(PrepareConfig(**cfg))


def _samples(out: Path) -> dict[str, dict]:
    got: dict[str, dict] = {}
    for shard in sorted(out.glob("*.tar")):
        with tarfile.open(shard) as tf:
            for m in tf:
                key, _, part = m.name.partition(".")
                data = tf.extractfile(m).read()
                got.setdefault(key.removesuffix("_mp4"), {})[part] = json.loads(data) if part == "json" else np.load(
                    __import__("io").BytesIO(data))
    return got


@pytest.fixture(scope="module")
def video_only_out(tmp_path_factory, clips, ltx2_dir):
    out = tmp_path_factory.mktemp("ltx2_vo")
    res = _prepare(clips, out, ltx2_dir, missing_audio="video_only")
    assert res.written == 3 and not res.errors and res.indexed
    return out


def test_mel_filterbank_against_a_hand_computation():
    """sr 16 kHz, n_fft 8 (5 bins at 0, 2, 4, 6, 8 kHz), 2 Slaney mels over 0-8 kHz, computed here by hand."""
    def mel(f):  # Slaney: 3 mels per 200 Hz up to 1 kHz (15 mels), then 27 mels per factor 6.4
        return f / (200 / 3) if f < 1000 else 15 + 27 * math.log(f / 1000) / math.log(6.4)

    def hz(m):
        return m * 200 / 3 if m < 15 else 1000 * 6.4 ** ((m - 15) / 27)

    top = mel(8000)
    edges = [hz(top * i / 3) for i in range(4)]  # filter m spans edges[m] .. edges[m + 2], peak at edges[m + 1]
    expect = np.zeros((5, 2))
    for m in range(2):
        lo, mid, hi = edges[m:m + 3]
        for k, f in enumerate([0, 2000, 4000, 6000, 8000]):
            tri = max(0.0, min((f - lo) / (mid - lo), (hi - f) / (hi - mid)))
            expect[k, m] = tri * 2 / (hi - lo)  # Slaney area normalisation
    got = audio_mel.mel_filterbank(5, 0.0, 8000.0, 2, 16000)
    np.testing.assert_allclose(got.numpy(), expect, rtol=1e-5, atol=1e-9)
    assert audio_mel.hz_to_mel(1000.0) == pytest.approx(15.0) and audio_mel.hz_to_mel(6400.0) == pytest.approx(42.0)


def test_log_mel_and_resample():
    sr = 16000
    t = torch.arange(sr) / sr
    tone = torch.sin(2 * math.pi * 1000 * t)
    mel = audio_mel.log_mel(tone.view(1, 1, -1), sr, 1024, 160, 64)
    assert mel.shape == (1, 1, 1 + sr // 160, 64)
    fb = audio_mel.mel_filterbank(513, 0.0, 8000.0, 64, sr)
    assert int(mel[0, 0, 50].argmax()) == int(fb[64].argmax())  # 1 kHz = stft bin 64 lands in its filter
    assert float(audio_mel.log_mel(torch.zeros(1, 1, 800), sr, 1024, 160, 64).max()) == pytest.approx(math.log(1e-5))
    down = audio_mel.resample(torch.sin(2 * math.pi * 440 * torch.arange(22050) / 22050), 22050, 16000)
    assert down.shape == (16000,)
    ref = torch.sin(2 * math.pi * 440 * torch.arange(16000) / 16000)
    assert float((down[200:-200] - ref[200:-200]).abs().max()) < 2e-2  # band-limited: the tone is kept
    assert audio_mel.to_stereo(torch.ones(1, 4)).shape == (2, 4)


def test_prepared_parts_equal_the_pipeline_components(video_only_out, clips, ltx2_dir):
    import diffusers
    import transformers
    from diffusers.pipelines.ltx2.connectors import LTX2TextConnectors
    from diffusers.pipelines.ltx2.pipeline_ltx2 import LTX2Pipeline

    from nemo_vfm.io.audio import read_audio
    from nemo_vfm.io.video import frames_to_tensor, read_video

    s = _samples(video_only_out)
    assert set(s) == {"a", "b", "c"}
    vae = diffusers.AutoencoderKLLTX2Video.from_pretrained(str(ltx2_dir / "vae")).eval()
    avae = diffusers.AutoencoderKLLTX2Audio.from_pretrained(str(ltx2_dir / "audio_vae")).eval()
    gemma = transformers.Gemma3ForConditionalGeneration.from_pretrained(str(ltx2_dir / "text_encoder")).eval()
    tok = transformers.AutoTokenizer.from_pretrained(str(ltx2_dir / "tokenizer"))
    conn = LTX2TextConnectors.from_pretrained(str(ltx2_dir / "connectors")).eval()
    pipe = SimpleNamespace(tokenizer=tok, text_encoder=gemma)
    with torch.no_grad():
        for key in ("a", "b"):
            frames, fps = read_video(clips / f"{key}.mp4")
            meta = s[key]["json"]
            assert meta["num_frames"] == 9 and meta["audio"]["status"] == "encoded"
            video = frames_to_tensor(np.array(frames[:9]))[None]
            z = LTX2Pipeline._normalize_latents(vae.encode(video).latent_dist.mode(), vae.latents_mean,
                                                vae.latents_std, vae.config.scaling_factor)
            np.testing.assert_allclose(s[key]["latent.npy"], z[0].numpy(), rtol=1e-4, atol=1e-5)
            emb, mask = LTX2Pipeline._get_gemma_prompt_embeds(pipe, CAPTIONS[key], max_sequence_length=8,
                                                              device="cpu", dtype=torch.float32)
            v, a, m = conn(emb, mask, padding_side="left")
            np.testing.assert_allclose(s[key]["text_emb.npy"], v[0].numpy(), rtol=1e-4, atol=1e-5)
            np.testing.assert_allclose(s[key]["audio_text_emb.npy"], a[0].numpy(), rtol=1e-4, atol=1e-5)
            np.testing.assert_array_equal(s[key]["text_mask.npy"], m[0].bool().numpy())
            wave, rate = read_audio(clips / f"{key}.mp4")
            wave = torch.from_numpy(wave[:, :int(9 / fps * rate)])
            wave = audio_mel.resample(wave.repeat(2, 1) if wave.shape[0] == 1 else wave, rate, 16000)
            mel = audio_mel.log_mel(wave[None], 16000, 1024, 160, 16)
            za = avae.encode(mel).latent_dist.mode()
            packed = LTX2Pipeline._normalize_audio_latents(LTX2Pipeline._pack_audio_latents(za), avae.latents_mean,
                                                           avae.latents_std)
            za = LTX2Pipeline._unpack_audio_latents(packed, za.shape[2], num_mel_bins=za.shape[3])
            np.testing.assert_allclose(s[key]["audio_latent.npy"], za[0].numpy(), rtol=1e-4, atol=1e-5)
    assert "audio_latent.npy" not in s["c"] and s["c"]["json"]["audio"]["status"] == "missing"
    assert s["c"]["json"]["audio"]["latent_shape"] == list(s["a"]["audio_latent.npy"].shape)


def test_missing_audio_policies_and_resume(tmp_path, clips, ltx2_dir):
    out = tmp_path / "skip"
    res = _prepare(clips, out, ltx2_dir)  # default: skip
    assert res.written == 2 and [e["key"] for e in res.errors] == ["c_mp4"] and "no audio track" in res.errors[0]["reason"]
    report = json.loads((out / ".prepare" / "report.json").read_text())
    assert [e["key"] for e in report["errors"]] == ["c_mp4"]
    again = _prepare(clips, out, ltx2_dir)  # resumed: finished clips skipped, the audio-less one not retried
    assert (again.written, again.skipped_done, again.skipped_failed) == (0, 2, 1)
    kept = _prepare(clips, out, ltx2_dir, missing_audio="video_only")  # another policy retries it
    assert kept.written == 1 and _samples(out)["c"]["json"]["audio"]["status"] == "missing"
    with pytest.raises(MissingAudioError, match="c.mp4.*missing_audio=error"):
        _prepare(clips, tmp_path / "err", ltx2_dir, missing_audio="error")
    with pytest.raises(ValueError, match="missing_audio must be one of"):
        PrepareConfig(input=str(clips), output=str(tmp_path / "x"), missing_audio="zeros")
    with pytest.raises(ValueError, match="was prepared with audio_vae="):
        _prepare(clips, out, ltx2_dir, audio_vae=None)


def test_loader_carries_audio_and_masks_the_clip_without(video_only_out):
    from nemo_vfm.data.energon_datamodule import EnergonDataModule

    dm = EnergonDataModule(path=str(video_only_out), micro_batch_size=3, patch_size=(1, 1, 1), num_workers=0,
                           shuffle_buffer_size=None, max_samples_per_sequence=None)
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    keys = [k.removesuffix("_mp4") for k in batch.sample_keys]
    assert sorted(keys) == ["a", "b", "c"]
    assert batch.audio_latents.shape == (3, 2, 29, 4) and batch.audio_context.shape == (3, 8, 16)
    assert batch.audio_mask.tolist() == [k != "c" for k in keys]
    assert torch.equal(batch.audio_context_mask, batch.context_mask)
    assert batch.audio_latents[keys.index("c")].abs().sum() == 0


def test_lora_ltx2_trains_on_prepared_audio_video(tmp_path, clips, ltx2_dir, video_only_out, cpu_steps):
    import nemo_vfm_recipes.ltx2 as L

    with_audio = tmp_path / "with_audio"
    assert _prepare(clips, with_audio, ltx2_dir).written == 2  # missing_audio=skip: a and b
    for name, data, batch in (("audio", with_audio, 2), ("mixed", video_only_out, 3)):  # mixed: c in every batch
        cpu_steps(on_prepared(L.lora_ltx2(), {}, data, batch), tmp_path / name)
        rows = [json.loads(x) for x in next((tmp_path / name).rglob("metrics.jsonl")).read_text().splitlines()]
        audio = [v for r in rows for k, v in r.items() if k.endswith("mse_audio")]
        assert len(audio) == 2 and all(v > 0 for v in audio), rows


def test_objective_masks_the_audio_loss_per_sample():
    from nemo_vfm.diffusion.audio_video import AudioVideoFlowMatching
    from nemo_vfm.models.ltx2.flavors import ltx2_config

    net = ltx2_config("tiny").build()
    with torch.no_grad():
        for p in net.parameters():
            p.add_(0.05 * torch.randn_like(p))
    g = torch.Generator().manual_seed(0)
    x0, a0 = torch.randn(2, 8, 2, 3, 2, generator=g), torch.randn(2, 2, 5, 4, generator=g)
    cond = {"context": torch.randn(2, 4, 16, generator=g), "audio_latents": a0,
            "audio_context": torch.randn(2, 4, 16, generator=g), "audio_mask": torch.tensor([True, False])}
    obj = AudioVideoFlowMatching()
    _, logs = obj.training_loss(net, x0, cond, generator=torch.Generator().manual_seed(3))
    g = torch.Generator().manual_seed(3)
    t = obj.sample_time(2, g)
    n, m = torch.randn(x0.shape, generator=g), torch.randn(a0.shape, generator=g)
    tb = t.view(-1, 1, 1, 1)
    _, u = net((1 - tb[..., None]) * x0 + tb[..., None] * n, t, cond["context"], audio=(1 - tb) * a0 + tb * m,
               audio_timesteps=t, audio_context=cond["audio_context"])
    torch.testing.assert_close(logs["mse_audio"], ((u[0] - (m[0] - a0[0])) ** 2).mean())
    none = {**cond, "audio_mask": torch.tensor([False, False])}
    assert obj.training_loss(net, x0, none, generator=torch.Generator().manual_seed(3))[1]["mse_audio"] == 0


def test_audio_reads_from_files_and_shard_bytes_and_packing_refuses_it(clips, video_only_out):
    from nemo_vfm.data.task_encoder import ClipSample, VideoTaskEncoder
    from nemo_vfm.io.audio import read_audio

    wave, rate = read_audio(clips / "b.mp4", max_seconds=0.5)
    again, rate_b = read_audio((clips / "b.mp4").read_bytes(), max_seconds=0.5)  # webdataset shards: mp4 bytes
    assert wave.shape == (2, 8000) and rate == rate_b == 16000 and np.array_equal(wave, again)
    assert read_audio(clips / "c.mp4") is None
    sample = ClipSample(__key__="a", __restore_key__=(), __subflavors__=None, __sources__=None,
                        latent=torch.zeros(8, 3, 2, 2), text_emb=torch.zeros(8, 16), text_mask=torch.ones(8).bool(),
                        fps=8.0, meta={}, audio_latent=torch.zeros(2, 29, 4), has_audio=True)
    with pytest.raises(NotImplementedError, match="max_seq_length=None"):
        VideoTaskEncoder(patch_size=(1, 1, 1), max_seq_length=64).to_tokens(sample)
