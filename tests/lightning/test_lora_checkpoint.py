"""A LoRA run on published weights saves no frozen base (nemo_vfm.lightning.lora_checkpoint): its checkpoints
hold the adapters and the folder's name; resume, ``load_checkpoint`` (vfm generate, exports) and the merged weights
read the base from the folder again, in one process (one file) and on 2 gloo processes under FSDP2 (DCP folder)."""

import sys
from pathlib import Path

import pytest
import torch

from nemo_vfm.io.checkpoint_files import LORA_BASE_ENTRY

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "parallel"))


def _train(rank, world, root, folder, steps, strategy="vfm", pretrained=True):
    """LoRA on the folder's weights; returns the summary and the EMA network's state (LoRA names) at the end."""
    import lightning as L

    from nemo_vfm.data.synthetic import MockLatentDataModule
    from nemo_vfm.lightning.strategy import VFMParallelStrategy
    from nemo_vfm.models.common.lora import LoRAConfig
    from nemo_vfm.models.wan.convert import read_config
    from nemo_vfm.train import ExperimentConfig, TrainerConfig, train

    end = {}

    class Keep(L.Callback):
        def on_train_end(self, trainer, module):
            from torch.distributed.tensor import DTensor

            full = lambda t: (t.full_tensor() if isinstance(t, DTensor) else t).detach().clone()
            end.update({k: full(v) for k, v in module.ema.state_dict().items()})

    model = read_config(folder, pretrained=str(folder) if pretrained else None)
    data = MockLatentDataModule(latent_channels=4, num_frames=2, height=4, width=4, context_dim=16, context_length=4,
                                batch_size=2, num_samples=8)
    trainer = TrainerConfig(max_steps=steps, devices=world, accelerator="cpu", precision="32-true", callbacks=[Keep()],
                            strategy=VFMParallelStrategy(param_dtype=None) if strategy == "vfm" else strategy,
                            log_every_n_steps=1,
                            checkpoint_every_n_steps=2, enable_progress_bar=False)
    out = train(model=model, data=data, trainer=trainer, lora=LoRAConfig(rank=4, alpha=8.0), ema_decay=0.5,
                log=ExperimentConfig(name="lora", root=str(root), tensorboard=False))
    return {"summary": out, "ema": end}


def _check(run: dict, folder: Path, capsys=None):
    from nemo_vfm.inference.checkpoint import load_checkpoint, raw_state_dict, read_checkpoint_info
    from nemo_vfm.models.common.lora import merge_lora_state_dict

    info = read_checkpoint_info(run["summary"]["checkpoint"])
    assert info.base_from == str(folder)
    # what the loaders give: the folder's base + the saved adapters, merged; equal to the EMA network at the end
    expected = merge_lora_state_dict(run["ema"], info.lora.scale)
    loaded = load_checkpoint(run["summary"]["checkpoint"]).net.state_dict()
    assert loaded.keys() == expected.keys()
    assert all(torch.allclose(loaded[k], expected[k], atol=1e-6) for k in expected)
    raw = raw_state_dict(info)
    assert any(".lora_A." in k for k in raw) and any(".base." in k for k in raw)


def _saved(path: Path) -> tuple[list[str], dict]:
    """The weight names a checkpoint (file or DCP folder) holds, and its LoRA base entry."""
    from nemo_vfm.io.dcp_metadata import safe_read_metadata
    from nemo_vfm.io.safe_load import safe_load

    if path.is_dir():
        md = safe_read_metadata(path / ".metadata").state_dict_metadata
        keys = [k.removeprefix("state_dict.") for k in md if k.startswith("state_dict.")]
        return keys, safe_load(path / "meta.pt")[LORA_BASE_ENTRY]
    ckpt = safe_load(path)
    return list(ckpt["state_dict"]), ckpt[LORA_BASE_ENTRY]


def _no_base(path: Path, folder: Path) -> None:
    keys, entry = _saved(path)
    assert entry["pretrained"] == str(folder) and entry["omitted"] > 0
    assert any(".lora_A." in k for k in keys) and not any(".base." in k for k in keys)
    assert not any(k.endswith("patch_embedding.weight") for k in keys)  # frozen non-adapted weights too


def test_one_process_checkpoint_leaves_the_base_out_and_resumes(tmp_path, wan_folder, capsys):
    first = _train(0, 1, tmp_path, wan_folder, 2)
    _no_base(Path(first["summary"]["checkpoint"]), wan_folder)
    _check(first, wan_folder)
    second = _train(0, 1, tmp_path, wan_folder, 3)
    assert "resuming from" in capsys.readouterr().out and second["summary"]["step"] == 3
    _check(second, wan_folder)


def test_lightnings_own_loader_gets_the_base_from_the_network(tmp_path, wan_folder, capsys):
    """Under Lightning's single-device strategy the checkpoint is one file, loaded by Lightning: the module puts
    the base it loaded from the folder in place of the keys the file leaves out (``on_load_checkpoint``)."""
    first = _train(0, 1, tmp_path, wan_folder, 2, strategy="auto")
    _no_base(Path(first["summary"]["checkpoint"]), wan_folder)
    _check(first, wan_folder)
    second = _train(0, 1, tmp_path, wan_folder, 3, strategy="auto")
    assert "resuming from" in capsys.readouterr().out and second["summary"]["step"] == 3
    _check(second, wan_folder)


def test_a_sharded_checkpoint_leaves_the_base_out_and_resumes(tmp_path, wan_folder):
    from gloo_launcher import run_distributed

    first = run_distributed(_train, 2, tmp_path, wan_folder, 2)[0]
    _no_base(Path(first["summary"]["checkpoint"]), wan_folder)
    _check(first, wan_folder)
    second = run_distributed(_train, 2, tmp_path, wan_folder, 3)[0]
    assert second["summary"]["step"] == 3
    _check(second, wan_folder)


def test_a_missing_base_folder_is_named(tmp_path, wan_folder):
    import shutil

    from nemo_vfm.inference.checkpoint import load_checkpoint

    folder = tmp_path / "wan"
    shutil.copytree(wan_folder, folder)
    run = _train(0, 1, tmp_path, folder, 2)
    shutil.rmtree(folder)
    with pytest.raises(FileNotFoundError, match="without their frozen base"):
        load_checkpoint(run["summary"]["checkpoint"])


def test_resume_without_the_folder_is_refused(tmp_path, wan_folder):
    _train(0, 1, tmp_path, wan_folder, 2)
    with pytest.raises(ValueError, match="without their frozen base.*set model.pretrained="):
        _train(0, 1, tmp_path, wan_folder, 3, pretrained=False)


def test_which_runs_leave_the_base_out():
    """Only LoRA on a published folder, and not when init_from replaced the folder's weights."""
    from types import SimpleNamespace as NS

    from nemo_vfm.lightning.lora_checkpoint import base_folder

    cfg = NS(pretrained="/w/Wan")
    assert base_folder(NS(model_config=cfg, lora=object(), base_from_init=False)) == "/w/Wan"
    assert base_folder(NS(model_config=cfg, lora=object(), base_from_init=True)) is None  # init_from's base
    assert base_folder(NS(model_config=cfg, lora=None)) is None  # full fine-tuning saves everything
    assert base_folder(NS(model_config=NS(pretrained=None), lora=object())) is None


def test_the_folder_is_read_in_the_frozen_dtype(wan_folder):
    """A bf16-base run's base comes back in bf16, read straight into it (not an fp32 copy first)."""
    from nemo_vfm.inference.checkpoint import read_checkpoint_info
    from nemo_vfm.inference.published import published_state_dict

    info = read_checkpoint_info(wan_folder)
    bf16 = published_state_dict(info, torch.bfloat16)
    full = published_state_dict(info)
    assert bf16.keys() == full.keys()
    assert all(v.dtype == torch.bfloat16 and torch.equal(v, full[k].to(torch.bfloat16))
               for k, v in bf16.items() if full[k].is_floating_point())
