"""LoRA and whole-model exports: our exported LoRA loaded into diffusers' WanTransformer3DModel (peft), directly
and through ``WanPipeline.load_lora_weights``, gives our LoRA model's output; a LoRA run exports to a diffusers folder (merged) and loads for sampling."""

import json

import pytest
import torch

from nemo_vfm.models.common.lora import LoRAConfig, apply_lora
from nemo_vfm.models.wan import convert as C
from nemo_vfm.models.wan.model import WanConfig

diffusers = pytest.importorskip("diffusers")

WAN_TARGETS = ("self_attn.q", "self_attn.k", "self_attn.v", "self_attn.o", "cross_attn.q", "cross_attn.k",
               "cross_attn.v", "cross_attn.o", "ffn.0", "ffn.2")


def _tiny():
    return WanConfig(num_layers=2, hidden_size=48, num_heads=2, ffn_size=64, in_channels=4, out_channels=4,
                     context_dim=16, freq_dim=32, text_len=512)


def _lora_wan(cfg, lora):
    torch.manual_seed(0)
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


def _inputs(cfg, B=2, T=3, H=4, W=6, L=7):
    g = torch.Generator().manual_seed(1)
    return (torch.randn(B, cfg.out_channels, T, H, W, generator=g), torch.rand(B, generator=g),
            torch.randn(B, L, cfg.context_dim, generator=g))


def _diffusers_out(ref, cfg, x, t, ctx):
    padded = torch.zeros(ctx.shape[0], cfg.text_len, ctx.shape[2])
    padded[:, : ctx.shape[1]] = ctx
    with torch.no_grad():
        return ref(x, t * 1000, padded, return_dict=False)[0]


def _diffusers_model(cfg, state):
    from diffusers import WanTransformer3DModel

    ref = WanTransformer3DModel(**C.config_to_diffusers(cfg)).eval()
    ref.load_state_dict(C.to_diffusers(state), strict=True)
    return ref


def test_exported_lora_applied_to_diffusers_matches(tmp_path):
    pytest.importorskip("peft")
    from safetensors.torch import save_file

    from nemo_vfm.inference.export import lora_export_state

    cfg = _tiny()
    lora = LoRAConfig(rank=4, alpha=12.0, targets=WAN_TARGETS)  # scale 3: checks the folding into lora_B
    net, base = _lora_wan(cfg, lora)
    x, t, ctx = _inputs(cfg)
    with torch.no_grad():
        ours = net(x, t, ctx)
    ref = _diffusers_model(cfg, base)
    without = _diffusers_out(ref, cfg, x, t, ctx)
    assert (without - ours).abs().max() > 1e-2  # the adapters change the output
    state = lora_export_state(net.state_dict(), lora.scale, C)
    assert "transformer.blocks.0.attn1.to_q.lora_A.weight" in state
    assert "transformer.blocks.1.ffn.net.0.proj.lora_B.weight" in state
    assert "transformer.blocks.0.attn2.to_out.0.lora_A.weight" in state
    save_file(state, str(tmp_path / "lora.safetensors"))
    ref.load_lora_adapter(str(tmp_path / "lora.safetensors"), prefix="transformer", adapter_name="ours")
    torch.testing.assert_close(_diffusers_out(ref, cfg, x, t, ctx), ours, rtol=1e-5, atol=1e-5)
    # the way users load it: a Wan pipeline's load_lora_weights (its key conversion and prefix handling)
    pipe = diffusers.WanPipeline(tokenizer=None, text_encoder=None, vae=None, scheduler=diffusers.UniPCMultistepScheduler(),
                                 transformer=_diffusers_model(cfg, base))
    pipe.load_lora_weights(str(tmp_path / "lora.safetensors"), adapter_name="ours")
    torch.testing.assert_close(_diffusers_out(pipe.transformer, cfg, x, t, ctx), ours, rtol=1e-5, atol=1e-5)


def _fake_run(tmp_path, cfg, net, lora):
    """A checkpoint file as train() writes it (Lightning's layout: model.* weights + hyper-parameters)."""
    from nemo_vfm.models.wan.flavors import wan_objective

    path = tmp_path / "run" / "checkpoints" / "step=00000003.ckpt"
    path.parent.mkdir(parents=True)
    torch.save({"state_dict": {f"model.{k}": v for k, v in net.state_dict().items()}, "global_step": 3,
                "hyper_parameters": {"model_config": cfg, "objective": wan_objective("tiny"), "lora": lora}}, path)
    return tmp_path / "run"


def test_cli_exports_lora_and_merged_diffusers_folder(tmp_path):
    from diffusers import WanTransformer3DModel
    from safetensors import safe_open

    from nemo_vfm.cli.main import main
    from nemo_vfm.inference.checkpoint import load_checkpoint

    cfg = _tiny()
    lora = LoRAConfig(rank=4, alpha=8.0, targets=WAN_TARGETS)
    net, _ = _lora_wan(cfg, lora)
    run = _fake_run(tmp_path, cfg, net, lora)
    x, t, ctx = _inputs(cfg)
    with torch.no_grad():
        ours = net(x, t, ctx)

    assert main(["export", "--ckpt", str(run), "--format", "lora", "--out", str(tmp_path / "l.safetensors")]) == 0
    with safe_open(str(tmp_path / "l.safetensors"), "pt") as f:
        keys = set(f.keys())
        meta = json.loads(f.metadata()["nemo_vfm_lora"])
    assert len(keys) == 2 * 2 * len(WAN_TARGETS) and meta["rank"] == 4 and meta["alpha"] == 8.0

    assert main(["export", "--ckpt", str(run), "--format", "diffusers", "--out", str(tmp_path / "d")]) == 0
    ref = WanTransformer3DModel.from_pretrained(str(tmp_path / "d")).eval()
    torch.testing.assert_close(_diffusers_out(ref, cfg, x, t, ctx), ours, rtol=1e-5, atol=1e-5)

    loaded = load_checkpoint(run)  # vfm generate's loader: LoRA merged into a plain model
    assert not any(".lora_" in k for k in loaded.net.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(loaded.net(x, t, ctx), ours, rtol=1e-5, atol=1e-5)


def test_export_errors(tmp_path):
    from nemo_vfm.inference.export import export

    cfg = _tiny()
    torch.manual_seed(0)
    run = _fake_run(tmp_path, cfg, cfg.build(), None)
    with pytest.raises(ValueError, match="not a LoRA run"):
        export(run, "lora", tmp_path / "x.safetensors")
    with pytest.raises(ValueError, match="format"):
        export(run, "onnx", tmp_path / "x")
