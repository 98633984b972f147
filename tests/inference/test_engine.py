"""Single-process pieces of the inference engine: samplers, layouts, sizes, checkpoints, the text k/v cache."""

import pytest
import torch

from nemo_vfm.diffusion.conditioning import null_condition
from nemo_vfm.diffusion.edm import EDM
from nemo_vfm.diffusion.flow_matching import FlowMatching
from nemo_vfm.inference.distributed import InferenceLayout
from nemo_vfm.inference.generate import SamplingConfig, generate_latents
from nemo_vfm.inference.sizes import check_latent_size, latent_size
from nemo_vfm.models.dit.model import DiTConfig


def _net(in_channels=4, **kw):
    cfg = DiTConfig(num_layers=2, hidden_size=32, num_heads=4, in_channels=in_channels, context_dim=8,
                    adaln_lora_rank=4, **kw)
    net = cfg.build()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    return net.eval()


def _cond(n=2):
    cond = {"context": torch.randn(n, 3, 8, generator=torch.Generator().manual_seed(1)),
            "context_mask": torch.ones(n, 3, dtype=torch.bool)}
    return cond, null_condition(cond)


@pytest.mark.parametrize("sampler", ["heun", "euler"])
def test_generate_latents_equals_the_objective_sampler(sampler):
    net, edm = _net(), EDM()
    cond, uncond = _cond()
    ref = edm.sample(net, (2, 4, 2, 4, 4), cond, uncond, guidance=3.0, num_steps=4, sampler=sampler,
                     generator=torch.Generator().manual_seed(5))
    got = generate_latents(net, edm, (4, 2, 4, 4), cond, uncond, SamplingConfig(num_steps=4, guidance=3.0,
                                                                                sampler=sampler, seed=5))
    assert torch.equal(got, ref)


def test_flow_euler_equals_flow_matching_sampler():
    net, fm = _net(), FlowMatching(shift=3.0)
    cond, uncond = _cond()
    ref = fm.sample(net, (2, 4, 2, 4, 4), cond, uncond, guidance=3.0, num_steps=4,
                    generator=torch.Generator().manual_seed(5))
    got = generate_latents(net, fm, (4, 2, 4, 4), cond, uncond, SamplingConfig(num_steps=4, guidance=3.0,
                                                                              sampler="flow-euler", seed=5))
    assert torch.equal(got, ref)


def test_sampler_that_does_not_fit_the_objective_names_the_ones_that_do():
    cond, uncond = _cond()
    with pytest.raises(ValueError, match="flow-euler"):
        generate_latents(_net(), FlowMatching(), (4, 2, 4, 4), cond, uncond, SamplingConfig(sampler="res"))
    with pytest.raises(ValueError, match="heun, euler, res"):
        generate_latents(_net(), EDM(), (4, 2, 4, 4), cond, uncond, SamplingConfig(sampler="flow-euler"))
    with pytest.raises(ValueError, match="SamplingConfig.sampler"):
        SamplingConfig(sampler="ddim")


def test_bf16_engine_is_close_to_fp32_and_text_kv_is_computed_once():
    from nemo_vfm.inference.cp_engine import InferenceEngine

    cond, uncond = _cond()
    sampling = SamplingConfig(num_steps=4, guidance=3.0, sampler="res", seed=2)
    ref = generate_latents(_net(), EDM(), (4, 2, 4, 4), cond, uncond, sampling)
    fp32 = InferenceEngine.from_model(_net(), EDM())
    calls = []
    fp32.net.blocks[0].cross_attn.k.inner.register_forward_hook(lambda *a: calls.append(1))
    assert torch.equal(fp32.denoise(cond, uncond, (4, 2, 4, 4), sampling), ref)  # the cache is exact
    assert len(calls) == 1  # 4 steps, batched CFG: one text projection
    bf16 = InferenceEngine.from_model(_net(), EDM(), dtype="bf16").denoise(cond, uncond, (4, 2, 4, 4), sampling)
    assert bf16.dtype == torch.float32
    assert (bf16 - ref).abs().max() < 0.05 * ref.abs().max()


def test_layout_for_world_size_and_errors():
    assert InferenceLayout.for_world(8, tp=2, cfg_parallel=True).cp == 2
    lay = InferenceLayout.for_world(4)
    assert lay.cp == 4 and lay.resolved_cp_kind(32) == "a2a" and lay.resolved_cp_kind(6) == "ring"
    with pytest.raises(ValueError, match="launch a multiple of 4"):
        InferenceLayout.for_world(6, tp=2, cfg_parallel=True)
    with pytest.raises(ValueError, match="nproc-per-node 4"):
        InferenceLayout.for_world(2, cp=2, cfg_parallel=True)
    with pytest.raises(ValueError, match="cp_kind"):
        InferenceLayout(cp_kind="ulysses")


def test_model_layout_errors_name_the_numbers():
    from nemo_vfm.inference.distributed import check_model_layout

    cfg = _net().cfg  # 4 heads, patch (1, 2, 2)
    with pytest.raises(ValueError, match="divisible by tensor parallel size tp=3"):
        check_model_layout(cfg, InferenceLayout(tp=3))
    check_model_layout(cfg, InferenceLayout(cp=4), (3, 2, 6))  # 9 tokens: the DiT pads them to 12
    from nemo_vfm.models.stdit.flavors import stdit_config

    with pytest.raises(ValueError, match="3 latent frames .* not divisible by cp=4"):  # ST-DiT splits whole frames
        check_model_layout(stdit_config("tiny", in_channels=4, context_dim=16), InferenceLayout(cp=4), (3, 2, 6))


def test_sizes_that_do_not_fit_the_tokenizer_or_cp_name_sizes_that_work():
    from nemo_vfm.tokenizers.causal import CausalVideoTokenizer

    tok = CausalVideoTokenizer(temporal_compression=4, spatial_compression=8, latent_channels=4, width=8)
    assert latent_size(tok, 33, 256, 256, (1, 2, 2), token_split=4) == (9, 32, 32)
    with pytest.raises(ValueError, match="num_frames must be 1 \\+ 4\\*k .*nearest: 29 or 33"):
        latent_size(tok, 32, 256, 256, (1, 2, 2))
    with pytest.raises(ValueError, match="multiples of 8"):
        latent_size(tok, 33, 250, 256, (1, 2, 2))
    with pytest.raises(ValueError, match="latent height 33 must be a multiple of the patch 2 \\(heights that work: 256 or 272 pixels\\)"):
        latent_size(tok, 33, 264, 256, (1, 2, 2))  # 33 latent rows: not a multiple of the patch 2
    with pytest.raises(ValueError) as e:
        latent_size(tok, 33, 272, 272, (1, 2, 2), token_split=8)  # 9 x 17 x 17 tokens, odd
    msg = str(e.value)
    assert "33x272x272 (pixels) gives 2601 video tokens" in msg and "cp*tp = 8" in msg
    assert "frames 29 or 61" in msg and "height 256 or 384" in msg
    check_latent_size((8, 34, 34), (1, 2, 2), 8)  # 8 x 17 x 17: fine


def test_file_checkpoint_exports_to_safetensors_and_loads_the_same(tmp_path):
    from nemo_vfm.inference.checkpoint import export_safetensors, load_checkpoint

    net = _net()
    ckpt = tmp_path / "step=00000005.ckpt"
    torch.save({"hyper_parameters": {"model_config": net.cfg, "objective": FlowMatching(shift=2.0),
                                     "generation": {"latent_shape": [4, 2, 4, 4], "fps": 8.0}},
                "state_dict": {**{f"model.{k}": v + 1 for k, v in net.state_dict().items()},
                               **{f"ema.{k}": v for k, v in net.state_dict().items()}},
                "global_step": 5}, ckpt)
    st = export_safetensors(tmp_path, tmp_path / "out" / "dit.safetensors")
    for path in (ckpt, st):
        loaded = load_checkpoint(path)
        assert loaded.step == 5 and loaded.objective == FlowMatching(shift=2.0)
        assert loaded.model_config == net.cfg and loaded.generation["fps"] == 8.0
        for k, v in net.state_dict().items():
            assert torch.equal(loaded.net.state_dict()[k], v), k  # the EMA weights
    raw = load_checkpoint(ckpt, use_ema=False)
    assert torch.equal(raw.net.final_layer.linear.bias, net.final_layer.linear.bias + 1)


def test_plain_safetensors_without_config_is_refused_with_a_fix(tmp_path):
    from safetensors.torch import save_file

    from nemo_vfm.inference.checkpoint import read_checkpoint_info

    save_file({"w": torch.zeros(2)}, str(tmp_path / "w.safetensors"))
    with pytest.raises(ValueError, match="export-safetensors"):
        read_checkpoint_info(tmp_path / "w.safetensors")
    with pytest.raises(FileNotFoundError, match="no step=N.ckpt"):
        read_checkpoint_info(tmp_path)



PROMPTS, LATENT, SAMPLING = ["a red square", "a blue circle"], (12, 2, 4, 4), SamplingConfig(num_steps=4, guidance=1.0, seed=5)


def _videos(net, device):
    """generate_videos on ``device`` and the dtypes the network returned."""
    from nemo_vfm.inference.generate import generate_videos
    from nemo_vfm.tokenizers.hash_text import HashTextEncoder
    from nemo_vfm.tokenizers.identity import IdentityTokenizer

    dtypes = []
    hook = net.register_forward_hook(lambda m, args, out: dtypes.append(out.dtype))
    try:
        videos, _ = generate_videos(net.to(device), EDM(), IdentityTokenizer(2), HashTextEncoder(dim=8, max_length=4),
                                    PROMPTS, LATENT, SAMPLING, device=device)
    finally:
        hook.remove()
    return videos, set(dtypes)


def test_generate_videos_on_cpu_runs_the_network_in_fp32():
    videos, dtypes = _videos(_net(in_channels=12), "cpu")
    assert dtypes == {torch.float32} and videos.dtype == torch.float32 and videos.shape == (2, 3, 2, 8, 8)


@pytest.mark.gpu
def test_generate_videos_on_gpu_runs_the_network_in_bf16_and_stays_close_to_fp32():
    from nemo_vfm.inference.generate import text_conditions
    from nemo_vfm.tokenizers.hash_text import HashTextEncoder
    from nemo_vfm.tokenizers.identity import IdentityTokenizer

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    net = _net(in_channels=12).cuda()
    cond, uncond = text_conditions(HashTextEncoder(dim=8, max_length=4), PROMPTS, "cuda")
    ref = IdentityTokenizer(2).decode(generate_latents(net, EDM(), LATENT, cond, uncond, SAMPLING, "cuda"))
    videos, dtypes = _videos(net, "cuda")  # the same noise (same device and seed), the network under autocast
    assert dtypes == {torch.bfloat16} and videos.dtype == torch.float32
    ref = ref.clamp(-1, 1).cpu()
    assert ((videos - ref).norm() / ref.norm()).item() < 0.05
