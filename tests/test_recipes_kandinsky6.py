"""Kandinsky 6 recipes: both build and serialize; LoRA and full fine-tuning from a tiny random Kandinsky 6 folder
(diffusers layout) train two steps on CPU with mock data (latents, Qwen-width text, CLIP-width pooled text); the
LoRA adapters export in the diffusers layout, which diffusers' Kandinsky6Transformer3DModel loads and reproduces our
merged output with; ComfyUI export raises naming what is missing."""

from pathlib import Path

import fiddle as fdl
import pytest
import torch

import nemo_vfm_recipes.kandinsky6 as k6
from nemo_vfm.diffusion.flow_matching import FlowMatching

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", ["lora_kandinsky6_3b", "finetune_kandinsky6_3b"])
def test_recipe_builds_and_serializes(name):
    from nemo_run.core.serialization.yaml import YamlSerializer

    recipe = getattr(k6, name)()
    doc = getattr(k6, name).__doc__
    assert "CLI" in doc and "Python" in doc
    assert "docs/benchmarks.md" in doc or "not measured" in doc  # where its measured speed is, or that it is not
    model, objective = fdl.build(recipe.model), fdl.build(recipe.objective)
    assert model.hidden_size == 1792 and 3.3e9 < model.build("meta").num_params() < 3.5e9
    assert isinstance(objective, FlowMatching) and objective.time_sampling == "uniform"
    assert recipe.trainer.strategy.fsdp and (recipe.lora is not None) == name.startswith("lora")
    assert "model:" in YamlSerializer().serialize(recipe)


def _tiny_folder(tmp_path):
    from nemo_vfm.models.kandinsky6 import convert as C
    from nemo_vfm.models.kandinsky6.flavors import kandinsky6_config

    cfg = kandinsky6_config("tiny")
    torch.manual_seed(0)
    base = cfg.build().state_dict()
    return cfg, C.save_weights({k: v + 0.05 * torch.randn_like(v) for k, v in base.items()}, tmp_path / "k6", cfg)


def _on_mock(recipe, folder):
    from nemo_vfm.data.synthetic import MockLatentDataModule

    recipe.model.pretrained = str(folder)
    recipe.data = fdl.Config(MockLatentDataModule, latent_channels=4, num_frames=3, height=4, width=4,
                             context_dim=16, context_length=4, pooled_dim=8, batch_size=2, num_samples=8)
    return recipe


def test_full_finetune_trains_two_steps(tmp_path, cpu_steps):
    _, folder = _tiny_folder(tmp_path)
    recipe = k6.finetune_kandinsky6_3b()
    recipe.optim.lr = 1e-3
    cpu_steps(_on_mock(recipe, folder), tmp_path)


def test_lora_trains_and_exports_for_diffusers(tmp_path, cpu_steps):
    diffusers = pytest.importorskip("diffusers")
    from safetensors.torch import load_file

    from nemo_vfm.inference.checkpoint import load_checkpoint
    from nemo_vfm.inference.export import export

    cfg, folder = _tiny_folder(tmp_path)
    recipe = k6.lora_kandinsky6_3b()
    recipe.lora.rank, recipe.lora.frozen_dtype, recipe.optim.lr = 4, None, 1e-2
    out = cpu_steps(_on_mock(recipe, folder), tmp_path)
    out_file = export(out["checkpoint"], "lora", tmp_path / "lora.safetensors")
    lora = load_file(str(out_file))
    assert "transformer.visual_transformer_blocks.0.video_dec_block.self_attention.to_query.lora_A.weight" in lora
    assert "transformer.visual_transformer_blocks.1.video_dec_block.feed_forward.net.0.proj.lora_B.weight" in lora
    assert any(v.abs().max() > 0 for k, v in lora.items() if "lora_B" in k)  # trained
    net = load_checkpoint(out["checkpoint"]).net.eval()  # the LoRA merged into the base
    ref = diffusers.Kandinsky6Transformer3DModel.from_pretrained(str(folder)).eval()
    ref.load_lora_adapter(lora, adapter_name="ours")
    g = torch.Generator().manual_seed(3)
    x, t_ = torch.randn(1, 4, 3, 4, 4, generator=g), torch.rand(1, generator=g)
    ctx, pooled = torch.randn(1, 4, 16, generator=g), torch.randn(1, 8, generator=g)
    with torch.no_grad():
        lat = x.permute(0, 2, 3, 4, 1)
        want = ref(hidden_states=torch.cat([lat, torch.zeros(1, 3, 4, 4, 5)], -1), encoder_hidden_states=ctx,
                   pooled_projections=pooled, timestep=t_ * 1000, return_dict=False)[0].permute(0, 4, 1, 2, 3)
        got = net(x, t_, ctx, None, pooled)
    assert (got - want).abs().max() <= 1e-4 * want.abs().max()
    with pytest.raises(NotImplementedError, match="ComfyUI"):
        export(out["checkpoint"], "comfyui", tmp_path / "comfy.safetensors")
