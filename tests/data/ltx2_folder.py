"""A tiny random LTX-2 pipeline folder (diffusers layout: vae/, audio_vae/, text_encoder/, tokenizer/, connectors/)
and tiny mp4 clips with and without an audio track, for the LTX-2 ``vfm prepare`` tests."""

from pathlib import Path

import numpy as np
import torch

WORDS = "a red green blue circle square triangle moving left right up down on background black gray navy"
AUDIO = dict(base_channels=8, output_channels=2, ch_mult=(1, 2, 4), num_res_blocks=1, in_channels=2,
             latent_channels=2, norm_type="pixel", causality_axis="height", sample_rate=16000, mel_hop_length=160,
             mel_bins=16, double_z=True)  # latents (2, La, 16 / 4): packed width 2 * 4 = 8 = latents_mean entries
AUDIO_PACKED = 8


def _tokenizer(folder: Path):
    import transformers
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers

    tk = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tk.normalizer, tk.pre_tokenizer = normalizers.Lowercase(), pre_tokenizers.Whitespace()
    tk.train_from_iterator([WORDS], trainers.WordLevelTrainer(special_tokens=["<pad>", "<eos>", "<bos>", "<unk>"]))
    tk.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 2)])
    transformers.PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>",
                                         unk_token="<unk>").save_pretrained(str(folder))


def build_pipeline_folder(root: Path) -> Path:
    """Write the folder (random weights, fixed seed; latents statistics not identity) and return it."""
    import diffusers
    import transformers

    root = Path(root)
    torch.manual_seed(0)
    vae = diffusers.AutoencoderKLLTX2Video(
        latent_channels=8, block_out_channels=(8, 16), down_block_types=("LTX2VideoDownBlock3D",) * 2,
        decoder_block_out_channels=(8,), layers_per_block=(1, 1, 1), decoder_layers_per_block=(1, 1),
        spatio_temporal_scaling=(True, True), decoder_spatio_temporal_scaling=(True,),
        decoder_inject_noise=(False, False), downsample_type=("spatiotemporal", "spatiotemporal"),
        upsample_type=("spatiotemporal",), upsample_residual=(True,), upsample_factor=(2,), patch_size=2,
        patch_size_t=1, scaling_factor=0.5, spatial_compression_ratio=8, temporal_compression_ratio=4)
    vae.latents_mean.copy_(torch.linspace(-0.2, 0.2, 8))
    vae.latents_std.copy_(torch.linspace(0.5, 1.5, 8))
    vae.save_pretrained(str(root / "vae"))
    avae = diffusers.AutoencoderKLLTX2Audio(**AUDIO)
    avae.latents_mean = torch.linspace(-0.1, 0.1, AUDIO_PACKED)
    avae.latents_std = torch.linspace(0.5, 2.0, AUDIO_PACKED)
    avae.save_pretrained(str(root / "audio_vae"))
    text = transformers.Gemma3TextConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                         num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                                         max_position_embeddings=64, sliding_window=8)
    vision = transformers.SiglipVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                             num_attention_heads=2, image_size=16, patch_size=8)
    gemma = transformers.Gemma3ForConditionalGeneration(transformers.Gemma3Config(
        text_config=text, vision_config=vision, mm_tokens_per_image=4))
    gemma.save_pretrained(str(root / "text_encoder"))
    _tokenizer(root / "tokenizer")
    from diffusers.pipelines.ltx2.connectors import LTX2TextConnectors

    conn = LTX2TextConnectors(
        caption_channels=16, text_proj_in_factor=3, video_connector_num_attention_heads=2,
        video_connector_attention_head_dim=8, video_connector_num_layers=1, video_connector_num_learnable_registers=4,
        audio_connector_num_attention_heads=2, audio_connector_attention_head_dim=8, audio_connector_num_layers=1,
        audio_connector_num_learnable_registers=4, connector_rope_base_seq_len=16)
    with torch.no_grad():
        for p in conn.parameters():  # registers and norms away from their zero / one init
            p.add_(0.1 * torch.randn_like(p))
    conn.save_pretrained(str(root / "connectors"))
    return root


def write_clip(path: Path, frames: int = 9, size: int = 16, fps: int = 8, audio_rate: int | None = 22050,
               audio_channels: int = 1, seed: int = 0, width: int | None = None) -> Path:
    """An h264 mp4 of moving noise (``size`` x ``width or size``), with a sine + noise AAC track when ``audio_rate``
    is set."""
    import av

    rng = np.random.default_rng(seed)
    video = rng.integers(0, 255, (frames, size, width or size, 3), dtype=np.uint8)
    with av.open(str(path), "w") as out:
        vs = out.add_stream("libx264", rate=fps)
        vs.height, vs.width = size, width or size
        vs.pix_fmt = "yuv420p"
        if audio_rate:
            a = out.add_stream("aac", rate=audio_rate)
            a.layout = "mono" if audio_channels == 1 else "stereo"
        for f in video:
            for p in vs.encode(av.VideoFrame.from_ndarray(f, format="rgb24")):
                out.mux(p)
        for p in vs.encode():
            out.mux(p)
        if audio_rate:
            n = int(audio_rate * (frames / fps + 0.5))
            t = np.arange(n) / audio_rate
            wave = (0.3 * np.sin(2 * np.pi * 440 * t) + 0.05 * rng.standard_normal(n)).astype(np.float32)
            wave = np.tile(wave[None], (audio_channels, 1))
            frame = av.AudioFrame.from_ndarray(wave, format="fltp", layout=a.layout.name)
            frame.sample_rate = audio_rate
            for p in a.encode(frame):
                out.mux(p)
            for p in a.encode():
                out.mux(p)
    return path


def on_prepared(recipe, model_kw: dict, path, batch: int = 2):
    """An LTX-2 LoRA recipe (``lora_ltx2`` / ``lora_ltx2_ic``) set to train on prepared shards at ``path``: the tiny
    flavor (``model_kw`` on top), LoRA rank 4 on an fp32 base (run it with the ``cpu_steps`` fixture)."""
    import fiddle as fdl

    from nemo_vfm.models.ltx2.flavors import ltx2_config
    from nemo_vfm.models.ltx2.model import LTX2Config

    recipe.model = fdl.Config(LTX2Config, **{**vars(ltx2_config("tiny")), **model_kw})
    recipe.data.path, recipe.data.micro_batch_size, recipe.data.num_workers = str(path), batch, 0
    recipe.lora.rank, recipe.lora.frozen_dtype, recipe.optim.lr = 4, None, 1e-2
    return recipe
