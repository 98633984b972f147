"""``vfm generate``: prompt files, samplers, safetensors export, size errors, and torchrun with CP2."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from nemo_vfm.cli.main import main
from nemo_vfm.diffusion.edm import EDM
from nemo_vfm.io.video import read_video

ROOT = Path(__file__).resolve().parents[2]
GEN = {"tokenizer": {"name": "identity", "kwargs": {"spatial_compression": 2}},
       "text_encoder": {"name": "hash", "kwargs": {"dim": 8, "max_length": 4}}, "latent_shape": [12, 2, 4, 4],
       "fps": None}


@pytest.fixture(scope="module")
def exp(tmp_path_factory):
    """An experiment folder with one Lightning-style checkpoint of a tiny random text-to-video DiT."""
    from nemo_vfm.models.dit.model import DiTConfig

    root = tmp_path_factory.mktemp("exp")
    net = DiTConfig(num_layers=2, hidden_size=32, num_heads=4, in_channels=12, context_dim=8,
                    adaln_lora_rank=4).build()
    g = torch.Generator().manual_seed(0)
    state = {f"model.{k}": torch.randn(v.shape, generator=g) * 0.2 for k, v in net.state_dict().items()}
    (root / "checkpoints").mkdir()
    torch.save({"hyper_parameters": {"model_config": net.cfg, "objective": EDM(), "generation": GEN},
                "state_dict": state, "global_step": 4}, root / "checkpoints" / "step=00000004.ckpt")
    (root / "prompts.txt").write_text("a red fox\n\na blue square\na green ball\n")
    return root


def test_prompt_file_in_batches_with_the_res_sampler(exp, tmp_path, capsys):
    rc = main(["generate", "--ckpt", str(exp), "--prompts", str(exp / "prompts.txt"), "--batch-size", "2",
               "--steps", "3", "--sampler", "res", "--out", str(tmp_path), "--device", "cpu"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "time per stage: text encode" in out and "denoise" in out and "decode" in out
    frames, fps = read_video(tmp_path / "batch000.mp4")
    assert frames.shape[0] == 2 and fps == 8.0  # 2 latent frames, identity tokenizer
    assert (tmp_path / "batch001.gif").exists() and (tmp_path / "batch001.txt").read_text() == "a green ball\n"


def test_export_safetensors_then_generate_the_same_video(exp, tmp_path):
    st = tmp_path / "dit.safetensors"
    assert main(["generate", "--ckpt", str(exp), "--export-safetensors", str(st)]) == 0
    for ckpt, out in ((exp, "a"), (st, "b")):
        assert main(["generate", "--ckpt", str(ckpt), "--prompt", "a red fox", "--steps", "2", "--out",
                     str(tmp_path / out), "--device", "cpu"]) == 0
    a, _ = read_video(tmp_path / "a" / "batch000.mp4")
    b, _ = read_video(tmp_path / "b" / "batch000.mp4")
    assert np.array_equal(a, b)


def test_sizes_and_layouts_that_do_not_fit_exit_2_naming_what_works(exp, capsys):
    assert main(["generate", "--ckpt", str(exp), "--prompt", "x", "--height", "10"]) == 2
    assert "latent height 5 must be a multiple of the patch 2 (heights that work: 8 or 12 pixels)" in \
        capsys.readouterr().err
    assert main(["generate", "--ckpt", str(exp), "--prompt", "x", "--cp", "2"]) == 2
    assert "torchrun --nproc-per-node 2" in capsys.readouterr().err
    assert main(["generate", "--ckpt", str(exp), "--prompt", "x", "--sampler", "flow-euler"]) == 2
    assert "choose one of heun, euler, res" in capsys.readouterr().err
    assert main(["generate", "--ckpt", str(exp)]) == 2
    assert "at least one --prompt" in capsys.readouterr().err


def test_torchrun_cp2_writes_the_single_process_video(exp, tmp_path):
    args = ["generate", "--ckpt", str(exp), "--prompt", "a red fox", "--prompt", "a blue square", "--steps", "3",
            "--device", "cpu"]
    assert main(args + ["--out", str(tmp_path / "one")]) == 0
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m",
                        "nemo_vfm.cli.main", *args, "--cp", "2", "--out", str(tmp_path / "cp2")],
                       capture_output=True, text=True, timeout=240, cwd=ROOT, env=env)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert "on 2 process(es): cp=2" in r.stdout
    one, _ = read_video(tmp_path / "one" / "batch000.mp4")
    cp2, _ = read_video(tmp_path / "cp2" / "batch000.mp4")
    assert np.array_equal(one, cp2)
