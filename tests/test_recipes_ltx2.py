"""LTX-2 recipes: every factory builds and serializes; a dry run through launchers/train.py takes overrides; LoRA
(audio + video, video only, IC-LoRA) and full fine-tuning from a tiny random LTX-2 folder train two steps on CPU on
mock batches; the audio + video objective is the two flow-matching losses of one draw."""

import subprocess
import sys
from pathlib import Path

import fiddle as fdl
import pytest
import torch

import nemo_vfm_recipes.ltx2 as L
from nemo_vfm.diffusion.audio_video import AudioVideoFlowMatching

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", ["lora_ltx2", "lora_ltx2_video", "lora_ltx2_ic", "finetune_ltx2"])
def test_recipe_builds_and_serializes(name):
    from nemo_run.core.serialization.yaml import YamlSerializer

    recipe = getattr(L, name)()
    doc = getattr(L, name).__doc__
    assert "CLI" in doc and "Python" in doc
    assert "docs/benchmarks.md" in doc or "not measured" in doc  # where its measured speed is, or that it is not
    model, objective = fdl.build(recipe.model), fdl.build(recipe.objective)
    assert model.rope_type == "split" and model.num_layers == 48 and model.hidden_size == 4096
    assert isinstance(objective, AudioVideoFlowMatching) and objective.video_only == name.endswith("video")
    assert recipe.trainer.strategy.fsdp and (recipe.lora is not None) == name.startswith("lora")
    if recipe.lora is not None:
        assert ("audio_attn1.to_q" in recipe.lora.targets) != name.endswith("video")
    assert "model:" in YamlSerializer().serialize(recipe)


def test_dryrun_with_overrides():
    r = subprocess.run([sys.executable, str(ROOT / "launchers" / "train.py"), "--factory", "lora_ltx2", "--yes",
                        "--dryrun", "lora.rank=8", "model.pretrained=/w/LTX2"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "/w/LTX2" in r.stdout and "rank=8" in r.stdout and "Dry run" in r.stdout


def _tiny():
    from nemo_vfm.models.ltx2.flavors import ltx2_config

    return ltx2_config("tiny")


@pytest.mark.parametrize("video_only,ic,full", [(False, False, False), (True, False, False), (False, True, False),
                                                (False, False, True)],
                         ids=["audio_video", "video_only", "ic_lora", "finetune"])
def test_trains_two_steps_from_a_folder_on_mock_data(tmp_path, video_only, ic, full, cpu_steps):
    from nemo_vfm.data.synthetic import MockLatentDataModule
    from nemo_vfm.models.ltx2 import convert as C
    from nemo_vfm.models.ltx2.model import LTX2Config

    cfg = _tiny()
    torch.manual_seed(0)
    folder = C.save_weights(cfg.build().state_dict(), tmp_path / "ltx2", cfg)
    recipe = L.finetune_ltx2() if full else L.lora_ltx2_ic() if ic else L.lora_ltx2()
    if video_only:
        recipe = L.with_video_only(recipe)
    recipe.model = fdl.Config(LTX2Config, **{**vars(cfg), "pretrained": str(folder)})
    recipe.data = fdl.Config(MockLatentDataModule, latent_channels=8, num_frames=2, height=3, width=2,
                             context_dim=16, context_length=4, batch_size=2, num_samples=4,
                             audio_shape=None if video_only else (2, 5, 4), reference_shape=(8, 2, 3, 2) if ic else None)
    if not full:
        recipe.lora.rank, recipe.lora.frozen_dtype, recipe.optim.lr = 4, None, 1e-2
    cpu_steps(recipe, tmp_path)


def test_objective_is_both_streams_losses_of_one_draw():
    net = _tiny().build()
    with torch.no_grad():
        for p in net.parameters():
            p.add_(0.05 * torch.randn_like(p))
    g = torch.Generator().manual_seed(0)
    x0, a0 = torch.randn(2, 8, 2, 3, 2, generator=g), torch.randn(2, 2, 5, 4, generator=g)
    cond = {"context": torch.randn(2, 4, 16, generator=g), "context_mask": torch.ones(2, 4, dtype=torch.bool),
            "audio_latents": a0, "audio_context": torch.randn(2, 4, 16, generator=g)}
    obj = AudioVideoFlowMatching(video_weight=1.0, audio_weight=0.5)
    loss, logs = obj.training_loss(net, x0, cond, generator=torch.Generator().manual_seed(3))
    g = torch.Generator().manual_seed(3)  # the same draws by hand: time, video noise, audio noise
    t = obj.sample_time(2, g)
    n, m = torch.randn(x0.shape, generator=g), torch.randn(a0.shape, generator=g)
    tb = t.view(-1, 1, 1, 1)
    v, u = net((1 - tb[..., None]) * x0 + tb[..., None] * n, t, cond["context"], cond["context_mask"],
               audio=(1 - tb) * a0 + tb * m, audio_timesteps=t, audio_context=cond["audio_context"])
    mv, ma = ((v - (n - x0)) ** 2).mean(), ((u - (m - a0)) ** 2).mean()
    torch.testing.assert_close(loss, mv + 0.5 * ma)
    torch.testing.assert_close(logs["mse_audio"], ma)
    with pytest.raises(ValueError, match="video_only=True"):
        obj.training_loss(net, x0, {k: v for k, v in cond.items() if k != "audio_latents"})
    only, logs = AudioVideoFlowMatching(video_only=True).training_loss(net, x0, cond)
    assert logs["mse_audio"] == 0 and only > 0
