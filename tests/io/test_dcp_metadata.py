"""A DCP folder's ``.metadata`` never runs code: a ``.metadata`` holding an ``os.system`` payload is refused (naming
the file) wherever a checkpoint is read: resume (skipped beside good checkpoints, or refused by the strategy),
``init_from=``, ``vfm generate/export/evaluate --ckpt``, a Wan folder. The marker file it would touch proves that
nothing ran. Genuine DCP checkpoints (torch 2.13 here, 2.11 on the GPU machine) still verify and load."""

import os
import pickle
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from nemo_vfm.io.checkpoint_files import latest_checkpoint, verify_checkpoint
from nemo_vfm.io.dcp_metadata import SafeFileSystemReader, safe_read_metadata, verify_metadata
from nemo_vfm.io.safe_load import UnsafeCheckpointError

GEN = {"tokenizer": {"name": "identity", "kwargs": {"spatial_compression": 2}},
       "text_encoder": {"name": "hash", "kwargs": {"dim": 8, "max_length": 4}}, "latent_shape": [12, 2, 4, 4],
       "fps": None}


class Boom:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def plant(folder: Path, marker: Path, name: str = ".metadata") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(pickle.dumps(Boom(str(marker))))
    return folder / name


def _net_and_hparams():
    from nemo_vfm.diffusion.edm import EDM
    from nemo_vfm.models.dit.model import DiTConfig

    net = DiTConfig(num_layers=1, hidden_size=32, num_heads=4, in_channels=12, context_dim=8).build()
    g = torch.Generator().manual_seed(0)
    state = {f"model.{k}": torch.randn(v.shape, generator=g) * 0.2 for k, v in net.state_dict().items()}
    return net, state, {"model_config": net.cfg, "objective": EDM(), "generation": GEN}


def train_tiny(root: Path, steps: int, strategy="auto", **kw):
    """A tiny one-process run of the tests' DiT on shapes data (checkpoint every 2 steps; ``VFMParallelStrategy``
    writes DCP folders)."""
    from nemo_vfm.data.synthetic import ShapesDataModule
    from nemo_vfm.inference.generate import SamplingConfig
    from nemo_vfm.lightning.module import OptimConfig
    from nemo_vfm.models.dit.flavors import dit_config
    from nemo_vfm.train import ExperimentConfig, TrainerConfig, train

    return train(model=dit_config("tiny", in_channels=12, context_dim=16, patch_size=(1, 2, 2)),
                 data=ShapesDataModule(num_clips=8, num_frames=2, height=16, width=16, batch_size=4,
                                       tokenizer_kwargs={"spatial_compression": 2}, text_encoder_kwargs={"dim": 16}),
                 trainer=TrainerConfig(max_steps=steps, checkpoint_every_n_steps=2, precision="32-true",
                                       accelerator="cpu", devices=1, enable_progress_bar=False, log_every_n_steps=1,
                                       strategy=strategy),
                 optim=OptimConfig(lr=1e-3, warmup_steps=1), log=ExperimentConfig(name="run", root=str(root)),
                 sampling=SamplingConfig(enabled=False), seed=3, **kw)


@pytest.fixture(scope="module")
def dcp_ckpt(tmp_path_factory):
    """A training checkpoint folder as VFMParallelStrategy writes it: DCP shards + .metadata + Lightning's meta.pt."""
    _, state, hp = _net_and_hparams()
    path = tmp_path_factory.mktemp("dcp") / "step=00000004.ckpt"
    dcp.save({"state_dict": state}, checkpoint_id=str(path), no_dist=True)
    torch.save({"hyper_parameters": hp, "global_step": 4}, path / "meta.pt")
    return path, state


@pytest.fixture(scope="module")
def file_ckpt(tmp_path_factory):
    _, state, hp = _net_and_hparams()
    path = tmp_path_factory.mktemp("file") / "step=00000004.ckpt"
    torch.save({"hyper_parameters": hp, "state_dict": state, "global_step": 4}, path)
    return path


# -- the reader ---------------------------------------------------------------------------------------------
def test_genuine_metadata_verifies_and_loads_through_the_safe_reader(dcp_ckpt):
    from nemo_vfm.inference.checkpoint import load_checkpoint

    path, state = dcp_ckpt
    md = safe_read_metadata(path / ".metadata")
    assert set(md.state_dict_metadata) == {f"state_dict.{k}" for k in state}
    assert verify_metadata(path) is not None and verify_checkpoint(path, deep=True) is None
    out = {"state_dict": {k: torch.zeros_like(v) for k, v in state.items()}}
    dcp.load(out, storage_reader=SafeFileSystemReader(path), no_dist=True)
    assert all(torch.equal(out["state_dict"][k], v) for k, v in state.items())
    loaded = load_checkpoint(path)  # vfm generate / evaluate's path: DCP read with the safe reader
    for k, v in loaded.net.state_dict().items():
        assert torch.equal(v, state[f"model.{k}"]), k


def test_the_parallel_checkpoint_module_round_trips(tmp_path):
    from nemo_vfm.parallel.checkpoint import consolidated_state_dict, load, save

    net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    opt = torch.optim.AdamW(net.parameters())
    net(torch.randn(2, 4)).sum().backward()
    opt.step()
    save(tmp_path / "c", net, opt)
    other = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    load(tmp_path / "c", other, torch.optim.AdamW(other.parameters()))
    assert all(torch.equal(a, b) for a, b in zip(net.state_dict().values(), other.state_dict().values()))
    assert set(consolidated_state_dict(tmp_path / "c")) == set(net.state_dict())


@pytest.mark.parametrize("name", [".metadata", "__0.metadata"])
def test_payload_is_refused_naming_the_file_and_the_global(tmp_path, dcp_ckpt, name):
    import shutil

    marker, folder = tmp_path / "MARKER", tmp_path / "step=00000008.ckpt"
    shutil.copytree(dcp_ckpt[0], folder)
    bad = plant(folder, marker, name)
    with pytest.raises(UnsafeCheckpointError, match=rf"refusing to load {bad}: it would import posix\.system"):
        verify_metadata(folder)
    assert f"refusing to load {bad}" in verify_checkpoint(folder)
    if name == ".metadata":  # dcp.load wraps the reader's error in its CheckpointException
        with pytest.raises(BaseException, match=rf"refusing to load {bad}"):  # CheckpointException
            dcp.load({"state_dict": {}}, storage_reader=SafeFileSystemReader(folder), no_dist=True)
    assert not marker.exists()


def test_non_metadata_pickle_and_the_opt_in(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / ".metadata").write_bytes(pickle.dumps({"x": [1, 2]}))
    with pytest.raises(ValueError, match="does not hold DCP metadata"):
        safe_read_metadata(tmp_path / "a" / ".metadata")
    marker = tmp_path / "MARKER"
    bad = plant(tmp_path / "b", marker)
    with pytest.warns(UserWarning, match="unpickling .* without restrictions"), pytest.raises(ValueError):
        safe_read_metadata(bad, allow_pickle=True)  # the explicit opt-in unpickles anything
    assert marker.exists()


# -- every place a checkpoint is read ----------------------------------------------------------------------
def test_payload_beside_a_good_checkpoint_is_skipped_with_the_reason(tmp_path, dcp_ckpt):
    import shutil

    marker = tmp_path / "MARKER"
    shutil.copytree(dcp_ckpt[0], tmp_path / dcp_ckpt[0].name)
    bad = plant(tmp_path / "step=00000099.ckpt", marker)
    skipped = []
    found = latest_checkpoint(tmp_path, deep=True, on_skip=lambda p, why: skipped.append((p.name, why)))
    assert found.name == "step=00000004.ckpt"
    assert skipped[0][0] == "step=00000099.ckpt" and f"refusing to load {bad}" in skipped[0][1]
    assert not marker.exists()


@pytest.mark.parametrize("kind", ["file", "dcp"])
def test_resume_skips_the_payload_and_continues_from_the_good_checkpoint(tmp_path, capsys, kind):
    from nemo_vfm.lightning.strategy import VFMParallelStrategy

    strategy = (lambda: VFMParallelStrategy(compile=False)) if kind == "dcp" else (lambda: "auto")
    train_tiny(tmp_path, 2, strategy())
    ckpts, marker = tmp_path / "run" / "checkpoints", tmp_path / "MARKER"
    bad = plant(ckpts / "step=00000099.ckpt", marker)
    with pytest.warns(UserWarning, match=rf"not resuming from .*step=00000099.ckpt: refusing to load {bad}"):
        summary = train_tiny(tmp_path, 4, strategy())
    assert f"resuming from {ckpts / 'step=00000002.ckpt'}" in capsys.readouterr().out
    assert summary["step"] == 4 and not marker.exists()
    assert (ckpts / "step=00000099.ckpt.unusable").exists()  # moved aside, not run, not deleted
    assert (ckpts / "step=00000004.ckpt").is_dir() == (kind == "dcp")


def test_strategy_verifies_metadata_before_any_loader_reads_it(tmp_path):
    from nemo_vfm.lightning.strategy import VFMParallelStrategy

    marker = tmp_path / "MARKER"
    bad = plant(tmp_path / "step=00000004.ckpt", marker)
    with pytest.raises(UnsafeCheckpointError, match=rf"refusing to load {bad}"):
        VFMParallelStrategy(compile=False).load_checkpoint(tmp_path / "step=00000004.ckpt")  # trainer.fit(ckpt_path=)
    assert not marker.exists()


def test_init_from_a_payload_folder_is_refused(tmp_path):
    from nemo_vfm.inference.checkpoint import load_pretrained
    marker = tmp_path / "MARKER"
    bad = plant(tmp_path / "base" / "step=00000004.ckpt", marker)
    with pytest.raises(ValueError, match=rf"cannot use checkpoint .*step=00000004.ckpt: refusing to load {bad}"):
        train_tiny(tmp_path, 2, init_from=str(bad.parent))
    with pytest.raises(ValueError, match=rf"refusing to load {bad}"):
        load_pretrained(_net_and_hparams()[0], bad.parent)
    assert not marker.exists()


@pytest.mark.parametrize("command", ["generate", "export", "evaluate"])
def test_cli_refuses_a_payload_folder(tmp_path, capsys, command):
    from nemo_vfm.cli.main import main

    marker = tmp_path / "MARKER"
    bad = plant(tmp_path / "step=00000004.ckpt", marker)
    args = {"generate": ["--prompt", "x", "--steps", "1", "--device", "cpu", "--out", str(tmp_path / "out")],
            "export": ["--format", "safetensors", "--out", str(tmp_path / "m.safetensors")],
            "evaluate": ["--num", "1", "--steps", "1", "--device", "cpu", "--out", str(tmp_path / "out")]}[command]
    rc = main([command, "--ckpt", str(bad.parent), *args])
    err = capsys.readouterr().err
    assert rc == 2 and f"refusing to load {bad}" in err and "Traceback" not in err, err
    assert not marker.exists()


def test_generate_from_a_run_folder_skips_the_payload(tmp_path, capsys, file_ckpt):
    """The issue's reproduction: the payload sits in the run's checkpoints/ beside a good checkpoint."""
    import shutil

    from nemo_vfm.cli.main import main

    ckpts, marker = tmp_path / "run" / "checkpoints", tmp_path / "MARKER"
    ckpts.mkdir(parents=True)
    shutil.copy(file_ckpt, ckpts / file_ckpt.name)
    bad = plant(ckpts / "step=00000099.ckpt", marker)
    with pytest.warns(UserWarning, match=rf"skipping checkpoint .*step=00000099.ckpt: refusing to load {bad}"):
        rc = main(["generate", "--ckpt", str(tmp_path / "run"), "--prompt", "x", "--steps", "1", "--device", "cpu",
                   "--out", str(tmp_path / "out")])
    assert rc == 0, capsys.readouterr().err
    assert not marker.exists() and (tmp_path / "out" / "batch000.mp4").exists()


def test_a_wan_folder_with_a_metadata_pickle_never_runs_it(tmp_path, capsys):
    from nemo_vfm.cli.main import main
    from nemo_vfm.inference.checkpoint import export_safetensors, load_pretrained
    from nemo_vfm.models.wan.convert import save_weights
    from nemo_vfm.models.wan.model import WanConfig

    cfg = WanConfig(num_layers=1, hidden_size=24, num_heads=2, ffn_size=32, in_channels=4, out_channels=4,
                    context_dim=16, freq_dim=16)
    net = cfg.build()
    wan, marker = tmp_path / "wan", tmp_path / "MARKER"
    save_weights(net.state_dict(), wan, cfg, layout="diffusers")
    plant(wan, marker)
    rc = main(["export", "--ckpt", str(wan), "--format", "safetensors", "--out", str(tmp_path / "m.safetensors")])
    err = capsys.readouterr().err
    assert rc == 0 or (rc == 2 and str(wan) in err and "Traceback" not in err), err  # refused as a published folder
    out = export_safetensors(wan, tmp_path / "lib.safetensors")  # vfm generate --export-safetensors: the weights
    from safetensors.torch import load_file

    assert all(torch.equal(load_file(str(out))[k], v) for k, v in net.state_dict().items())
    other = cfg.build()
    load_pretrained(other, wan)  # init_from= a Wan folder
    assert all(torch.equal(a, b) for a, b in zip(net.state_dict().values(), other.state_dict().values()))
    assert not marker.exists()
