"""Cosmos LoRA leaves the framework: ``vfm export --format lora`` of a Cosmos LoRA run loads into diffusers'
CosmosTransformer3DModel (peft) and through Cosmos2_5_PredictBasePipeline.load_lora_weights and gives our LoRA
model's output; ``--format diffusers`` writes the merged network as a folder diffusers reads."""

import json

import pytest
import torch

from nemo_vfm.models.common.lora import LoRAConfig, apply_lora
from nemo_vfm.models.cosmos import convert as C
from nemo_vfm.models.cosmos.flavors import cosmos_config

diffusers = pytest.importorskip("diffusers")
pytest.importorskip("peft")
from test_cosmos import nearest_resize_shim  # noqa: E402  (torchvision stand-in for diffusers' Cosmos model)

nearest_resize_shim()
TARGETS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.output_proj", "cross_attn.q_proj",
           "cross_attn.k_proj", "cross_attn.v_proj", "cross_attn.output_proj", "mlp.layer1", "mlp.layer2")


class _NoSafetyChecker:
    """Stands in for cosmos_guardrail (not installed)."""

    def to(self, *a, **k):
        return self


def _lora_net(lora):
    torch.manual_seed(0)
    cfg = cosmos_config("tiny")
    net = cfg.build()
    with torch.no_grad():
        for p in net.parameters():
            p.add_(0.1 * torch.randn_like(p))
    base = {k: v.clone() for k, v in net.state_dict().items()}
    apply_lora(net, lora)
    with torch.no_grad():
        for n, p in net.named_parameters():
            if ".lora_" in n:
                p.copy_(0.2 * torch.randn_like(p))
    return net.eval(), base


def _theirs(ref, x, t, ctx):
    B, _, T, H, W = x.shape
    with torch.no_grad():
        return ref(x, t, ctx, condition_mask=torch.zeros(B, 1, T, H, W), padding_mask=torch.zeros(1, 1, H, W),
                   return_dict=False)[0]


def test_cli_lora_export_loads_in_diffusers_and_merged_folder_matches(tmp_path):
    from diffusers import CosmosTransformer3DModel
    from diffusers.pipelines.cosmos.pipeline_cosmos2_5_predict import Cosmos2_5_PredictBasePipeline
    from safetensors import safe_open

    from nemo_vfm.cli.main import main
    from nemo_vfm.diffusion.conditioning_frames import ConditioningFramesFlowMatching

    lora = LoRAConfig(rank=4, alpha=12.0, targets=TARGETS)  # scale 3: checks the folding into lora_B
    net, base = _lora_net(lora)
    cfg = net.cfg
    g = torch.Generator().manual_seed(1)
    x, t, ctx = torch.randn(2, 4, 3, 4, 6, generator=g), torch.rand(2, generator=g), torch.randn(2, 7, 32, generator=g)
    with torch.no_grad():
        ours = net(x, t, ctx)
    run = tmp_path / "run" / "checkpoints" / "step=00000003.ckpt"  # a checkpoint as train() writes it
    run.parent.mkdir(parents=True)
    torch.save({"state_dict": {f"model.{k}": v for k, v in net.state_dict().items()}, "global_step": 3,
                "hyper_parameters": {"model_config": cfg, "objective": ConditioningFramesFlowMatching(), "lora": lora}},
               run)

    out = tmp_path / "lora.safetensors"
    assert main(["export", "--ckpt", str(tmp_path / "run"), "--format", "lora", "--out", str(out)]) == 0
    with safe_open(str(out), "pt") as f:
        keys = set(f.keys())
        meta = json.loads(f.metadata()["nemo_vfm_lora"])
    assert len(keys) == 2 * 2 * len(TARGETS) and meta["rank"] == 4
    assert {"transformer.transformer_blocks.0.attn1.to_q.lora_A.weight",
            "transformer.transformer_blocks.1.ff.net.2.lora_B.weight",
            "transformer.transformer_blocks.0.attn2.to_out.0.lora_A.weight"} <= keys

    def plain():
        ref = CosmosTransformer3DModel(**C.config_to_diffusers(cfg)).eval()
        ref.load_state_dict(C.to_diffusers(base), strict=True)
        return ref

    ref = plain()
    assert (_theirs(ref, x, t, ctx) - ours).abs().max() > 1e-2  # the adapters change the output
    ref.load_lora_adapter(str(out), prefix="transformer", adapter_name="ours")
    torch.testing.assert_close(_theirs(ref, x, t, ctx), ours, rtol=1e-5, atol=1e-5)
    vae = diffusers.AutoencoderKLWan(base_dim=8, z_dim=4, dim_mult=[1, 2, 2, 2], num_res_blocks=1,
                                     temperal_downsample=[False, True, True], latents_mean=[0.0] * 4, latents_std=[1.0] * 4)
    pipe = Cosmos2_5_PredictBasePipeline(text_encoder=None, tokenizer=None, vae=vae, safety_checker=_NoSafetyChecker(),
                                         scheduler=diffusers.UniPCMultistepScheduler(), transformer=plain())
    pipe.load_lora_weights(str(out), adapter_name="ours")
    torch.testing.assert_close(_theirs(pipe.transformer, x, t, ctx), ours, rtol=1e-5, atol=1e-5)

    assert main(["export", "--ckpt", str(tmp_path / "run"), "--format", "diffusers", "--out", str(tmp_path / "d")]) == 0
    merged = CosmosTransformer3DModel.from_pretrained(str(tmp_path / "d")).eval()
    torch.testing.assert_close(_theirs(merged, x, t, ctx), ours, rtol=1e-5, atol=1e-5)
    assert main(["export", "--ckpt", str(tmp_path / "run"), "--format", "original", "--out", str(tmp_path / "o")]) != 0
