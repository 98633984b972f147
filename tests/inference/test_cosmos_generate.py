"""``vfm generate --ckpt COSMOS_PIPELINE_FOLDER`` (Text2World) from a tiny random Cosmos-Predict2.5 pipeline folder
(transformer/, vae/, text_encoder/ (Qwen2.5-VL), tokenizer/ with a chat template) written here: the Qwen2.5-VL
text encoder equals the pipeline's prompt embedding, and the engine's denoised latents (default negative prompt,
guidance 1 + g) equal diffusers' Cosmos2_5_PredictBasePipeline with guidance g from the same noise."""

import pytest
import torch

from nemo_vfm.cli.main import main

diffusers = pytest.importorskip("diffusers")
transformers = pytest.importorskip("transformers")
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
from test_cosmos import nearest_resize_shim  # noqa: E402  (torchvision stand-in for diffusers' Cosmos model)

nearest_resize_shim()
WORDS = "a red robot arm welding metal in snow the video captures of frames showing ugly scenes"
CHAT = ("{% for m in messages %}<|im_start|>{{ m['role'] }} {% for c in m['content'] %}{{ c['text'] }}{% endfor %}"
        "<|im_end|> {% endfor %}")


class _NoSafetyChecker:
    """Stands in for cosmos_guardrail (not installed)."""

    def to(self, *a, **k):
        return self

    def check_text_safety(self, prompt):
        return True


def _tokenizer(folder):
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    tk = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tk.normalizer, tk.pre_tokenizer = normalizers.Lowercase(), pre_tokenizers.Whitespace()
    tk.train_from_iterator([WORDS + " system user"], trainers.WordLevelTrainer(
        special_tokens=["<pad>", "<unk>", "<|im_start|>", "<|im_end|>"]))
    transformers.PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", unk_token="<unk>",
                                         chat_template=CHAT).save_pretrained(str(folder))


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    from nemo_vfm.models.cosmos import convert
    from nemo_vfm.models.cosmos.flavors import cosmos_config

    root = tmp_path_factory.mktemp("cosmos_pipe")
    torch.manual_seed(0)
    cfg = cosmos_config("tiny")  # context_dim 32 = 2 Qwen layers x 16
    net = cfg.build()
    with torch.no_grad():
        for p in net.parameters():
            p.add_(0.1 * torch.randn_like(p))
    convert.save_weights(net.state_dict(), root / "transformer", cfg)
    diffusers.AutoencoderKLWan(base_dim=8, z_dim=4, dim_mult=[1, 2, 2, 2], num_res_blocks=1,
                               temperal_downsample=[False, True, True], latents_mean=[0.1, 0.2, 0.3, 0.4],
                               latents_std=[2.0, 2.0, 3.0, 3.0]).save_pretrained(str(root / "vae"))
    qcfg = transformers.Qwen2_5_VLConfig(
        text_config=dict(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=1, max_position_embeddings=1024,
                         rope_scaling={"type": "mrope", "mrope_section": [1, 1, 2]}),
        vision_config=dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=16,
                           fullatt_block_indexes=[0]))
    transformers.Qwen2_5_VLForConditionalGeneration(qcfg).save_pretrained(str(root / "text_encoder"))
    _tokenizer(root / "tokenizer")
    return root


def _pipe(folder):
    from diffusers.pipelines.cosmos.pipeline_cosmos2_5_predict import Cosmos2_5_PredictBasePipeline

    return Cosmos2_5_PredictBasePipeline(
        text_encoder=transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(str(folder / "text_encoder")),
        tokenizer=transformers.AutoTokenizer.from_pretrained(str(folder / "tokenizer")),
        transformer=diffusers.CosmosTransformer3DModel.from_pretrained(str(folder / "transformer")),
        vae=diffusers.AutoencoderKLWan.from_pretrained(str(folder / "vae")), safety_checker=_NoSafetyChecker(),
        scheduler=diffusers.UniPCMultistepScheduler(use_karras_sigmas=True, use_flow_sigmas=True,
                                                    prediction_type="flow_prediction", sigma_max=200.0, sigma_min=0.01))


def test_text2world_matches_the_diffusers_pipeline(folder):
    from nemo_vfm.inference.checkpoint import read_checkpoint_info
    from nemo_vfm.inference.cp_engine import InferenceEngine
    from nemo_vfm.inference.generate import SamplingConfig
    from nemo_vfm.inference.sampling import initial_noise
    from nemo_vfm.tokenizers.registry import build_text_encoder

    pipe = _pipe(folder)
    prompt = "a red robot arm welding metal"
    enc = build_text_encoder("qwen2_5_vl", path=str(folder))
    emb, mask = enc.encode([prompt])
    torch.testing.assert_close(emb, pipe._get_prompt_embeds(prompt, device="cpu", dtype=torch.float32))
    assert mask.all() and emb.shape == (1, 512, 32)

    info = read_checkpoint_info(folder)
    assert info.kind == "cosmos" and info.generation["sampler"] == "unipc"
    engine = InferenceEngine.from_checkpoint(info, device="cpu", dtype="fp32")
    steps, shape = 3, (4, 2, 4, 4)
    cond, uncond = engine.encode_text([prompt])
    ours = engine.denoise(cond, uncond, shape, SamplingConfig(sampler="unipc", num_steps=steps, guidance=1.0 + 3.0,
                                                              seed=3))
    ref = pipe(prompt=prompt, height=32, width=32, num_frames=5, num_inference_steps=steps, guidance_scale=3.0,
               latents=initial_noise((1, *shape), 3), output_type="latent").frames
    assert ref.shape == ours.shape
    assert (ours - ref).abs().max() <= 1e-4 * ref.abs().max()


def test_vfm_generate_writes_a_video(folder, tmp_path):
    out = tmp_path / "videos"
    rc = main(["generate", "--ckpt", str(folder), "--prompt", "a robot arm welding", "--frames", "5", "--height", "32",
               "--width", "32", "--device", "cpu", "--steps", "2", "--guidance", "8", "--out", str(out)])
    assert rc == 0
    assert list(out.rglob("*.mp4"))


def test_a_transformer_folder_alone_cannot_generate(folder, capsys):
    rc = main(["generate", "--ckpt", str(folder / "transformer"), "--prompt", "a robot", "--device", "cpu"])
    assert rc != 0
    assert "does not record its tokenizer and text encoder" in capsys.readouterr().err
