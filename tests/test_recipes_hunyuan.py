"""HunyuanVideo 1.5 recipes: both build and serialize; a dry run through launchers/train.py takes overrides; LoRA
fine-tuning from a tiny random HunyuanVideo folder trains a few steps on CPU, and its adapters export in the
diffusers layout, which diffusers' HunyuanVideo15Transformer3DModel loads and reproduces our merged output with.
(Two steps + resume of both factories: tests/test_recipes_resume.py.)"""

import subprocess
import sys
from pathlib import Path

import fiddle as fdl
import pytest
import torch

import nemo_vfm_recipes.hunyuan as hy
from nemo_vfm.diffusion.flow_matching import FlowMatching

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", ["lora_hunyuanvideo_1_5", "finetune_hunyuanvideo_1_5"])
def test_recipe_builds_and_serializes(name):
    from nemo_run.core.serialization.yaml import YamlSerializer

    recipe = getattr(hy, name)()
    doc = getattr(hy, name).__doc__
    assert "CLI" in doc and "Python" in doc
    assert "docs/benchmarks.md" in doc or "not measured" in doc  # where its measured speed is, or that it is not
    model, objective = fdl.build(recipe.model), fdl.build(recipe.objective)
    assert model.in_channels == 65 and model.out_channels == 32 and model.rope_axes_dim == (16, 56, 56)
    assert 8.2e9 < model.build("meta").num_params() < 8.5e9
    assert isinstance(objective, FlowMatching) and objective.shift == 5.0 and objective.time_sampling == "uniform"
    assert recipe.trainer.strategy.fsdp and (recipe.lora is not None) == name.startswith("lora")
    assert "model:" in YamlSerializer().serialize(recipe)


def test_dryrun_with_overrides():
    r = subprocess.run([sys.executable, str(ROOT / "launchers" / "train.py"), "--factory", "lora_hunyuanvideo_1_5",
                        "--yes", "--dryrun", "lora.rank=8", "model.pretrained=/w/HY15"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "/w/HY15" in r.stdout and "rank=8" in r.stdout and "Dry run" in r.stdout


def test_lora_trains_from_a_folder_and_exports_for_diffusers(tmp_path):
    pytest.importorskip("diffusers")
    from diffusers import HunyuanVideo15Transformer3DModel

    from nemo_vfm.data.synthetic import MockLatentDataModule
    from nemo_vfm.inference.checkpoint import load_checkpoint
    from nemo_vfm.inference.export import export
    from nemo_vfm.models.hunyuan import convert as C
    from nemo_vfm.models.hunyuan.model import HunyuanVideoConfig

    cfg = HunyuanVideoConfig(num_layers=2, hidden_size=32, num_heads=2, num_refiner_layers=1, in_channels=9,
                             out_channels=4, text_dim=16, glyph_dim=8, image_dim=12)
    torch.manual_seed(0)
    base = cfg.build().state_dict()
    folder = C.save_weights({k: v + 0.05 * torch.randn_like(v) for k, v in base.items()}, tmp_path / "hy", cfg)
    recipe = hy.lora_hunyuanvideo_1_5()
    recipe.model = fdl.Config(HunyuanVideoConfig, **{**vars(cfg), "pretrained": str(folder)})
    recipe.data = fdl.Config(MockLatentDataModule, latent_channels=4, num_frames=2, height=4, width=4,
                             context_dim=16, context_length=4, batch_size=2, num_samples=8)
    recipe.lora.rank, recipe.lora.frozen_dtype, recipe.optim.lr = 4, None, 1e-2
    recipe.trainer.strategy.fsdp = False
    t = recipe.trainer
    t.accelerator, t.devices, t.max_steps, t.checkpoint_every_n_steps, t.enable_progress_bar = "cpu", 1, 3, 3, False
    recipe.log.root, recipe.log.tensorboard = str(tmp_path / "runs"), False
    out = fdl.build(recipe)()
    assert out["step"] == 3
    out_file = export(out["checkpoint"], "lora", tmp_path / "lora.safetensors")
    from safetensors.torch import load_file

    lora = load_file(str(out_file))
    assert "transformer.transformer_blocks.0.attn.to_q.lora_A.weight" in lora
    assert "transformer.transformer_blocks.1.ff_context.net.0.proj.lora_B.weight" not in lora  # unread, not built
    assert any(v.abs().max() > 0 for k, v in lora.items() if "lora_B" in k)  # trained
    # diffusers + peft with the exported adapters == our merged network
    net = load_checkpoint(out["checkpoint"]).net  # the LoRA merged into the base
    ref = HunyuanVideo15Transformer3DModel.from_pretrained(str(folder)).eval()
    ref.load_lora_adapter(lora, adapter_name="ours")  # keys under transformer., as pipe.load_lora_weights reads
    g = torch.Generator().manual_seed(3)
    x, t_, ctx = torch.randn(1, 4, 2, 4, 4, generator=g), torch.rand(1, generator=g), torch.randn(1, 5, 16, generator=g)
    mask = torch.ones(1, 5, dtype=torch.long)
    with torch.no_grad():
        want = ref(hidden_states=torch.cat([x, torch.zeros(1, 5, 2, 4, 4)], 1), timestep=t_ * 1000,
                   encoder_hidden_states=ctx, encoder_attention_mask=mask,
                   encoder_hidden_states_2=torch.zeros(1, 3, 8), encoder_attention_mask_2=torch.zeros(1, 3),
                   image_embeds=torch.zeros(1, 4, 12), return_dict=False)[0]
        got = net.eval()(x, t_, ctx, mask.bool())
    assert (got - want).abs().max() <= 1e-4 * want.abs().max()
    whole = export(out["checkpoint"], "diffusers", tmp_path / "merged")  # the whole model, LoRA merged
    merged = HunyuanVideo15Transformer3DModel.from_pretrained(str(whole)).eval()
    with torch.no_grad():
        again = merged(hidden_states=torch.cat([x, torch.zeros(1, 5, 2, 4, 4)], 1), timestep=t_ * 1000,
                       encoder_hidden_states=ctx, encoder_attention_mask=mask,
                       encoder_hidden_states_2=torch.zeros(1, 3, 8), encoder_attention_mask_2=torch.zeros(1, 3),
                       image_embeds=torch.zeros(1, 4, 12), return_dict=False)[0]
    assert (again - got).abs().max() <= 1e-5 * got.abs().max()
