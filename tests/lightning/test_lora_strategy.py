"""LoRA through the real path: train() with VFMParallelStrategy (FSDP2) on 2 gloo processes trains only the
adapters: the optimizer state in the sharded checkpoint covers the lora_A/lora_B weights and nothing else,
and the frozen base weights are saved unchanged."""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "parallel"))


def _train(rank, world, root):
    import torch

    from nemo_vfm.data.synthetic import MockLatentDataModule
    from nemo_vfm.lightning.strategy import VFMParallelStrategy
    from nemo_vfm.models.common.lora import LoRAConfig
    from nemo_vfm.models.dit.model import DiTConfig
    from nemo_vfm.train import ExperimentConfig, TrainerConfig, train

    torch.manual_seed(0)
    model = DiTConfig(num_layers=2, hidden_size=32, num_heads=4, in_channels=4, context_dim=16)
    base = root + "/base.ckpt"
    if rank == 0:
        # a "pretrained" base: away from adaLN-Zero's zero gates, which would give the adapters no gradient
        state = {k: v + 0.05 * torch.randn_like(v) for k, v in model.build().state_dict().items()}
        torch.save({"state_dict": {f"model.{k}": v for k, v in state.items()},
                    "global_step": 0, "hyper_parameters": {"model_config": model, "objective": None}}, base)
    torch.distributed.barrier()
    data = MockLatentDataModule(latent_channels=4, num_frames=2, height=4, width=4, context_dim=16,
                                context_length=3, batch_size=2, num_samples=8)
    trainer = TrainerConfig(max_steps=2, devices=world, accelerator="cpu", precision="32-true",
                            strategy=VFMParallelStrategy(fsdp=True, param_dtype=None), log_every_n_steps=1,
                            checkpoint_every_n_steps=2, enable_progress_bar=False)
    return train(model=model, data=data, trainer=trainer, init_from=base, lora=LoRAConfig(rank=4), ema_decay=None,
                 log=ExperimentConfig(name="lora", root=root, tensorboard=False))


@pytest.mark.slow
def test_fsdp2_lora_run_keeps_optimizer_state_for_adapters_only(tmp_path):
    import torch
    from gloo_launcher import run_distributed

    from nemo_vfm.inference.checkpoint import raw_state_dict, read_checkpoint_info

    out = run_distributed(_train, 2, str(tmp_path))[0]
    assert out["step"] == 2 and out["loss"] is not None
    ckpt = tmp_path / "lora" / "checkpoints" / "step=00000002.ckpt"
    assert (ckpt / ".metadata").is_file()
    from torch.distributed.checkpoint import FileSystemReader

    keys = list(FileSystemReader(str(ckpt)).read_metadata().state_dict_metadata)
    opt = [k for k in keys if k.startswith("optimizer_0.state.") and k.endswith(".exp_avg")]
    assert opt and all(".lora_A." in k or ".lora_B." in k for k in opt), opt[:5]
    assert len(opt) == 2 * 10 * 2  # 2 blocks x 10 adapted linears (self/cross q k v proj, mlp fc1 fc2) x (A, B)
    info = read_checkpoint_info(ckpt)
    saved = raw_state_dict(info)
    base = torch.load(tmp_path / "base.ckpt", weights_only=False)["state_dict"]
    q = "blocks.0.attn.q"
    assert torch.equal(saved[f"{q}.base.weight"], base[f"model.{q}.weight"])  # frozen: unchanged
    assert saved[f"{q}.lora_B.weight"].abs().sum() > 0  # trained (starts at zero)
    from nemo_vfm.inference.checkpoint import load_checkpoint

    net = load_checkpoint(ckpt).net  # vfm generate's loader: the sharded LoRA run, merged into a plain DiT
    w = saved[f"{q}.base.weight"] + info.lora.scale * saved[f"{q}.lora_B.weight"] @ saved[f"{q}.lora_A.weight"]
    torch.testing.assert_close(net.state_dict()[f"{q}.weight"], w)
