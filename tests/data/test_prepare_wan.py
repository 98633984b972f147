"""Fine-tuning data for Wan: `vfm prepare` with the Wan VAE and UMT5 (tiny random ones, in a pipeline folder's
layout: vae/, text_encoder/, tokenizer/) -> Energon shards -> bucketed batches -> a Wan LoRA training step."""

import pytest
import torch

diffusers = pytest.importorskip("diffusers")
transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")


def _pipeline(root):
    """A Wan-pipeline-shaped folder with a tiny random VAE (4 latent channels) and UMT5 (16 wide)."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers

    torch.manual_seed(0)
    diffusers.AutoencoderKLWan(base_dim=8, z_dim=4, dim_mult=[1, 2, 2, 2], num_res_blocks=1,
                               temperal_downsample=[False, True, True], latents_mean=[0.0] * 4,
                               latents_std=[1.0] * 4).save_pretrained(root / "vae")
    cfg = transformers.UMT5Config(vocab_size=40, d_model=16, d_kv=4, d_ff=32, num_layers=1, num_heads=4)
    transformers.UMT5EncoderModel(cfg).save_pretrained(str(root / "text_encoder"))
    words = "a red green blue yellow white purple circle square triangle moving left right up down on background " \
            "black gray navy"
    tk = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tk.normalizer, tk.pre_tokenizer = normalizers.Lowercase(), pre_tokenizers.Whitespace()
    tk.train_from_iterator([words], trainers.WordLevelTrainer(special_tokens=["<pad>", "</s>", "<unk>"]))
    tk.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    transformers.PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", eos_token="</s>",
                                         unk_token="<unk>").save_pretrained(str(root / "tokenizer"))
    return root


def test_wan_vae_umt5_prepare_buckets_and_lora_step(tmp_path):
    from nemo_vfm.data.energon_datamodule import EnergonDataModule
    from nemo_vfm.data.prepare import PrepareConfig, prepare
    from nemo_vfm.data.synthetic_inputs import write_folder
    from nemo_vfm.inference.generate import SamplingConfig
    from nemo_vfm.models.common.lora import LoRAConfig
    from nemo_vfm.models.wan.flavors import wan_objective
    from nemo_vfm.models.wan.model import WanConfig
    from nemo_vfm.train import ExperimentConfig, TrainerConfig, train

    pipe = _pipeline(tmp_path / "wan_pipe")
    # two resolutions and two lengths: 9 frames at 32x32 and 5 frames at 32x48 -> latents 3x4x4 and 2x4x6
    raw = write_folder(tmp_path / "raw", 6, sizes=((9, 32, 32), (5, 32, 48)))
    res = prepare(PrepareConfig(input=str(raw), output=str(tmp_path / "prep"), tokenizer="wan",
                                tokenizer_kwargs={"path": str(pipe)}, text_encoder="umt5",
                                text_encoder_kwargs={"path": str(pipe), "max_length": 16}, progress=False))
    assert res.written == 6 and not res.errors and res.indexed

    data = EnergonDataModule(path=str(tmp_path / "prep"), micro_batch_size=2, patch_size=(1, 2, 2),
                             shuffle_buffer_size=8)
    assert data.context_dim == 16
    shapes = set()
    for i, batch in enumerate(data.train_dataloader()):  # resolution/length buckets: one latent shape per batch
        lat = batch["latents"] if isinstance(batch, dict) else batch.latents
        shapes.add(tuple(lat.shape[1:]))
        if i == 5:
            break
    assert shapes <= {(4, 3, 4, 4), (4, 2, 4, 6)} and len(shapes) == 2, shapes

    model = WanConfig(num_layers=2, hidden_size=32, num_heads=2, ffn_size=48, in_channels=4, out_channels=4,
                      context_dim=16, freq_dim=32, text_len=16)
    def run(steps):
        data = EnergonDataModule(path=str(tmp_path / "prep"), micro_batch_size=2, patch_size=(1, 2, 2))
        return train(model=model, data=data, objective=wan_objective("tiny"), lora=LoRAConfig(rank=4),
                     trainer=TrainerConfig(max_steps=steps, accelerator="cpu", devices=1, precision="32-true",
                                           log_every_n_steps=1, checkpoint_every_n_steps=2, enable_progress_bar=False),
                     log=ExperimentConfig(name="wan_lora", root=str(tmp_path), tensorboard=False), ema_decay=None,
                     sampling=SamplingConfig(enabled=False, sampler="euler"))

    summary = run(2)
    assert summary["step"] == 2 and summary["loss"] is not None
    assert run(3)["step"] == 3  # a LoRA run resumes from its own checkpoint
    state = torch.load(summary["checkpoint"], weights_only=False)
    assert any(".lora_A." in k for k in state["state_dict"]) and state["hyper_parameters"]["lora"].rank == 4
