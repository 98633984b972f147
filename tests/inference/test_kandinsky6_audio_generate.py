"""Kandinsky 6 with sound: on test_kandinsky6_generate's tiny Kandinsky6TI2VAPipeline folder with a tiny MMAudioVAE and
MMAudioVocoder added (``audio_vae/``, ``vocoder/``, ``model_index.json``), ``generate_kandinsky6_av`` samples the
pipeline's video and audio latents (``sample_audio=True``, its default guidance, the noise from the same seeded
generator) and its waveform, from prompts alone and from a prompt and an image; ``--no-audio``'s path is the
pipeline's ``sample_audio=False``; ``vfm generate`` writes an mp4 with an audio track and a wav (video only with
``--no-audio``); sound with --cfg-parallel or --tp is refused before the weights load."""

import json
import shutil
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("diffusers")

from tests.inference.test_kandinsky6_generate import PROMPT, _image, _pipe, folder  # noqa: E402, F401

SEED, STEPS = 3, 3
SHAPE = (4, 2, 2, 4)  # 5 frames x 16 x 32 px
SIZE = dict(height=16, width=32, num_frames=5)


def add_audio(root) -> None:
    """A tiny MMAudioVAE (6 latent channels: the tiny transformer's audio channels; 16 kHz, 32-sample latent hop) and
    MMAudioVocoder (16x upsampling: the VAE's mel hop) saved into ``root`` as the pipeline's audio parts."""
    from diffusers import MMAudioVAE, MMAudioVocoder

    torch.manual_seed(1)
    MMAudioVAE(mel_bins=8, latent_channels=6, hidden_channels=8, channel_multipliers=(1, 2), layers_per_block=1,
               sample_rate=16000, n_fft=64, hop_length=16).save_pretrained(str(root / "audio_vae"))
    MMAudioVocoder(num_mels=8, upsample_initial_channel=16, upsample_rates=(4, 4), upsample_kernel_sizes=(8, 8),
                   resblock_kernel_sizes=(3,), resblock_dilation_sizes=((1,),)).save_pretrained(str(root / "vocoder"))
    index = json.loads((root / "model_index.json").read_text())
    index.update(audio_vae=["diffusers", "MMAudioVAE"], vocoder=["diffusers", "MMAudioVocoder"])
    (root / "model_index.json").write_text(json.dumps(index, indent=2))


@pytest.fixture(scope="module")
def audio_folder(folder, tmp_path_factory):  # noqa: F811
    root = tmp_path_factory.mktemp("k6_audio") / "pipe"
    shutil.copytree(folder, root)
    add_audio(root)
    return root


def _engine(path):
    from nemo_vfm.inference.checkpoint import read_checkpoint_info
    from nemo_vfm.inference.cp_engine import InferenceEngine
    from nemo_vfm.inference.kandinsky6 import clip_encoder

    info = read_checkpoint_info(path)
    return info, InferenceEngine.from_checkpoint(info, device="cpu", dtype="fp32"), clip_encoder(info)


def _sampling(guidance=5.0):
    from nemo_vfm.inference.generate import SamplingConfig

    return SamplingConfig(num_steps=STEPS, guidance=guidance, sampler="flow-euler", seed=SEED)


def _close(got, want, tol=1e-4):
    assert got.shape == want.shape
    assert (got - want).abs().max() <= tol * max(1.0, want.abs().max())


def test_audio_length_is_the_pipelines(audio_folder):
    from nemo_vfm.inference.kandinsky6 import audio_length

    pipe = _pipe(audio_folder)
    assert pipe.audio_latent_hop_length == 32 and pipe.audio_sample_rate == 16000
    assert audio_length(audio_folder, 2, 4) == 105  # ceil(5 / 24 * 16000 / 32)
    assert audio_length(audio_folder, 31, 4, 24.0) == 2521  # 121 frames


def test_joint_sampling_matches_the_pipeline(audio_folder):
    """The pipeline's default guidance (5) and noise from ``torch.Generator().manual_seed(seed)``: the same video and
    audio latents, and through the audio VAE and vocoder the same waveform."""
    from nemo_vfm.inference.kandinsky6 import Kandinsky6Audio, audio_length, generate_kandinsky6_av

    info, engine, clip = _engine(audio_folder)
    length = audio_length(audio_folder, SHAPE[1], 4)
    got, _ = generate_kandinsky6_av(engine, None, [PROMPT], SHAPE, length, _sampling(), clip, decode=False)
    pipe = _pipe(audio_folder)
    want_v, want_a = pipe(prompt=PROMPT, **SIZE, num_inference_steps=STEPS, generator=torch.Generator().manual_seed(SEED),
                          output_type="latent", return_dict=False)
    _close(got["latents"], want_v)
    _close(got["audio_latents"].permute(0, 2, 1), want_a)
    assert got["audio_latents"].shape == (1, length, 6)
    # the waveform: the pipeline's decode of its own latents, ours of ours
    _, wave = pipe(prompt=PROMPT, **SIZE, num_inference_steps=STEPS, generator=torch.Generator().manual_seed(SEED),
                   output_type="pt", return_dict=False)
    ours = Kandinsky6Audio.load(audio_folder).decode(got["audio_latents"])
    assert ours.shape == (1, 1, length * 32)
    _close(ours[:, 0], wave)
    assert wave.abs().max() > 1e-3  # not silence


def test_joint_image_to_video_matches_the_pipeline(audio_folder, tmp_path):
    """With an image the pipeline draws its posterior sample from the generator first: given that latent, our noise
    (which skips that draw) and loop give its video and audio latents."""
    from PIL import Image

    from nemo_vfm.inference.kandinsky6 import audio_length, generate_kandinsky6_av

    info, engine, clip = _engine(audio_folder)
    pipe = _pipe(audio_folder)
    image = Image.open(_image(tmp_path))
    with torch.no_grad():
        lat = pipe.encode_image(image, 16, 32, "cpu", torch.float32, 1,
                                torch.Generator().manual_seed(SEED)).permute(0, 3, 1, 2)  # (1, C, h, w)
    length = audio_length(audio_folder, SHAPE[1], 4)
    got, _ = generate_kandinsky6_av(engine, None, [PROMPT], SHAPE, length, _sampling(), clip,
                                    {"image_latents": lat}, decode=False, skip=(1, 4, 1, 2, 4))
    want_v, want_a = pipe(prompt=PROMPT, image=image, **SIZE, num_inference_steps=STEPS,
                          generator=torch.Generator().manual_seed(SEED), output_type="latent", return_dict=False)
    _close(got["latents"], want_v)
    _close(got["audio_latents"].permute(0, 2, 1), want_a)


def test_no_audio_path_is_sample_audio_false(audio_folder):
    from nemo_vfm.inference.kandinsky6 import generate_kandinsky6
    from nemo_vfm.inference.sampling import initial_noise

    info, engine, clip = _engine(audio_folder)
    got, _ = generate_kandinsky6(engine, [PROMPT], SHAPE, _sampling(), clip, decode=False)
    want = _pipe(audio_folder)(prompt=PROMPT, **SIZE, num_inference_steps=STEPS, latents=initial_noise((1, *SHAPE), SEED),
                               sample_audio=False, output_type="latent", return_dict=False)[0]
    _close(got, want, 1e-5)


def _generate(folder, out, *extra):  # noqa: F811
    from nemo_vfm.cli.main import main

    return main(["generate", "--ckpt", str(folder), "--prompt", PROMPT, "--frames", "5", "--height", "32", "--width",
                 "32", "--device", "cpu", "--steps", "2", "--out", str(out), "--no-gif", *extra])


def _audio_streams(path) -> int:
    import av

    with av.open(str(path)) as f:
        return len(f.streams.audio)


def test_vfm_generate_writes_sound(audio_folder, tmp_path):
    out = tmp_path / "av"
    assert _generate(audio_folder, out, "--image", str(_image(tmp_path))) == 0
    (mp4,), (wav,) = list(out.rglob("*.mp4")), list(out.rglob("*.wav"))
    assert _audio_streams(mp4) == 1 and wav.stat().st_size > 44
    assert _generate(audio_folder, tmp_path / "v", "--no-audio") == 0
    (mp4,) = list((tmp_path / "v").rglob("*.mp4"))
    assert _audio_streams(mp4) == 0 and not list((tmp_path / "v").rglob("*.wav"))


def test_a_folder_without_audio_says_so_once(folder, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "v"
    assert _generate(folder, out, "--prompt", "hello") == 0  # two prompts, one batch
    assert capsys.readouterr().out.count("generating video only") == 1
    (mp4,) = list(out.rglob("*.mp4"))
    assert _audio_streams(mp4) == 0 and not list(out.rglob("*.wav"))


def test_sound_with_cfg_parallel_or_tp_is_refused(audio_folder, tmp_path):
    from nemo_vfm.inference.checkpoint import read_checkpoint_info
    from nemo_vfm.inference.distributed import InferenceLayout
    from nemo_vfm.inference.families import generation_of

    info = read_checkpoint_info(audio_folder)
    check = generation_of(info).check_run
    args = SimpleNamespace(no_audio=False, sampler=None)
    for layout in (InferenceLayout(tp=2), InferenceLayout(cfg_parallel=True)):
        with pytest.raises(NotImplementedError, match="--no-audio"):
            check(info, args, layout)
        check(info, SimpleNamespace(no_audio=True, sampler=None), layout)  # video only: as before
    check(info, args, InferenceLayout(cp=2))  # CP: test_kandinsky6_cp_generation
    check(info, args, InferenceLayout())
    with pytest.raises(ValueError, match="flow-euler"):
        check(info, SimpleNamespace(no_audio=False, sampler="unipc"), InferenceLayout())
    half = tmp_path / "half"
    shutil.copytree(audio_folder / "transformer", half / "transformer")
    shutil.copytree(audio_folder / "audio_vae", half / "audio_vae")
    with pytest.raises(ValueError, match="no vocoder/"):
        check(read_checkpoint_info(half), args, InferenceLayout())


def test_no_audio_is_refused_for_ltx2():
    from nemo_vfm.inference.ltx2 import GENERATION

    with pytest.raises(ValueError, match="LTX-2 samples video and sound together"):
        GENERATION.check_run(None, SimpleNamespace(no_audio=True), None)
    GENERATION.check_run(None, SimpleNamespace(no_audio=False), None)
