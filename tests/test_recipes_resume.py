"""Every registered factory, shrunk to CPU size, trains 2 steps, stops, and the same command resumes it.

The recipe keeps its objective, strategy knobs (FSDP, activation checkpointing, compile="auto", fused q/k/v...),
LoRA and EMA settings; the network becomes its family's tiny flavor, the parallel sizes become 1 (one process),
and data that needs files (Energon shards, DreamBooth clips) becomes mock latents of the same shape contract.
Wan recipes start from a tiny random Wan folder, as they would from the published one.
"""

import sys
from pathlib import Path

import catalogue
import fiddle as fdl
import pytest
from nemo_run.config import get_type_namespace

from nemo_vfm.data.synthetic import MockLatentDataModule, ShapesDataModule
from nemo_vfm.lightning.callbacks import read_metrics
from nemo_vfm.train import train

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "launchers"))

import train as launcher  # noqa: E402  (launchers/train.py)

launcher.register_recipes()
# the Cosmos recipes train from a saved Cosmos folder: tests/test_recipes_cosmos.py runs this same check on one
FACTORIES = sorted(key[-1] for key in catalogue._get_all([get_type_namespace(train)]) if "_cosmos_" not in key[-1])
COSMOS = sorted(key[-1] for key in catalogue._get_all([get_type_namespace(train)]) if "_cosmos_" in key[-1])
SIZE = dict(num_layers=2, hidden_size=32, num_heads=2)
ONE_PROCESS = dict(tensor_model_parallel_size=1, context_parallel_size=1, pipeline_model_parallel_size=1,
                   expert_model_parallel_size=1, data_parallel_replicate_size=1, sequence_parallel=False)


def _shrink(name: str, root: Path, wan_folder) -> fdl.Config:
    recipe = catalogue._get((get_type_namespace(train), name))()
    cls = recipe.model.__fn_or_cls__.__name__
    if cls == "WanConfig":
        from nemo_vfm.models.wan.convert import read_config

        recipe.model = fdl.Config(recipe.model.__fn_or_cls__, **vars(read_config(wan_folder, pretrained=str(wan_folder))))
    elif cls == "kandinsky6_config":  # sizes come from a flavor (or the pretrained folder's config.json)
        recipe.model.flavor = "tiny"
    elif cls == "LTX2Config":
        from nemo_vfm.models.ltx2.flavors import ltx2_config

        recipe.model = fdl.Config(recipe.model.__fn_or_cls__, **{**vars(ltx2_config("tiny")), "pretrained": None})
    else:
        for k, v in SIZE.items():
            setattr(recipe.model, k, v)
        if cls == "MovieGenConfig":
            recipe.model.num_kv_heads, recipe.model.ffn_size = 1, 64
        if cls == "STDiTConfig":
            recipe.model.ffn_size = 64
        if getattr(recipe.model, "attention_dense_blocks", ()):  # the sparse recipes' dense blocks, in 2 layers
            recipe.model.attention_dense_blocks = (0,)
    model = fdl.build(recipe.model)
    if recipe.data.__fn_or_cls__ is ShapesDataModule:
        recipe.data.num_clips, recipe.data.batch_size = 4, 2
    else:  # mock latents in the shape the network takes
        ctx = getattr(model, "context_dim", None)
        recipe.data = fdl.Config(MockLatentDataModule, latent_channels=model.in_channels - getattr(model, "cond_channels", 0),
                                 num_frames=2 * model.patch_size[0], height=4 * model.patch_size[1],
                                 width=4 * model.patch_size[2], context_dim=ctx, context_length=4 if ctx else 0,
                                 num_classes=getattr(model, "num_classes", 0), batch_size=2, num_samples=8,
                                 pooled_dim=getattr(model, "pooled_dim", None))  # pooled CLIP text: Kandinsky 6
        if cls == "LTX2Config":  # the audio stream's latents (unless video only) and IC-LoRA's reference video
            objective = fdl.build(recipe.objective)
            audio = (model.audio_in_channels // model.audio_mel_bins, 5, model.audio_mel_bins)  # (Ca, La, M)
            recipe.data.audio_shape = None if objective.video_only else audio
            recipe.data.context_dim, recipe.data.context_length = model.caption_channels, 4
            recipe.data.reference_shape = (model.in_channels, 2, 4, 4) if "_ic" in name else None
    if isinstance(recipe.trainer.strategy, fdl.Config):
        for k, v in ONE_PROCESS.items():
            setattr(recipe.trainer.strategy, k, v)
        recipe.trainer.strategy.microbatches = None
    t = recipe.trainer
    t.accelerator, t.devices, t.num_nodes = "cpu", 1, 1  # bf16-mixed becomes 32-true on a CPU (train())
    t.max_steps, t.checkpoint_every_n_steps, t.log_every_n_steps, t.enable_progress_bar = 2, 2, 1, False
    recipe.sampling.num_samples, recipe.sampling.num_steps = 1, 2
    recipe.log.root, recipe.log.name, recipe.log.tensorboard = str(root), name, False
    recipe.init_from = None  # staged and DreamBooth recipes start fresh here (init_from: test_recipes_upstream.py)
    return recipe


def test_the_cosmos_recipes_are_checked_elsewhere():
    """A new Cosmos factory must join tests/test_recipes_cosmos.py's list (which trains and resumes each)."""
    checked = Path(__file__).with_name("test_recipes_cosmos.py").read_text()
    assert COSMOS and all(f'"{name}"' in checked for name in COSMOS)


@pytest.mark.parametrize("name", FACTORIES)
def test_factory_resumes_its_own_run(name, tmp_path, wan_folder, capsys):
    first = fdl.build(_shrink(name, tmp_path, wan_folder))()
    assert first["step"] == 2 and Path(first["checkpoint"]).exists(), first
    again = _shrink(name, tmp_path, wan_folder)
    again.trainer.max_steps = 3
    second = fdl.build(again)()
    assert "resuming from" in capsys.readouterr().out
    assert second["step"] == 3
    steps = [r["step"] for r in read_metrics(tmp_path / name / "metrics.jsonl") if "loss" in r]
    assert steps == [1, 2, 3], steps
