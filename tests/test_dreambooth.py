"""DreamBooth on the quickstart DiT: 8 clips of one subject (a red square moving right on black) with an
instance prompt, prior preservation from class samples that the base model draws; after fine-tuning, the
instance prompt's samples show a red object on a dark background, the base model's do not. On a tiny random
Wan pipeline folder: the Wan path (Wan VAE + UMT5, class videos from the base Wan, LoRA) runs end to end.

Measured with a colour check (share of pixels near the subject's red, mean brightness of the rest) and the
shapes sample-quality metric (``nemo_vfm.evaluation.shapes``, against the subject's description "a red square
moving right on a black background"): its object-colour criterion; its background (85% of the other pixels
within 40 of black), count and motion criteria are not reached by this CPU-sized run (100 steps of a
2-layer DiT).
"""

import numpy as np
import pytest
import torch

from nemo_vfm.data.dreambooth import DreamBoothDataModule
from nemo_vfm.data.synthetic_video import COLORS, ShapeClipSpec, render_shape_clip
from nemo_vfm.io.video import write_video

RED = np.array(COLORS["red"], np.int16)
PROMPT = "a sks square moving right"
ENC = dict(tokenizer="identity", tokenizer_kwargs={"spatial_compression": 2}, text_encoder="hash",
           text_encoder_kwargs={"dim": 64, "max_length": 12})


def _instance_clips(folder, n=8, frames=8):
    spec = ShapeClipSpec(num_frames=frames, height=32, width=32)
    rng = np.random.default_rng(0)
    for i in range(n):
        start = (float(rng.uniform(0.2, 0.8)), float(rng.uniform(0.2, 0.8)))
        write_video(folder / f"clip{i}.mp4", render_shape_clip(spec, "square", "red", "black", "right", start))


def _red_share(videos_NCTHW) -> tuple[float, float]:
    """(mean share of pixels within 60 of the subject's red, mean brightness of the other pixels)."""
    from nemo_vfm.io.video import tensor_to_frames

    shares, rest = [], []
    for v in videos_NCTHW:
        f = tensor_to_frames(v).astype(np.int16)  # (T, H, W, 3)
        red = np.abs(f - RED).max(-1) <= 60
        shares.append(red.mean())
        rest.append(f[~red].mean() if (~red).any() else 0.0)
    return float(np.mean(shares)), float(np.mean(rest))


def test_data_module_weights_and_errors(tmp_path):
    from PIL import Image

    (tmp_path / "inst").mkdir()
    Image.fromarray(np.full((40, 50, 3), 200, np.uint8)).save(tmp_path / "inst" / "a.png")  # an image: a still clip
    (tmp_path / "cls").mkdir()
    _instance_clips(tmp_path / "cls", n=3)
    dm = DreamBoothDataModule(instance_data=str(tmp_path / "inst"), instance_prompt=PROMPT,
                              class_data=str(tmp_path / "cls"), class_prompt="a square", prior_preservation=True,
                              num_class_samples=3, prior_loss_weight=0.5, batch_size=4, **ENC)
    assert dm.missing_class_samples == 0 and dm.latent_shape == (12, 8, 16, 16)
    dm.setup()
    d = dm.dataset.tensors
    assert d["latents"].shape[1:] == (12, 8, 16, 16) and d["loss_mask"].shape[1:] == (8, 16, 16)
    weights = sorted({float(w) for w in d["loss_mask"][:, 0, 0, 0]})
    assert weights == [0.5, 1.0]
    assert torch.equal(d["latents"][0, :, 0], d["latents"][0, :, 7])  # the image repeated over the frames
    with pytest.raises(ValueError, match="class_prompt"):
        DreamBoothDataModule(instance_data="x", instance_prompt=PROMPT, prior_preservation=True)
    dm = DreamBoothDataModule(instance_data=str(tmp_path / "nothing"), instance_prompt=PROMPT, **ENC)
    with pytest.raises(ValueError, match="no videos or images"):
        dm.setup()


@pytest.mark.slow  # ~1-2 min on 2 idle CPU cores (tens of minutes on a loaded machine)
def test_dreambooth_quickstart_learns_the_subject(tmp_path):
    from nemo_vfm.diffusion.edm import EDM
    from nemo_vfm.inference.generate import SamplingConfig, generate_videos
    from nemo_vfm.lightning.module import OptimConfig
    from nemo_vfm.models.dit.flavors import FLAVORS
    from nemo_vfm.models.dit.model import DiTConfig
    from nemo_vfm.train import ExperimentConfig, TrainerConfig, train

    torch.manual_seed(0)
    # the quickstart DiT's architecture at half depth and width, on 4-frame clips (256 tokens): CPU-sized
    model = DiTConfig(**{**FLAVORS["quickstart"], "num_layers": 2, "hidden_size": 64}, in_channels=12,
                      patch_size=(1, 2, 2), context_dim=64)
    objective = EDM(sigma_data=0.2)
    base = tmp_path / "base.ckpt"  # a base checkpoint in train()'s file layout
    torch.save({"state_dict": {f"model.{k}": v for k, v in model.build().state_dict().items()}, "global_step": 0,
                "hyper_parameters": {"model_config": model, "objective": objective}}, base)
    (tmp_path / "inst").mkdir()
    _instance_clips(tmp_path / "inst", frames=4)
    data = DreamBoothDataModule(instance_data=str(tmp_path / "inst"), instance_prompt=PROMPT,
                                class_data=str(tmp_path / "cls"), class_prompt="a square moving right",
                                prior_preservation=True, num_class_samples=4, prior_loss_weight=0.25,
                                num_frames=4, batch_size=8, **ENC)
    assert data.missing_class_samples == 4
    sampling = SamplingConfig(num_steps=8, guidance=3.0, num_samples=1, enabled=False)
    summary = train(model=model, data=data, objective=objective, init_from=str(base), sampling=sampling,
                    trainer=TrainerConfig(max_steps=100, accelerator="cpu", devices=1, precision="32-true",
                                          log_every_n_steps=20, checkpoint_every_n_steps=1000,
                                          enable_progress_bar=False),
                    optim=OptimConfig(lr=1e-3, warmup_steps=10), ema_decay=None, cond_dropout=0.1,
                    log=ExperimentConfig(name="db", root=str(tmp_path), tensorboard=False))
    assert len(list((tmp_path / "cls").glob("class_*.mp4"))) == 4  # drawn by the base model first

    from nemo_vfm.inference.checkpoint import load_checkpoint

    tok, text = data.build_encoders()
    tuned = load_checkpoint(summary["checkpoint"])
    before = load_checkpoint(base)
    sample = SamplingConfig(num_steps=16, guidance=3.0, seed=5)
    after_v, _ = generate_videos(tuned.net, objective, tok, text, [PROMPT] * 4, data.latent_shape, sample)
    before_v, _ = generate_videos(before.net, objective, tok, text, [PROMPT] * 4, data.latent_shape, sample)
    share_after, rest_after = _red_share(after_v)
    share_before, _ = _red_share(before_v)
    # the subject: a red square covers ~9% of each frame in the instance clips
    assert share_after > 0.03 and share_after > 5 * share_before, (share_after, share_before)
    assert rest_after < 60, rest_after  # on a dark background

    from nemo_vfm.evaluation.shapes import format_table, score_videos

    subject = ["a red square moving right on a black background"] * 4
    after, before = score_videos(after_v, subject), score_videos(before_v, subject)
    print("after fine-tuning:\n" + format_table(after) + "\nbase model:\n" + format_table(before))
    # the object-colour criterion (the subject's red covers 1.5-40% of every frame) holds for most samples;
    # the stricter background, count and motion criteria need a longer run than this CPU-sized one
    assert after["rates"]["object_colour"] >= 0.75 > before["rates"]["object_colour"], (after["rates"],
                                                                                         before["rates"])


def test_dreambooth_wan_lora_with_prior_preservation_runs(tmp_path):
    """The dreambooth_wan_1_3b path on a tiny random Wan pipeline folder (CPU): the Wan VAE and UMT5 from the
    folder encode the subject's clips, the base Wan (model.pretrained) draws the class videos first, then LoRA
    trains on both; only the adapters change."""
    import sys
    from pathlib import Path

    pytest.importorskip("diffusers")
    sys.path.insert(0, str(Path(__file__).parent / "inference"))
    from test_wan_generate import _pipeline  # a tiny random Wan pipeline folder

    from nemo_vfm.inference.checkpoint import raw_state_dict, read_checkpoint_info
    from nemo_vfm.inference.generate import SamplingConfig
    from nemo_vfm.models.common.lora import LoRAConfig
    from nemo_vfm.models.wan.convert import load_pretrained, read_config
    from nemo_vfm.models.wan.flavors import wan_objective
    from nemo_vfm.train import ExperimentConfig, TrainerConfig, train

    root = _pipeline(tmp_path / "wan", False)
    (tmp_path / "inst").mkdir()
    spec = ShapeClipSpec(num_frames=5, height=32, width=32)
    for i in range(2):
        write_video(tmp_path / "inst" / f"clip{i}.mp4",
                    render_shape_clip(spec, "square", "red", "black", "right", (0.3 + 0.3 * i, 0.5)))
    data = DreamBoothDataModule(
        instance_data=str(tmp_path / "inst"), instance_prompt="a sks square", class_data=str(tmp_path / "cls"),
        class_prompt="a square", prior_preservation=True, num_class_samples=2, num_frames=5, height=32, width=32,
        fps=16.0, batch_size=2, tokenizer="wan", tokenizer_kwargs={"path": str(root)}, text_encoder="umt5",
        text_encoder_kwargs={"path": str(root), "max_length": 16})
    model = read_config(root, pretrained=str(root))
    out = train(model=model, data=data, objective=wan_objective("tiny"), ema_decay=None, cond_dropout=0.1,
                lora=LoRAConfig(rank=2, alpha=2.0, targets=("self_attn.q", "self_attn.v", "ffn.0")),
                sampling=SamplingConfig(enabled=False, sampler="unipc", num_steps=2, guidance=5.0),
                trainer=TrainerConfig(max_steps=2, accelerator="cpu", devices=1, precision="32-true",
                                      log_every_n_steps=1, checkpoint_every_n_steps=100, enable_progress_bar=False),
                log=ExperimentConfig(name="db_wan", root=str(tmp_path), tensorboard=False))
    assert len(list((tmp_path / "cls").glob("class_*.mp4"))) == 2  # drawn by the base Wan before training
    assert out["step"] == 2 and np.isfinite(out["loss"])
    saved = raw_state_dict(read_checkpoint_info(out["checkpoint"]))
    base = load_pretrained(root).state_dict()
    for k, v in saved.items():
        if ".lora_" not in k:
            assert torch.equal(v, base[k.replace(".base.", ".")]), k  # frozen
    assert any(v.abs().sum() > 0 for k, v in saved.items() if ".lora_B." in k)  # the adapters trained
