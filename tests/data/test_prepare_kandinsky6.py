"""Kandinsky 6 data: ``vfm prepare`` with the Kandinsky 6 text encoders (``qwen2_5_vl template=kandinsky6`` and
``clip_pooled=DIR``) and the HunyuanVideo VAE stores the pipeline's prompt states and a ``pooled_text.npy`` part; the
Energon loader yields ``pooled_context`` with the buckets (packing refuses it); the LoRA recipe trains on it, and
``vfm generate`` samples from that run with the encoders it recorded."""

import importlib.util
from pathlib import Path

import pytest
import torch

diffusers = pytest.importorskip("diffusers")
pytest.importorskip("transformers")

_GEN = Path(__file__).resolve().parents[1] / "inference" / "test_kandinsky6_generate.py"


def _generate_test_module():
    spec = importlib.util.spec_from_file_location("k6_generate_helpers", _GEN)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """(pipeline folder, prepared dataset) of 4 clips of 5 frames at 32 x 32."""
    from nemo_vfm.data.prepare import PrepareConfig, prepare
    from nemo_vfm.data.synthetic_inputs import write_folder

    G = _generate_test_module()
    tmp = tmp_path_factory.mktemp("k6_data")
    pipe = G.folder.__wrapped__(tmp_path_factory)
    raw = write_folder(tmp / "raw", 4, sizes=((5, 32, 32),))
    res = prepare(PrepareConfig(input=str(raw), output=str(tmp / "k6"), tokenizer="hunyuan",
                                tokenizer_kwargs={"path": str(pipe)}, text_encoder="qwen2_5_vl",
                                text_encoder_kwargs={"path": str(pipe), "template": "kandinsky6", "max_length": 32},
                                clip_pooled=str(pipe), latent_dtype="float32", progress=False))
    assert res.written == 4 and not res.errors and res.indexed
    return pipe, tmp / "k6"


def test_loader_yields_the_pipelines_pooled_text(prepared):
    from nemo_vfm.data.energon_datamodule import EnergonDataModule
    from nemo_vfm.tokenizers.clip_pooled import ClipPooledEncoder

    pipe, data_path = prepared
    clip = ClipPooledEncoder(pipe)
    data = EnergonDataModule(path=str(data_path), micro_batch_size=2, shuffle_buffer_size=4)
    batch = next(iter(data.train_dataloader()))
    assert batch.latents.shape[:2] == (2, 4) and batch.context.shape[-1] == 16
    want = clip.encode([m["caption"] for m in batch.meta])
    assert batch.pooled_context.shape == (2, 8) and torch.equal(batch.pooled_context, want)
    assert torch.equal(batch["pooled_context"], batch.pooled_context)


def test_packing_refuses_pooled_text(prepared):
    from nemo_vfm.data.energon_datamodule import EnergonDataModule

    with pytest.raises(ValueError, match="clip_pooled.*max_seq_length=None"):
        EnergonDataModule(path=str(prepared[1]), micro_batch_size=1, max_seq_length=64)


def test_lora_recipe_trains_on_prepared_data(prepared, tmp_path):
    import fiddle as fdl

    import nemo_vfm_recipes.kandinsky6 as k6
    from nemo_vfm_recipes.data import energon_datamodule

    pipe, data_path = prepared
    recipe = k6.lora_kandinsky6_3b()
    recipe.model.pretrained = str(pipe)
    recipe.data = energon_datamodule(path=str(data_path), micro_batch_size=2, num_workers=0)
    recipe.lora.rank, recipe.lora.frozen_dtype, recipe.optim.lr = 4, None, 1e-2
    recipe.trainer.strategy.fsdp = False
    recipe.trainer.strategy.activation_checkpointing = "none"
    t = recipe.trainer
    t.accelerator, t.devices, t.max_steps, t.checkpoint_every_n_steps, t.enable_progress_bar = "cpu", 1, 2, 2, False
    t.precision = "32-true"
    recipe.log.root, recipe.log.tensorboard = str(tmp_path / "runs"), False
    out = fdl.build(recipe)()
    assert out["step"] == 2 and torch.isfinite(torch.tensor(out["loss"]))
    # the run records the dataset's encoders (VAE, Qwen2.5-VL template, CLIP): vfm generate samples from it
    from nemo_vfm.cli.main import main

    videos = tmp_path / "videos"
    rc = main(["generate", "--ckpt", str(out["checkpoint"]), "--prompt", "a red square moving left", "--frames", "5",
               "--height", "32", "--width", "32", "--device", "cpu", "--steps", "2", "--guidance", "4",
               "--out", str(videos)])
    assert rc == 0 and list(videos.rglob("*.mp4"))
