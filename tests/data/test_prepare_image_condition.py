"""Wan image-to-video data: `vfm prepare image_condition=wan_i2v` stores first-frame latents, the loader yields
``cond_latents`` (mask + image latents, as diffusers' WanImageToVideoPipeline builds them), and a tiny Wan 2.2
I2V-A14B-like model trains on it through ``train()``; data without the option fails before training."""

import pytest
import torch

diffusers = pytest.importorskip("diffusers")
transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

MEAN = [0.1 * i - 0.8 for i in range(16)]
STD = [0.5 + 0.1 * i for i in range(16)]


def _pipeline(root):
    """A Wan-pipeline-shaped folder: tiny random VAE (16 latent channels, non-trivial statistics) and UMT5 (16 wide)."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers

    torch.manual_seed(0)
    diffusers.AutoencoderKLWan(base_dim=8, z_dim=16, dim_mult=[1, 2, 2, 2], num_res_blocks=1,
                               temperal_downsample=[False, True, True], latents_mean=MEAN,
                               latents_std=STD).save_pretrained(root / "vae")
    cfg = transformers.UMT5Config(vocab_size=40, d_model=16, d_kv=4, d_ff=32, num_layers=1, num_heads=4)
    transformers.UMT5EncoderModel(cfg).save_pretrained(str(root / "text_encoder"))
    words = "a red green blue yellow white purple circle square triangle moving left right up down on background"
    tk = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tk.normalizer, tk.pre_tokenizer = normalizers.Lowercase(), pre_tokenizers.Whitespace()
    tk.train_from_iterator([words], trainers.WordLevelTrainer(special_tokens=["<pad>", "</s>", "<unk>"]))
    tk.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    transformers.PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", eos_token="</s>",
                                         unk_token="<unk>").save_pretrained(str(root / "tokenizer"))
    return root


@pytest.fixture(scope="module")
def wan_i2v_data(tmp_path_factory):
    """(pipeline folder, raw clips, prepared with image_condition=wan_i2v, prepared without, prepare result)."""
    from nemo_vfm.data.prepare import PrepareConfig, prepare
    from nemo_vfm.data.synthetic_inputs import write_folder

    tmp = tmp_path_factory.mktemp("wan_i2v")
    pipe = _pipeline(tmp / "pipe")
    # two buckets (9 frames 32x32 -> latents 3x4x4; 5 frames 32x48 -> 2x4x6) and an image, which is skipped
    raw = write_folder(tmp / "raw", 5, sizes=((9, 32, 32), (5, 32, 48), (1, 32, 32)))
    kw = dict(input=str(raw), tokenizer="wan", tokenizer_kwargs={"path": str(pipe)}, text_encoder="umt5",
              text_encoder_kwargs={"path": str(pipe), "max_length": 16}, latent_dtype="float32", progress=False)
    res = prepare(PrepareConfig(output=str(tmp / "i2v"), image_condition="wan_i2v", **kw))
    plain = prepare(PrepareConfig(output=str(tmp / "t2v"), **kw))
    assert plain.written == 5 and not plain.errors
    return pipe, raw, tmp / "i2v", tmp / "t2v", res


def _pipeline_cond(pipe, frames_THWC):
    """``cond_latents (20, t, h, w)`` built as ``WanImageToVideoPipeline.prepare_latents`` does, with the VAE itself."""
    from nemo_vfm.io.video import frames_to_tensor

    vae = diffusers.AutoencoderKLWan.from_pretrained(str(pipe / "vae")).eval()
    video = frames_to_tensor(frames_THWC)[None]  # (1, 3, F, H, W)
    num_frames, height, width = video.shape[2:]
    image = video[:, :, :1]
    cond = torch.cat([image, image.new_zeros(1, 3, num_frames - 1, height, width)], dim=2)
    with torch.no_grad():
        lat = vae.encode(cond).latent_dist.mode()
    lat = (lat - torch.tensor(MEAN).view(1, 16, 1, 1, 1)) * (1.0 / torch.tensor(STD).view(1, 16, 1, 1, 1))
    tc, lh, lw = 4, height // 8, width // 8
    mask = torch.ones(1, 1, num_frames, lh, lw)
    mask[:, :, list(range(1, num_frames))] = 0
    first = torch.repeat_interleave(mask[:, :, 0:1], dim=2, repeats=tc)
    mask = torch.concat([first, mask[:, :, 1:, :]], dim=2).view(1, -1, tc, lh, lw).transpose(1, 2)
    return torch.cat([mask, lat], dim=1)[0]


def test_mask_matches_the_pipeline_and_rejects_bad_frame_counts():
    from nemo_vfm.data.batch import wan_i2v_mask

    for frames, tc in ((9, 4), (5, 4), (1, 4), (7, 2)):
        t = 1 + (frames - 1) // tc
        mask = torch.ones(1, 1, frames, 3, 5)
        mask[:, :, 1:] = 0
        first = torch.repeat_interleave(mask[:, :, :1], dim=2, repeats=tc)
        want = torch.concat([first, mask[:, :, 1:]], dim=2).view(1, -1, tc, 3, 5).transpose(1, 2)[0]
        assert torch.equal(wan_i2v_mask(frames, t, 3, 5, tc), want)
    with pytest.raises(ValueError, match="1 \\+ 4\\*k frames"):
        wan_i2v_mask(6, 2, 3, 5, 4)


def test_prepare_stores_first_frame_latents_and_loader_yields_pipeline_cond_latents(wan_i2v_data):
    from nemo_vfm.data.energon_datamodule import EnergonDataModule
    from nemo_vfm.data.sources import iter_inputs

    pipe, raw, i2v, _, res = wan_i2v_data
    assert res.written == 4 and res.indexed
    assert [e["source"].endswith(".png") for e in res.errors] == [True]  # the image: no frame to condition on
    assert "image cannot be conditioned" in res.errors[0]["reason"]

    data = EnergonDataModule(path=str(i2v), micro_batch_size=2, shuffle_buffer_size=8)
    assert data.image_condition == "wan_i2v"
    frames = {item.source: item.load()[0] for item in iter_inputs(str(raw))}
    shapes, checked = set(), 0
    for i, batch in enumerate(data.train_dataloader()):
        b, c, t, h, w = batch.latents.shape
        assert batch.cond_latents.shape == (b, 20, t, h, w)  # buckets keep one shape, cond included
        shapes.add((t, h, w))
        for j, meta in enumerate(batch.meta):
            want = _pipeline_cond(pipe, frames[meta["source"]][:meta["num_frames"]])
            torch.testing.assert_close(batch.cond_latents[j], want, atol=1e-5, rtol=1e-5)
            checked += 1
        if i == 3:
            break
    assert shapes == {(3, 4, 4), (2, 4, 6)} and checked == 8


def test_inference_builds_the_same_cond_latents(wan_i2v_data):
    from nemo_vfm.data.batch import wan_i2v_cond_latents
    from nemo_vfm.data.encoders import build_tokenizer
    from nemo_vfm.data.sources import iter_inputs
    from nemo_vfm.io.video import frames_to_tensor

    pipe, raw, *_ = wan_i2v_data
    item = next(it for it in iter_inputs(str(raw)) if it.source.endswith(".mp4"))
    clip = item.load()[0][:5]
    got = wan_i2v_cond_latents(build_tokenizer("wan", path=str(pipe)), frames_to_tensor(clip)[:, 0], 5)
    torch.testing.assert_close(got, _pipeline_cond(pipe, clip), atol=1e-5, rtol=1e-5)


def _train(data_path, tmp_path, model, steps=2):
    from nemo_vfm.data.energon_datamodule import EnergonDataModule
    from nemo_vfm.inference.generate import SamplingConfig
    from nemo_vfm.models.common.lora import LoRAConfig
    from nemo_vfm.models.wan.flavors import wan_objective
    from nemo_vfm.train import ExperimentConfig, TrainerConfig, train

    data = EnergonDataModule(path=str(data_path), micro_batch_size=2, patch_size=(1, 2, 2))
    return train(model=model, data=data, objective=wan_objective("tiny"), lora=LoRAConfig(rank=4),
                 trainer=TrainerConfig(max_steps=steps, accelerator="cpu", devices=1, precision="32-true",
                                       log_every_n_steps=1, checkpoint_every_n_steps=10, enable_progress_bar=False),
                 log=ExperimentConfig(name="wan_i2v", root=str(tmp_path), tensorboard=False), ema_decay=None,
                 sampling=SamplingConfig(enabled=False, sampler="euler"))


def _i2v_model(**kw):
    from nemo_vfm.models.wan.model import WanConfig

    # Wan 2.2 I2V-A14B-like: 16 latent + 4 mask + 16 image-latent channels in, 16 out, no CLIP tokens
    return WanConfig(num_layers=2, hidden_size=32, num_heads=2, ffn_size=48, in_channels=36, out_channels=16,
                     context_dim=16, freq_dim=32, text_len=16, **kw)


def test_tiny_wan_i2v_trains_on_prepared_data(wan_i2v_data, tmp_path):
    summary = _train(wan_i2v_data[2], tmp_path, _i2v_model())
    assert summary["step"] == 2 and summary["loss"] is not None and torch.isfinite(torch.tensor(summary["loss"]))


def test_data_without_image_condition_fails_before_training(wan_i2v_data, tmp_path):
    from nemo_vfm.data.energon_datamodule import check_image_condition
    from nemo_vfm.models.wan.model import WanConfig

    with pytest.raises(ValueError, match="prepared without image conditioning.*image_condition=wan_i2v"):
        _train(wan_i2v_data[3], tmp_path, _i2v_model())
    ckpts = tmp_path / "wan_i2v" / "checkpoints"
    assert not ckpts.exists() or not any(ckpts.iterdir())
    t2v = WanConfig(num_layers=1, hidden_size=32, num_heads=2, ffn_size=48, in_channels=16, out_channels=16,
                    context_dim=16, freq_dim=32, text_len=16)
    with pytest.raises(ValueError, match="takes no cond_latents"):
        check_image_condition(t2v, "wan_i2v", "data/x")
    check_image_condition(t2v, None, "data/x")
    check_image_condition(_i2v_model(image_dim=32), None, "data/x")  # Wan 2.1 I2V: its model asks at the first step


def test_the_image_condition_check_reads_what_the_config_declares():
    """No family is named: any config declaring ``image_conditions`` is checked, one without it takes none."""
    from types import SimpleNamespace

    from nemo_vfm.data.energon_datamodule import check_image_condition

    takes = SimpleNamespace(image_conditions=("wan_i2v",))
    with pytest.raises(ValueError, match=r"the model \(SimpleNamespace\) takes image conditioning.*prepared without"):
        check_image_condition(takes, None, "data/x")
    check_image_condition(takes, "wan_i2v", "data/x")
    with pytest.raises(ValueError, match="takes no cond_latents"):
        check_image_condition(SimpleNamespace(), "wan_i2v", "data/x")
    check_image_condition(SimpleNamespace(), None, "data/x")
    assert _i2v_model().image_conditions == ("wan_i2v",) and _i2v_model(image_dim=32).image_conditions == (None, "wan_i2v")


def test_bad_settings_fail_clearly(wan_i2v_data, tmp_path):
    from nemo_vfm.cli.prepare import parse
    from nemo_vfm.data.energon_datamodule import EnergonDataModule
    from nemo_vfm.data.prepare import PrepareConfig, prepare

    _, raw, i2v, t2v, _ = wan_i2v_data
    assert parse([f"input={raw}", "output=o", "image_condition=wan_i2v"]).image_condition == "wan_i2v"
    with pytest.raises(ValueError, match="image_condition must be one of"):
        PrepareConfig(input=str(raw), output=str(tmp_path / "o"), image_condition="clip")
    with pytest.raises(ValueError, match="packed batches"):
        EnergonDataModule(path=str(i2v), max_seq_length=64)
    with pytest.raises(ValueError, match="prepared with image_condition=None"):  # resuming may not mix the two
        prepare(PrepareConfig(input=str(raw), output=str(t2v), image_condition="wan_i2v", progress=False))


def test_a_bucket_mixing_conditioned_and_plain_samples_fails():
    from nemo_vfm.data.task_encoder import ClipSample, stack_bucket

    def sample(key, cond):
        return ClipSample(__key__=key, __restore_key__=(), __subflavors__=None, __sources__=None,
                          latent=torch.zeros(16, 2, 4, 4), text_emb=torch.zeros(3, 8), text_mask=torch.ones(3).bool(),
                          fps=8.0, meta={}, cond_latents=torch.zeros(20, 2, 4, 4) if cond else None)

    assert stack_bucket([sample("a", True), sample("b", True)]).cond_latents.shape == (2, 20, 2, 4, 4)
    assert stack_bucket([sample("a", False), sample("b", False)]).cond_latents is None
    with pytest.raises(ValueError, match="mixes samples with image conditioning"):
        stack_bucket([sample("a", True), sample("b", False)])
