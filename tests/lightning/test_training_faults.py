"""Fault injection for training, checkpoints and ``vfm generate``: NaN losses, killed and failed saves
(SIGKILL, a full disk), truncated / zero-byte / foreign / malicious checkpoints, a changed model on resume,
bad generate arguments. Each case checks the message and that nothing done before is lost."""

import errno
import math
import os
import pickle
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import lightning as L
import pytest
import torch

from nemo_vfm.io.checkpoint_files import latest_checkpoint, verify_checkpoint
from nemo_vfm.io.safe_load import UnsafeCheckpointError, safe_load
from nemo_vfm.lightning import checkpointing
from nemo_vfm.lightning.checkpointing import CheckpointWriteError
from nemo_vfm.lightning.nonfinite import NonFiniteError

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / '.pyshim'}", "OMP_NUM_THREADS": "1"}


def _train(root: Path, steps: int, *, callbacks=(), model=None, resume: bool = True, fused: bool | None = None,
           **trainer_kw):
    from nemo_vfm.data.synthetic import ShapesDataModule
    from nemo_vfm.inference.generate import SamplingConfig
    from nemo_vfm.lightning.module import OptimConfig
    from nemo_vfm.models.dit.flavors import dit_config
    from nemo_vfm.train import ExperimentConfig, TrainerConfig, train

    kw = dict(checkpoint_every_n_steps=2, keep_last_n_checkpoints=2, precision="32-true", accelerator="cpu",
              devices=1, enable_progress_bar=False, log_every_n_steps=1, gradient_clip_val=None)
    kw.update(trainer_kw)
    return train(model=model or dit_config("tiny", in_channels=12, context_dim=16, patch_size=(1, 2, 2)),
                 data=ShapesDataModule(num_clips=16, num_frames=2, height=16, width=16, batch_size=4,
                                       tokenizer_kwargs={"spatial_compression": 2}, text_encoder_kwargs={"dim": 16}),
                 trainer=TrainerConfig(max_steps=steps, callbacks=list(callbacks), **kw),
                 optim=OptimConfig(lr=1e-3, warmup_steps=1, fused=fused), log=ExperimentConfig(name="run", root=str(root),
                                                                                 resume=resume),
                 sampling=SamplingConfig(enabled=False), ema_decay=0.9, seed=3)


def _finite(path: Path) -> bool:
    ckpt = safe_load(path)
    tensors = list(ckpt["state_dict"].values())
    for opt in ckpt["optimizer_states"]:
        for st in opt["state"].values():
            tensors += [v for v in st.values() if torch.is_tensor(v)]
    return all(bool(torch.isfinite(t).all()) for t in tensors if t.is_floating_point())


class PoisonBatches(L.Callback):
    """Makes the latents of the given (1-based) steps NaN; records whether each poisoned step changed weights."""

    def __init__(self, steps):
        self.steps, self.changed = set(steps), {}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._step = trainer.global_step + 1
        if self._step in self.steps:
            batch["latents"].fill_(float("nan"))
            self._before = [p.detach().clone() for p in pl_module.model.parameters()]

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self._step in self.steps:
            now = list(pl_module.model.parameters())
            self.changed[self._step] = any(not torch.equal(a, b) for a, b in zip(self._before, now))


@pytest.fixture(scope="module")
def base_run(tmp_path_factory):
    """A finished 4-step run (checkpoints at steps 2 and 4) to copy for each resume case."""
    root = tmp_path_factory.mktemp("base")
    _train(root, 4)
    return root


def _copy(base: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(base, dst, dirs_exist_ok=True)
    return dst / "run" / "checkpoints"


# -- non-finite policy ----------------------------------------------------------------------------------
def test_stop_names_the_step_the_last_loss_and_the_checkpoint(tmp_path):
    with pytest.raises(NonFiniteError) as e:
        _train(tmp_path, 6, callbacks=[PoisonBatches({3})])
    msg = str(e.value)
    assert "NaN/Inf at step 3" in msg and "the last finite loss was" in msg and "at step 2" in msg
    assert f"resume from {tmp_path / 'run' / 'checkpoints' / 'step=00000002.ckpt'}" in msg
    ckpts = sorted((tmp_path / "run" / "checkpoints").glob("step=*.ckpt"))
    assert [p.name for p in ckpts] == ["step=00000002.ckpt"]  # nothing written after the NaN
    assert _finite(ckpts[0])


@pytest.mark.parametrize("fused", [False, True])  # host-side skip / the fused AdamW's device-side found_inf
def test_skip_drops_one_bad_update_and_goes_on(tmp_path, fused):
    poison = PoisonBatches({3})
    with pytest.warns(UserWarning, match="skipped 1 step"):
        summary = _train(tmp_path, 6, callbacks=[poison], nonfinite="skip", fused=fused)
    assert summary["step"] == 6 and math.isfinite(summary["loss"])
    assert poison.changed == {3: False}  # the poisoned step left the weights as they were
    ckpts = sorted((tmp_path / "run" / "checkpoints").glob("step=*.ckpt"))
    assert [p.name for p in ckpts] == ["step=00000004.ckpt", "step=00000006.ckpt"]
    assert all(_finite(p) for p in ckpts)


class PoisonGradient(L.Callback):
    """Makes one gradient NaN after the backward of the given (1-based) steps (the loss stays finite)."""

    def __init__(self, steps):
        self.steps, self.changed = set(steps), {}

    def on_after_backward(self, trainer, pl_module):
        self._step = trainer.global_step + 1
        if self._step in self.steps:
            next(p for p in pl_module.model.parameters() if p.grad is not None).grad.view(-1)[0] = float("nan")
            self._before = [p.detach().clone() for p in pl_module.model.parameters()]

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self._step in self.steps:
            now = list(pl_module.model.parameters())
            self.changed[self._step] = any(not torch.equal(a, b) for a, b in zip(self._before, now))


@pytest.mark.parametrize("poison", ["loss", "gradient"])
def test_strategy_clipping_norm_is_the_gradient_check(tmp_path, poison, monkeypatch):
    """Under VFMParallelStrategy with norm clipping and the fused AdamW (the GPU recipes' setting) the guard does
    not scan the gradients itself: the clipping's mesh-wide norm flags the step in ``found_inf``."""
    from nemo_vfm.lightning import nonfinite
    from nemo_vfm.lightning.strategy import VFMParallelStrategy

    scans = []
    monkeypatch.setattr(nonfinite, "_any_nonfinite", lambda *a: scans.append(1) or torch.tensor(False))
    cb = PoisonBatches({3}) if poison == "loss" else PoisonGradient({3})
    with pytest.warns(UserWarning, match="skipped 1 step"):
        summary = _train(tmp_path, 4, callbacks=[cb], nonfinite="skip", fused=True, gradient_clip_val=1.0,
                         strategy=VFMParallelStrategy(compile=False))
    assert summary["step"] == 4 and math.isfinite(summary["loss"])
    assert cb.changed == {3: False}  # the bad step's update was dropped by the fused kernel
    assert len(scans) == 2  # only the weight checks of the two saves (steps 2, 4): no pass over the gradients


def test_skip_stops_after_n_bad_steps_in_a_row(tmp_path):
    with pytest.raises(NonFiniteError, match=r"2 steps in a row from step 3"):
        _train(tmp_path, 8, callbacks=[PoisonBatches({3, 4, 5, 6})], nonfinite="skip", nonfinite_max_consecutive=2)
    assert all(_finite(p) for p in (tmp_path / "run" / "checkpoints").glob("step=*.ckpt"))


@pytest.mark.slow
def test_diverging_quickstart_cli_exits_nonzero(tmp_path):
    """The issue's command (smaller data): lr=1e6 without clipping stops within a few steps, non-zero."""
    cmd = [sys.executable, str(ROOT / "launchers" / "train.py"), "--factory", "quickstart", "--yes", "optim.lr=1e6",
           "optim.warmup_steps=0", "trainer.gradient_clip_val=null", "data.num_clips=16", "data.batch_size=4",
           "trainer.checkpoint_every_n_steps=1", "trainer.enable_progress_bar=false", f"log.root={tmp_path}"]
    p = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=600)
    out = p.stdout + p.stderr
    assert p.returncode != 0, out[-3000:]
    # NaN/Inf in the loss or gradients, or (an overflowing optimizer state) caught before a save
    m = re.search(r"training stopped: (the loss or the gradients became NaN/Inf at step|refusing to write the "
                  r"checkpoint of step) (\d+)", out)
    assert m, out[-3000:]
    step = int(m.group(2))
    assert step <= 10 and "the last finite loss was" in out
    ckpts = list((tmp_path / "quickstart" / "checkpoints").glob("step=*.ckpt"))
    assert all(_finite(p) for p in ckpts)
    assert all(int(p.name[5:13]) < step for p in ckpts)


# -- resume ---------------------------------------------------------------------------------------------
def test_truncated_newest_checkpoint_resumes_from_the_previous_one(base_run, tmp_path, capsys):
    ckpts = _copy(base_run, tmp_path)
    newest = ckpts / "step=00000004.ckpt"
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])
    with pytest.warns(UserWarning, match=r"not resuming from .*step=00000004.ckpt: it is not a complete"):
        summary = _train(tmp_path, 6)
    assert f"resuming from {ckpts / 'step=00000002.ckpt'}" in capsys.readouterr().out
    assert summary["step"] == 6
    assert (ckpts / "step=00000004.ckpt.unusable").exists()  # moved aside, not deleted


@pytest.mark.parametrize("kind", ["zero-byte", "plain-pickle", "torch-zip"])
def test_malicious_or_broken_checkpoint_is_refused_on_resume(base_run, tmp_path, kind):
    ckpts = _copy(base_run, tmp_path)
    marker = tmp_path / "pwned"
    bad = ckpts / "step=00000099.ckpt"
    payload = {"state_dict": Boom(str(marker))}
    if kind == "zero-byte":
        bad.write_bytes(b"")
    elif kind == "plain-pickle":
        bad.write_bytes(pickle.dumps(payload))
    else:
        torch.save(payload, bad)
    with pytest.warns(UserWarning, match="not resuming from .*step=00000099.ckpt"):
        summary = _train(tmp_path, 6)
    assert not marker.exists()
    assert summary["step"] == 6  # resumed from step 4
    with pytest.raises(UnsafeCheckpointError):
        safe_load(bad.with_name(bad.name + ".unusable"))
    assert not marker.exists()


class Boom:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def test_changed_model_fails_before_config_is_overwritten(base_run, tmp_path):
    from nemo_vfm.models.dit.flavors import dit_config

    _copy(base_run, tmp_path)
    config = (tmp_path / "run" / "config.yaml").read_text()
    model = dit_config("tiny", in_channels=12, context_dim=16, patch_size=(1, 2, 2))
    model.hidden_size *= 2
    with pytest.raises(ValueError, match=r"cannot resume from .*step=00000004.ckpt: its network does not fit.*"
                                         r"model.hidden_size=\d+ \(now \d+\)"):
        _train(tmp_path, 6, model=model)
    assert (tmp_path / "run" / "config.yaml").read_text() == config


def test_resume_false_moves_the_old_run_aside(base_run, tmp_path, capsys):
    _copy(base_run, tmp_path)
    _train(tmp_path, 2, resume=False)
    assert "log.resume=false: moved the earlier run" in capsys.readouterr().out
    old = [p for p in tmp_path.iterdir() if p.name.startswith("run.previous-")]
    assert len(old) == 1 and (old[0] / "checkpoints" / "step=00000004.ckpt").exists()
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir()) == ["step=00000002.ckpt"]


def test_rotation_holds_across_restarts(base_run, tmp_path):
    ckpts = _copy(base_run, tmp_path)
    _train(tmp_path, 6)
    _train(tmp_path, 8)
    assert sorted(p.name for p in ckpts.iterdir()) == ["step=00000006.ckpt", "step=00000008.ckpt"]


# -- failed and killed saves ----------------------------------------------------------------------------
def test_disk_full_during_save_keeps_the_previous_checkpoints(base_run, tmp_path, monkeypatch):
    ckpts = _copy(base_run, tmp_path)
    before = {p.name: p.read_bytes() for p in ckpts.iterdir()}

    def full_disk(checkpoint, f):
        f.write(b"x" * 1000)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpointing, "_write", full_disk)
    with pytest.raises(CheckpointWriteError) as e:
        _train(tmp_path, 6)
    msg = str(e.value)
    assert "could not write checkpoint" in msg and "step=00000006.ckpt" in msg and "the disk is full" in msg
    assert f"the previous checkpoint {ckpts / 'step=00000004.ckpt'} is intact" in msg
    assert {p.name: p.read_bytes() for p in ckpts.iterdir()} == before  # no temp file, nothing lost
    assert latest_checkpoint(ckpts, deep=True).name == "step=00000004.ckpt"


KILL_SCRIPT = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, sys.argv[2])
    from nemo_vfm.lightning import checkpointing
    import test_training_faults as t

    real = checkpointing._write
    def slow(checkpoint, f):  # step 4's save hangs halfway through its temporary file
        if checkpoint["global_step"] == 4:
            f.write(b"partial" * 1000)
            f.flush()
            time.sleep(600)
        real(checkpoint, f)
    checkpointing._write = slow
    t._train(__import__("pathlib").Path(sys.argv[1]), 6)
""")


@pytest.mark.slow
def test_sigkill_during_checkpoint_write(tmp_path):
    script = tmp_path / "kill.py"
    script.write_text(KILL_SCRIPT)
    ckpts = tmp_path / "run" / "checkpoints"
    p = subprocess.Popen([sys.executable, str(script), str(tmp_path), str(Path(__file__).parent)], env=ENV,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while time.time() < deadline and not list(ckpts.glob(".step=00000004.ckpt.tmp*")):
        assert p.poll() is None, p.stderr.read()[-3000:]
        time.sleep(0.1)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    assert list(ckpts.glob(".step=00000004.ckpt.tmp*")) and not (ckpts / "step=00000004.ckpt").exists()
    metrics = tmp_path / "run" / "metrics.jsonl"
    with open(metrics, "a") as f:  # as if the kill had also torn the metrics log's last line
        f.write('{"step": 4, "lo')
    summary = _train(tmp_path, 6)  # resumes from step 2, removes the dead process's temporary file
    assert summary["step"] == 6
    from nemo_vfm.lightning.callbacks import read_metrics

    assert [r["step"] for r in read_metrics(metrics)] == [1, 2, 3, 4, 5, 6]
    assert (tmp_path / "run" / "loss_curve.png").exists()
    assert sorted(p.name for p in ckpts.iterdir()) == ["step=00000004.ckpt", "step=00000006.ckpt"]
    assert verify_checkpoint(ckpts / "step=00000006.ckpt", deep=True) is None


# -- vfm generate: untrusted, broken and wrong inputs ------------------------------------------------------
GEN = {"tokenizer": {"name": "identity", "kwargs": {"spatial_compression": 2}},
       "text_encoder": {"name": "hash", "kwargs": {"dim": 8, "max_length": 4}}, "latent_shape": [12, 2, 4, 4],
       "fps": None}


@pytest.fixture(scope="module")
def gen_ckpt(tmp_path_factory):
    """A Lightning-style checkpoint file of a tiny random text-to-video DiT (no training)."""
    from nemo_vfm.diffusion.edm import EDM
    from nemo_vfm.models.dit.model import DiTConfig

    root = tmp_path_factory.mktemp("gen")
    net = DiTConfig(num_layers=1, hidden_size=32, num_heads=4, in_channels=12, context_dim=8).build()
    g = torch.Generator().manual_seed(0)
    state = {f"model.{k}": torch.randn(v.shape, generator=g) * 0.2 for k, v in net.state_dict().items()}
    path = root / "step=00000004.ckpt"
    torch.save({"hyper_parameters": {"model_config": net.cfg, "objective": EDM(), "generation": GEN},
                "state_dict": state, "global_step": 4}, path)
    return path


def _generate(capsys, *args):
    from nemo_vfm.cli.main import main

    rc = main(["generate", "--prompt", "a red fox", "--steps", "2", "--device", "cpu", *args])
    return rc, capsys.readouterr().err


def test_generate_refuses_a_safetensors_header_that_names_code(gen_ckpt, tmp_path, capsys):
    import json

    from safetensors.torch import save_file

    marker = tmp_path / "pwned"
    header = {"model_config": {"__class__": "subprocess:run", "args": [["touch", str(marker)]]},
              "objective": {"__class__": "nemo_vfm.diffusion.edm:EDM"}, "generation": GEN, "step": 1}
    evil = tmp_path / "evil.safetensors"
    save_file({"w": torch.zeros(1)}, str(evil), metadata={"nemo_vfm": json.dumps(header)})
    rc, err = _generate(capsys, "--ckpt", str(evil), "--out", str(tmp_path / "out"))
    assert rc == 2 and "refusing to load" in err and "'subprocess:run'" in err and "config classes" in err
    assert not marker.exists() and not (tmp_path / "out").exists()


def test_generate_refuses_a_pickle_that_runs_code(tmp_path, capsys):
    marker = tmp_path / "pwned"
    evil = tmp_path / "step=00000001.ckpt"
    torch.save({"hyper_parameters": Boom(str(marker)), "state_dict": {}}, evil)
    rc, err = _generate(capsys, "--ckpt", str(evil), "--out", str(tmp_path / "out"))
    assert rc == 2 and "refusing to load" in err and "posix.system" in err and "--trust-pickle" in err
    assert not marker.exists()


@pytest.mark.parametrize("case", ["zero-byte ckpt", "truncated ckpt", "zero-byte safetensors", "bad header json"])
def test_generate_broken_checkpoints_fail_clearly(gen_ckpt, tmp_path, capsys, case):
    from safetensors.torch import save_file

    if case == "zero-byte ckpt":
        path, expect = tmp_path / "step=00000001.ckpt", "the file is empty"
        path.write_bytes(b"")
    elif case == "truncated ckpt":
        path, expect = tmp_path / "step=00000001.ckpt", "not a complete torch.save archive"
        path.write_bytes(gen_ckpt.read_bytes()[:5000])
    elif case == "zero-byte safetensors":
        path, expect = tmp_path / "m.safetensors", "not a readable safetensors file"
        path.write_bytes(b"")
    else:
        path, expect = tmp_path / "m.safetensors", "header is not valid JSON"
        save_file({"w": torch.zeros(1)}, str(path), metadata={"nemo_vfm": "{not json"})
    rc, err = _generate(capsys, "--ckpt", str(path), "--out", str(tmp_path / "out"))
    assert rc == 2 and expect in err, err
    assert "Traceback" not in err


def test_generate_folder_skips_a_broken_newest_checkpoint(gen_ckpt, tmp_path, capsys):
    import shutil

    shutil.copy(gen_ckpt, tmp_path / "step=00000004.ckpt")
    (tmp_path / "step=00000008.ckpt").write_bytes(b"")
    with pytest.warns(UserWarning, match="skipping checkpoint .*step=00000008.ckpt: the file is empty"):
        rc, _ = _generate(capsys, "--ckpt", str(tmp_path), "--out", str(tmp_path / "out"))
    assert rc == 0 and (tmp_path / "out" / "batch000.mp4").exists()


@pytest.mark.parametrize("args,expect", [
    (["--height", "-32"], "--height must be a positive integer, got -32"),
    (["--batch-size", "0"], "--batch-size must be a positive integer, got 0"),
    (["--frames", "0"], "--frames must be a positive integer, got 0"),
    (["--steps", "0"], "--steps must be a positive integer, got 0"),
    (["--guidance", "nan"], "--guidance must be a finite number"),
    (["--out", "FILE"], "is an existing file"),
])
def test_generate_checks_arguments_before_loading(tmp_path, capsys, args, expect):
    file = tmp_path / "taken.txt"
    file.write_text("x")
    args = [str(file) if a == "FILE" else a for a in args]
    out = [] if "--out" in args else ["--out", str(tmp_path / "out")]
    rc, err = _generate(capsys, "--ckpt", str(tmp_path / "does-not-exist.ckpt"), *out, *args)
    assert rc == 2 and expect in err, err  # the argument, not the missing checkpoint: checked first


def test_generate_refuses_nan_weights(gen_ckpt, tmp_path, capsys):
    ckpt = safe_load(gen_ckpt)
    name = next(k for k in ckpt["state_dict"] if k.endswith("weight"))
    ckpt["state_dict"][name][0] = float("nan")
    bad = tmp_path / "step=00000004.ckpt"
    torch.save(ckpt, bad)
    rc, err = _generate(capsys, "--ckpt", str(bad), "--out", str(tmp_path / "out"))
    assert rc == 2 and "holds NaN/Inf weights" in err and name.removeprefix("model.") in err
    assert not (tmp_path / "out").exists()


# -- sharded (DCP) folders and the data-loader state ------------------------------------------------------
def test_dcp_folders_verify_and_the_newest_complete_one_is_chosen(tmp_path):
    import torch.distributed.checkpoint as dcp

    for step in (2, 4, 6):
        d = tmp_path / f"step={step:08d}.ckpt"
        dcp.save({"state_dict": {"model.w": torch.full((64,), float(step))}}, checkpoint_id=str(d), no_dist=True)
        torch.save({"global_step": step}, d / "meta.pt")
    (tmp_path / "step=00000006.ckpt" / ".metadata").unlink()  # killed before DCP wrote its metadata
    shard = next(p for p in (tmp_path / "step=00000004.ckpt").iterdir() if p.suffix == ".distcp")
    shard.write_bytes(shard.read_bytes()[:10])
    skipped = []
    found = latest_checkpoint(tmp_path, deep=True, on_skip=lambda p, why: skipped.append((p.name, why)))
    assert found.name == "step=00000002.ckpt"
    assert skipped[0] == ("step=00000006.ckpt", "it has no .metadata (the save did not finish)")
    assert skipped[1][0] == "step=00000004.ckpt" and f"shard {shard.name} is truncated" in skipped[1][1]


def test_data_loader_state_unpickles_only_energon_data_classes(tmp_path):
    from megatron.energon.state import FlexState

    from nemo_vfm.io.safe_load import restricted_loads

    state = FlexState(a=1, b=[1, 2])
    assert restricted_loads(pickle.dumps(state), ("megatron.energon",)) == state
    marker = tmp_path / "pwned"
    with pytest.raises(UnsafeCheckpointError, match="names posix.system"):
        restricted_loads(pickle.dumps(Boom(str(marker))), ("megatron.energon",), "the data loader state")
    assert not marker.exists()


def test_disk_full_during_a_sharded_save_removes_the_incomplete_folder(tmp_path):
    """A DCP save failing on some rank (CheckpointException carrying the OSError) names the full disk,
    removes the folder it left without .metadata and keeps the previous checkpoint."""
    from types import SimpleNamespace

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    prev = tmp_path / "step=00000002.ckpt"
    dcp.save({"state_dict": {"model.w": torch.ones(8)}}, checkpoint_id=str(prev), no_dist=True)
    target = tmp_path / "step=00000004.ckpt"

    def failing_save(path, weights_only=False):
        Path(path).mkdir()
        (Path(path) / "__0_0.distcp").write_bytes(b"partial")
        raise CheckpointException("save failed", {1: (OSError(errno.ENOSPC, "No space left on device"), None)})

    trainer = SimpleNamespace(save_checkpoint=failing_save, is_global_zero=True, global_step=4, loggers=[])
    cb = checkpointing.RotatingCheckpoint(tmp_path, 2, 2)
    with pytest.raises(CheckpointWriteError, match=r"the disk is full .*the previous checkpoint .*step=00000002.ckpt "
                                                   r"is intact"):
        cb._save_checkpoint(trainer, str(target))
    assert not target.exists() and verify_checkpoint(prev, deep=True) is None
