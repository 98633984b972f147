"""LTX-2 sampling (``vfm generate --ckpt LTX2_FOLDER``): on a tiny random LTX2Pipeline folder (Gemma 3 with one layer,
connectors, video and audio VAEs, vocoder, written here), ``generate_ltx2`` gives the pipeline's video latents,
audio latents, frames and waveform for the same noise at the pipeline's default guidance (CFG, STG, modality
isolation, rescale), with the STG pass (``perturbed_attn=True``) and without it, and LTX2ImageToVideoPipeline's
latents from an image; ``vfm generate`` writes an mp4 with an audio track and a wav, from a prompt or a prompt and an
image; sizes the VAE cannot take are refused before loading, other samplers and a missing image too, naming the
fix."""

import pytest
import torch

diffusers = pytest.importorskip("diffusers")

WORDS = "a red robot walks in the snow and sings loud music under blue sky"
PROMPT = "A red robot walks in the snow"
FRAMES, SIZE = 9, 64


def _tokenizer(folder):
    import transformers
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    tk = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tk.normalizer, tk.pre_tokenizer = normalizers.Lowercase(), pre_tokenizers.Whitespace()
    tk.train_from_iterator([WORDS], trainers.WordLevelTrainer(special_tokens=["<pad>", "<unk>", "<bos>", "<eos>"]))
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", unk_token="<unk>",
                                               bos_token="<bos>", eos_token="<eos>", model_max_length=1024)
    tok.save_pretrained(str(folder))
    return tok


def _randomize(*modules, scale=0.05):
    with torch.no_grad():
        for m in modules:
            for p in m.parameters():
                p.add_(scale * torch.randn_like(p))


@pytest.fixture(scope="module")
def pipe_and_folder(tmp_path_factory):
    """A tiny LTX2Pipeline (LTX-2.3-like STG: ``perturbed_attn=True``), saved with ``save_pretrained``."""
    import transformers
    from diffusers import (
        AutoencoderKLLTX2Audio,
        AutoencoderKLLTX2Video,
        FlowMatchEulerDiscreteScheduler,
        LTX2Pipeline,
        LTX2VideoTransformer3DModel,
    )
    from diffusers.pipelines.ltx2.connectors import LTX2TextConnectors
    from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder

    from nemo_vfm.models.ltx2 import convert as C
    from nemo_vfm.models.ltx2.flavors import ltx2_config

    root = tmp_path_factory.mktemp("ltx2_pipe")
    cfg = ltx2_config("tiny")  # 8 latent channels, audio 2 x 4 mel bins, caption_channels 16
    torch.manual_seed(0)
    state = {k: v + 0.1 * torch.randn_like(v) for k, v in cfg.build().state_dict().items()}
    transformer = LTX2VideoTransformer3DModel(**C.config_to_diffusers(cfg), perturbed_attn=True)
    transformer.load_state_dict(C.to_diffusers(state), strict=True)
    tok = _tokenizer(root / "tokenizer")
    gemma = transformers.Gemma3ForConditionalGeneration(transformers.Gemma3Config(
        text_config=dict(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=8, sliding_window=8,
                         max_position_embeddings=2048),
        vision_config=dict(hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
                           image_size=28, patch_size=14), mm_tokens_per_image=4)).eval()
    connectors = LTX2TextConnectors(
        caption_channels=16, text_proj_in_factor=2, video_connector_num_attention_heads=2,
        video_connector_attention_head_dim=8, video_connector_num_layers=1, video_connector_num_learnable_registers=4,
        audio_connector_num_attention_heads=2, audio_connector_attention_head_dim=8, audio_connector_num_layers=1,
        audio_connector_num_learnable_registers=4, rope_type="split")
    vae = AutoencoderKLLTX2Video(latent_channels=8, block_out_channels=(8, 8, 8, 8), decoder_block_out_channels=(8, 16, 32),
                                 layers_per_block=(1, 1, 1, 1, 1), decoder_layers_per_block=(1, 1, 1, 1),
                                 timestep_conditioning=True, decoder_spatial_padding_mode="zeros",
                                 spatial_compression_ratio=32, temporal_compression_ratio=8)
    audio_vae = AutoencoderKLLTX2Audio(base_channels=8, ch_mult=(1, 2, 4), num_res_blocks=1, latent_channels=2,
                                       mel_bins=16)
    vocoder = LTX2Vocoder(in_channels=32, hidden_channels=16, upsample_kernel_sizes=[16, 8, 10],
                          upsample_factors=[8, 4, 5], resnet_kernel_sizes=[3], resnet_dilations=[[1]],
                          output_sampling_rate=16000)  # 100 mel frames/s x 160
    _randomize(connectors, vae, audio_vae, vocoder)
    with torch.no_grad():  # latent statistics away from 0 / 1, so that (de)normalization is checked
        for v in (vae, audio_vae):
            v.latents_mean.copy_(0.1 * torch.randn(8))
            v.latents_std.copy_(1 + 0.2 * torch.rand(8))
    scheduler = FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True, base_shift=0.95, max_shift=2.05,
                                                base_image_seq_len=1024, max_image_seq_len=4096, shift_terminal=0.1,
                                                time_shift_type="exponential")  # the release's scheduler settings
    pipe = LTX2Pipeline(scheduler=scheduler, vae=vae.eval(), audio_vae=audio_vae.eval(), text_encoder=gemma,
                        tokenizer=tok, connectors=connectors.eval(), transformer=transformer.eval(),
                        vocoder=vocoder.eval())
    pipe.save_pretrained(str(root))
    pipe.set_progress_bar_config(disable=True)
    return pipe, root


def _engine(root):
    from nemo_vfm.inference.cp_engine import InferenceEngine
    from nemo_vfm.inference.ltx2 import LTX2Audio, ltx2_checkpoint_info

    info = ltx2_checkpoint_info(root)
    return InferenceEngine.from_checkpoint(info, device="cpu", dtype="fp32"), LTX2Audio.load(root)


def _pipeline_noise(pipe, video, audio):
    """Our normalized noise as the raw latents LTX2Pipeline normalizes when given ``latents=`` / ``audio_latents=``."""
    vae, avae = pipe.vae, pipe.audio_vae
    v = video * (vae.latents_std / vae.config.scaling_factor).view(1, -1, 1, 1, 1) + vae.latents_mean.view(1, -1, 1, 1, 1)
    ca, m = audio.shape[1], audio.shape[3]
    a = audio * avae.latents_std.view(ca, m)[None, :, None] + avae.latents_mean.view(ca, m)[None, :, None]
    return v, a


@pytest.mark.parametrize("perturbed", [True, False])
def test_generation_matches_the_pipeline(pipe_and_folder, perturbed):
    from diffusers import LTX2Pipeline, LTX2VideoTransformer3DModel

    from nemo_vfm.inference.generate import SamplingConfig
    from nemo_vfm.inference.ltx2 import LTX2Guidance, audio_latent_shape, generate_ltx2, initial_noise

    pipe, root = pipe_and_folder
    if not perturbed:  # an LTX-2.0 transformer: diffusers' STG pass is the plain pass, ours is skipped
        plain = LTX2VideoTransformer3DModel.from_config({**pipe.transformer.config, "perturbed_attn": False}).eval()
        plain.load_state_dict(pipe.transformer.state_dict())
        pipe = LTX2Pipeline(**{**pipe.components, "transformer": plain})
        pipe.set_progress_bar_config(disable=True)
    engine, audio = _engine(root)
    sampling = SamplingConfig(num_steps=3, guidance=3.0, sampler="flow-euler", seed=7)
    guidance = LTX2Guidance(stg_blocks=(1,))  # the pipeline's defaults, STG at a block of this 2-block network
    args = (engine, audio, [PROMPT], FRAMES, SIZE, SIZE, sampling, guidance)
    lat, _ = generate_ltx2(*args, stg=perturbed, decode=False)
    out, _ = generate_ltx2(*args, stg=perturbed)
    noise_v, noise_a = initial_noise(1, (8, 2, 2, 2), audio_latent_shape(root, FRAMES, 24.0), seed=7)
    v, a = _pipeline_noise(pipe, noise_v, noise_a)
    kw = dict(num_frames=FRAMES, height=SIZE, width=SIZE, num_inference_steps=3, spatio_temporal_guidance_blocks=[1],
              return_dict=False)
    ref_lat, ref_alat = pipe(PROMPT, latents=v.clone(), audio_latents=a.clone(), output_type="latent", **kw)
    ref_video, ref_wave = pipe(PROMPT, latents=v.clone(), audio_latents=a.clone(), output_type="np", **kw)
    ours_lat, ours_alat = _pipeline_noise(pipe, lat["latents"], lat["audio_latents"])  # raw latents, as "latent" gives
    torch.testing.assert_close(ours_lat, ref_lat, rtol=0, atol=1e-4)
    torch.testing.assert_close(ours_alat, ref_alat, rtol=0, atol=1e-4)
    frames = ((out["videos"] + 1) / 2).clamp(0, 1).permute(0, 2, 3, 4, 1).numpy()  # (N, T, H, W, 3) in [0, 1]
    assert frames.shape == ref_video.shape == (1, FRAMES, SIZE, SIZE, 3)
    assert abs(frames - ref_video).max() < 1e-4
    torch.testing.assert_close(out["waveforms"], ref_wave.float(), rtol=0, atol=1e-4)


def _image():
    from PIL import Image

    g = torch.Generator().manual_seed(5)
    return Image.fromarray((torch.rand(48, 80, 3, generator=g) * 255).byte().numpy())  # resized to 64 x 64


def test_image_to_video_matches_the_pipeline(pipe_and_folder):
    """LTX2ImageToVideoPipeline: the image (H.264 re-compressed at CRF 33, resized, encoded) as the clean first latent
    frame at time 0, the rest denoised; the pipeline draws the same noise from a generator seeded alike."""
    from diffusers import LTX2ImageToVideoPipeline

    from nemo_vfm.inference.generate import SamplingConfig
    from nemo_vfm.inference.ltx2 import LTX2Guidance, generate_ltx2, image_latents

    pipe, root = pipe_and_folder
    i2v = LTX2ImageToVideoPipeline(**pipe.components)
    i2v.set_progress_bar_config(disable=True)
    engine, audio = _engine(root)
    first = image_latents(engine.tokenizer, _image(), SIZE, SIZE)
    sampling = SamplingConfig(num_steps=3, guidance=3.0, sampler="flow-euler", seed=7)
    lat, _ = generate_ltx2(engine, audio, [PROMPT], FRAMES, SIZE, SIZE, sampling, LTX2Guidance(stg_blocks=(1,)),
                           decode=False, first_frame=first)
    ref_lat, ref_alat = i2v(image=_image(), prompt=PROMPT, num_frames=FRAMES, height=SIZE, width=SIZE,
                            num_inference_steps=3, spatio_temporal_guidance_blocks=[1], output_type="latent",
                            generator=torch.Generator().manual_seed(7), return_dict=False)
    ours_lat, ours_alat = _pipeline_noise(pipe, lat["latents"], lat["audio_latents"])
    torch.testing.assert_close(ours_lat, ref_lat, rtol=0, atol=1e-4)
    torch.testing.assert_close(ours_alat, ref_alat, rtol=0, atol=1e-4)
    torch.testing.assert_close(lat["latents"][:, :, :1], first, rtol=0, atol=0)  # the image's frame is kept


@pytest.mark.parametrize("image", [False, True])
def test_vfm_generate_writes_video_with_sound(pipe_and_folder, tmp_path, image):
    import av

    from nemo_vfm.cli.main import main

    out = tmp_path / "videos"
    flags = []
    if image:
        _image().save(tmp_path / "first.png")
        flags = ["--image", str(tmp_path / "first.png")]
    rc = main(["generate", "--ckpt", str(pipe_and_folder[1]), "--prompt", PROMPT, "--frames", str(FRAMES), "--height",
               str(SIZE), "--width", str(SIZE), "--device", "cpu", "--steps", "2", "--no-gif", "--out", str(out),
               *flags])
    assert rc == 0
    mp4, wav = out / "batch000.mp4", out / "batch000.wav"
    assert wav.is_file()
    with av.open(str(mp4)) as c:
        assert len(c.streams.video) == 1 and len(c.streams.audio) == 1
        assert c.streams.audio[0].rate == 16000


@pytest.mark.parametrize("flags, message", [
    (["--height", "48"], "multiples of 32"),
    (["--frames", "10"], "1 + 8*k"),
    (["--sampler", "unipc"], "LTX-2 samples with its pipeline's Euler steps"),
    (["--image", "missing.png"], "image not found"),
])
def test_what_is_not_built_is_refused(pipe_and_folder, tmp_path, capsys, flags, message):
    from nemo_vfm.cli.main import main

    base = ["generate", "--ckpt", str(pipe_and_folder[1]), "--prompt", PROMPT, "--device", "cpu", "--out",
            str(tmp_path), "--frames", str(FRAMES), "--height", str(SIZE), "--width", str(SIZE)]
    assert main(base + flags) == 2
    assert message in capsys.readouterr().err
    assert not list(tmp_path.rglob("*.mp4"))
