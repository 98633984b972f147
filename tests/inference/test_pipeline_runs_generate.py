"""Training runs of pipeline families sample with ``vfm generate --ckpt RUN``: a tiny LoRA run of LTX-2 and of
Kandinsky 6 (and LTX-2's video-only LoRA), fine-tuned (two steps, mock batches, an EMA copy) from the tiny pipeline folders of
test_ltx2_generate / test_kandinsky6_audio_generate, samples what diffusers' pipeline samples with the run's merged
EMA weights in its transformer (same seed, the pipeline's guidance), and ``vfm generate --ckpt RUN`` writes an mp4
with an audio track; a run without ``model.pretrained`` is refused naming the fix, before the weights load."""

import fiddle as fdl
import pytest
import torch

pytest.importorskip("diffusers")

from tests.inference.test_kandinsky6_audio_generate import _pipe, audio_folder  # noqa: E402, F401
from tests.inference.test_kandinsky6_generate import PROMPT as K6_PROMPT  # noqa: E402
from tests.inference.test_kandinsky6_generate import folder  # noqa: E402, F401
from tests.inference.test_ltx2_generate import FRAMES, PROMPT, SIZE, _pipeline_noise, pipe_and_folder  # noqa: E402, F401


def _train(cpu_steps, recipe, data, tmp_path, name):
    """Two LoRA steps (rank 4, fp32 base, an EMA copy; the recipe's checkpointing) of ``recipe`` on CPU -> the run's
    folder."""
    recipe.data = data
    recipe.lora.rank, recipe.lora.frozen_dtype, recipe.optim.lr = 4, None, 1e-2
    recipe.ema_decay = 0.5
    cpu_steps(recipe, tmp_path, name=name)
    return tmp_path / "runs" / name


def _merged(run):
    """The run's EMA weights with the LoRA merged (our names), and its info."""
    from nemo_vfm.inference.checkpoint import full_state_dict, read_checkpoint_info

    info = read_checkpoint_info(run)
    return full_state_dict(info, use_ema=True), info


def _audio_streams(mp4) -> int:
    import av

    with av.open(str(mp4)) as f:
        return len(f.streams.audio)


@pytest.fixture(scope="module", params=["lora_ltx2", "lora_ltx2_video"])
def ltx2_run(request, pipe_and_folder, tmp_path_factory, cpu_steps):  # noqa: F811
    """A run of ``lora_ltx2`` (both streams) or ``lora_ltx2_video`` (video only: sampled with the base's audio)."""
    import nemo_vfm_recipes.ltx2 as L
    from nemo_vfm.data.synthetic import MockLatentDataModule
    from nemo_vfm.inference.ltx2 import ltx2_checkpoint_info
    from nemo_vfm.models.ltx2.model import LTX2Config

    root, video_only = pipe_and_folder[1], request.param.endswith("video")
    recipe = getattr(L, request.param)()
    cfg = vars(ltx2_checkpoint_info(root).model_config)  # the folder's sizes (audio_mel_bins from its audio VAE)
    recipe.model = fdl.Config(LTX2Config, **{**cfg, "cross_timestep": False, "pretrained": str(root)})
    data = fdl.Config(MockLatentDataModule, latent_channels=8, num_frames=2, height=3, width=2, context_dim=16,
                      context_length=4, batch_size=2, num_samples=4, audio_shape=None if video_only else (2, 5, 4))
    return _train(cpu_steps, recipe, data, tmp_path_factory.mktemp("ltx2_run"), request.param)


def test_ltx2_run_samples_as_the_pipeline_with_its_weights(pipe_and_folder, ltx2_run):  # noqa: F811
    from diffusers import LTX2Pipeline, LTX2VideoTransformer3DModel

    from nemo_vfm.inference.checkpoint import full_state_dict
    from nemo_vfm.inference.cp_engine import InferenceEngine
    from nemo_vfm.inference.generate import SamplingConfig
    from nemo_vfm.inference.ltx2 import (
        LTX2Audio,
        LTX2Guidance,
        audio_latent_shape,
        generate_ltx2,
        initial_noise,
        ltx2_run_info,
    )
    from nemo_vfm.models.ltx2 import convert as C

    pipe, root = pipe_and_folder
    state, run = _merged(ltx2_run)
    raw = full_state_dict(run, use_ema=False)
    assert run.lora is not None and any((raw[k] - v).abs().max() > 0 for k, v in state.items())  # EMA weights differ
    info = ltx2_run_info(run)
    assert info.parts == root and info.path == run.path
    engine = InferenceEngine.from_checkpoint(info, device="cpu", dtype="fp32")
    sampling = SamplingConfig(num_steps=3, guidance=3.0, sampler="flow-euler", seed=7)
    lat, _ = generate_ltx2(engine, LTX2Audio.load(info.parts), [PROMPT], FRAMES, SIZE, SIZE, sampling,
                           LTX2Guidance(stg_blocks=(1,)), decode=False)
    trained = LTX2VideoTransformer3DModel.from_config(pipe.transformer.config).eval()
    trained.load_state_dict(C.to_diffusers(state), strict=True)
    assert any((a - b).abs().max() > 1e-4 for a, b in zip(trained.state_dict().values(),
                                                           pipe.transformer.state_dict().values()))  # trained
    ref = LTX2Pipeline(**{**pipe.components, "transformer": trained})
    ref.set_progress_bar_config(disable=True)
    v, a = _pipeline_noise(pipe, *initial_noise(1, (8, 2, 2, 2), audio_latent_shape(root, FRAMES, 24.0), seed=7))
    want_v, want_a = ref(PROMPT, latents=v, audio_latents=a, output_type="latent", num_frames=FRAMES, height=SIZE,
                         width=SIZE, num_inference_steps=3, spatio_temporal_guidance_blocks=[1], return_dict=False)
    got_v, got_a = _pipeline_noise(pipe, lat["latents"], lat["audio_latents"])
    torch.testing.assert_close(got_v, want_v, rtol=0, atol=1e-4)
    torch.testing.assert_close(got_a, want_a, rtol=0, atol=1e-4)


def test_vfm_generate_samples_an_ltx2_run_with_sound(ltx2_run, tmp_path):
    from nemo_vfm.cli.main import main

    out = tmp_path / "videos"
    rc = main(["generate", "--ckpt", str(ltx2_run), "--prompt", PROMPT, "--frames", str(FRAMES), "--height", str(SIZE),
               "--width", str(SIZE), "--device", "cpu", "--steps", "2", "--no-gif", "--out", str(out)])
    assert rc == 0
    assert _audio_streams(out / "batch000.mp4") == 1 and (out / "batch000.wav").is_file()


@pytest.fixture(scope="module")
def k6_run(audio_folder, tmp_path_factory, cpu_steps):  # noqa: F811
    import nemo_vfm_recipes.kandinsky6 as k6
    from nemo_vfm.data.synthetic import MockLatentDataModule

    recipe = k6.lora_kandinsky6_3b()
    recipe.model.pretrained = str(audio_folder / "transformer")  # a transformer folder inside the pipeline folder
    data = fdl.Config(MockLatentDataModule, latent_channels=4, num_frames=3, height=4, width=4, context_dim=16,
                      context_length=4, pooled_dim=8, batch_size=2, num_samples=8)
    return _train(cpu_steps, recipe, data, tmp_path_factory.mktemp("k6_run"), "lora_kandinsky6_3b")


def test_kandinsky6_run_samples_as_the_pipeline_with_its_weights(audio_folder, k6_run):  # noqa: F811
    from nemo_vfm.inference.cp_engine import InferenceEngine
    from nemo_vfm.inference.generate import SamplingConfig
    from nemo_vfm.inference.kandinsky6 import (
        audio_length,
        clip_encoder,
        generate_kandinsky6_av,
        kandinsky6_run_info,
    )
    from nemo_vfm.models.kandinsky6 import convert as C

    state, run = _merged(k6_run)
    info = kandinsky6_run_info(run)
    assert info.parts == audio_folder and info.objective.shift == 3.0  # the folder's scheduler
    engine = InferenceEngine.from_checkpoint(info, device="cpu", dtype="fp32")
    shape, steps = (4, 2, 2, 4), 3
    length = audio_length(audio_folder, shape[1], 4)
    got, _ = generate_kandinsky6_av(engine, None, [K6_PROMPT], shape, length,
                                    SamplingConfig(num_steps=steps, guidance=5.0, sampler="flow-euler", seed=3),
                                    clip_encoder(info), decode=False)
    pipe = _pipe(audio_folder)
    before = {k: v.clone() for k, v in pipe.transformer.state_dict().items()}
    pipe.transformer.load_state_dict(C.to_diffusers(state), strict=True)
    assert any((before[k] - v).abs().max() > 1e-4 for k, v in pipe.transformer.state_dict().items())  # trained
    want_v, want_a = pipe(prompt=K6_PROMPT, height=16, width=32, num_frames=5, num_inference_steps=steps,
                          generator=torch.Generator().manual_seed(3), output_type="latent", return_dict=False)
    for ours, theirs in ((got["latents"], want_v), (got["audio_latents"].permute(0, 2, 1), want_a)):
        assert ours.shape == theirs.shape
        assert (ours - theirs).abs().max() <= 1e-4 * max(1.0, theirs.abs().max())


def test_vfm_generate_samples_a_kandinsky6_run_with_sound(k6_run, tmp_path):
    from nemo_vfm.cli.main import main

    out = tmp_path / "videos"
    rc = main(["generate", "--ckpt", str(k6_run), "--prompt", K6_PROMPT, "--frames", "5", "--height", "32", "--width",
               "32", "--device", "cpu", "--steps", "2", "--no-gif", "--out", str(out)])
    assert rc == 0
    (mp4,) = list(out.rglob("*.mp4"))
    assert _audio_streams(mp4) == 1 and list(out.rglob("*.wav"))


def test_a_run_without_its_pipeline_folder_is_refused(k6_run, tmp_path, capsys, monkeypatch):
    """A run whose model.pretrained is unset (or lacks a part) fails naming the fix, before any weight is read."""
    import dataclasses

    from nemo_vfm.cli.main import main
    from nemo_vfm.inference import checkpoint
    from nemo_vfm.inference.kandinsky6 import kandinsky6_run_info

    read = checkpoint.read_checkpoint_info

    def without_pretrained(path, allow_pickle=False):
        info = read(path, allow_pickle)
        return dataclasses.replace(info, model_config=dataclasses.replace(info.model_config, pretrained=None))

    monkeypatch.setattr(checkpoint, "read_checkpoint_info", without_pretrained)
    monkeypatch.setattr(checkpoint, "load_weights", lambda *a, **k: pytest.fail("weights loaded"))
    rc = main(["generate", "--ckpt", str(k6_run), "--prompt", "a", "--device", "cpu", "--out", str(tmp_path / "v")])
    err = capsys.readouterr().err
    assert rc == 2 and "records no model.pretrained" in err and "model.pretrained=PIPELINE_FOLDER" in err
    run = read(k6_run)
    alone = tmp_path / "alone"
    (alone / "transformer").mkdir(parents=True)
    (alone / "transformer" / "config.json").write_text("{}")
    for d in ("vae", "text_encoder", "tokenizer"):
        (alone / d).mkdir()
    cfg = dataclasses.replace(run.model_config, pretrained=str(alone / "transformer"))
    lacking = dataclasses.replace(run, model_config=cfg)
    with pytest.raises(ValueError, match=r"has no text_encoder_2/, tokenizer_2/; copy the pipeline's"):
        kandinsky6_run_info(lacking)


def test_a_run_whose_network_differs_from_its_pipeline_folder_is_refused(k6_run):
    """Another latent width than the folder's (a folder swapped under the run): refused naming both values, before
    the weights load."""
    import dataclasses

    from nemo_vfm.inference.checkpoint import read_checkpoint_info
    from nemo_vfm.inference.kandinsky6 import kandinsky6_run_info

    run = read_checkpoint_info(k6_run)
    odd = dataclasses.replace(run, model_config=dataclasses.replace(run.model_config, in_channels=8, out_channels=8))
    with pytest.raises(ValueError, match=r"network has in_channels=8, out_channels=8 but the pipeline folder .* has "
                                         r"in_channels=4, out_channels=4; sample it with the pipeline folder"):
        kandinsky6_run_info(odd)
