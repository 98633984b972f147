"""``vfm``: a user's mistake gets one sentence on stderr and exit code 2, not a traceback (issue 29, item 6)."""

import argparse
import json
import subprocess
import sys
import textwrap

import pytest
import torch

from nemo_vfm.cli.main import main
from nemo_vfm.diffusion.edm import EDM

GEN = {"tokenizer": {"name": "identity", "kwargs": {"spatial_compression": 2}},
       "text_encoder": {"name": "hash", "kwargs": {"dim": 8, "max_length": 4}}, "latent_shape": [12, 2, 4, 4],
       "fps": None}


def _err(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


@pytest.fixture(scope="module")
def exp(tmp_path_factory):
    """An experiment folder with one checkpoint of a tiny random DiT."""
    from nemo_vfm.models.dit.model import DiTConfig

    root = tmp_path_factory.mktemp("exp")
    net = DiTConfig(num_layers=1, hidden_size=32, num_heads=4, in_channels=12, context_dim=8).build()
    (root / "checkpoints").mkdir()
    torch.save({"hyper_parameters": {"model_config": net.cfg, "objective": EDM(), "generation": GEN},
                "state_dict": {f"model.{k}": v for k, v in net.state_dict().items()}, "global_step": 4},
               root / "checkpoints" / "step=00000004.ckpt")
    return root


@pytest.fixture(scope="module")
def wan(tmp_path_factory):
    """A tiny Wan transformer folder in the diffusers layout."""
    from nemo_vfm.models.wan.convert import save_weights
    from nemo_vfm.models.wan.model import WanConfig

    cfg = WanConfig(num_layers=1, hidden_size=24, num_heads=2, ffn_size=32, in_channels=4, out_channels=4,
                    context_dim=16, freq_dim=16)
    folder = tmp_path_factory.mktemp("wan") / "transformer"
    save_weights(cfg.build().state_dict(), folder, cfg)
    return folder


def test_export_refuses_an_unsafe_checkpoint_in_a_sentence(tmp_path, capsys):
    (tmp_path / "checkpoints").mkdir()
    torch.save({"hyper_parameters": {"x": argparse.Namespace(a=1)}, "state_dict": {}, "global_step": 1},
               tmp_path / "checkpoints" / "step=00000001.ckpt")
    assert main(["export", "--ckpt", str(tmp_path), "--format", "lora", "--out", str(tmp_path / "x")]) == 2
    err = _err(capsys)
    assert err.startswith("vfm export: error: ") and "argparse.Namespace" in err and "--trust-pickle" in err


def test_export_of_a_missing_checkpoint(tmp_path, capsys):
    assert main(["export", "--ckpt", str(tmp_path / "nope"), "--format", "safetensors", "--out",
                 str(tmp_path / "x")]) == 2
    assert f"checkpoint not found: {tmp_path / 'nope'}" in _err(capsys)


@pytest.mark.parametrize("fmt", ["safetensors", "diffusers", "lora"])
def test_export_of_a_published_wan_folder_says_use_it_as_it_is(wan, tmp_path, capsys, fmt):
    assert main(["export", "--ckpt", str(wan), "--format", fmt, "--out", str(tmp_path / "x")]) == 2
    assert "is a published Wan folder, not a training run" in _err(capsys)
    assert main(["generate", "--ckpt", str(wan), "--export-safetensors", str(tmp_path / "y")]) == 2
    assert "is a published Wan folder" in _err(capsys)


def test_wan_config_without_num_layers_names_the_entry(wan, tmp_path, capsys):
    import shutil

    folder = shutil.copytree(wan, tmp_path / "wan")
    cfg = json.loads((folder / "config.json").read_text())
    del cfg["num_layers"]
    (folder / "config.json").write_text(json.dumps(cfg))
    assert main(["generate", "--ckpt", str(folder), "--prompt", "x", "--out", str(tmp_path / "o")]) == 2
    assert f"{folder / 'config.json'}: this diffusers WanTransformer3DModel config.json lacks the entry " \
           "'num_layers'" in _err(capsys)


def test_generate_refuses_a_size_that_cannot_fit_before_allocating(exp, tmp_path, capsys):
    rc = main(["generate", "--ckpt", str(exp), "--prompt", "x", "--height", "100000", "--width", "100000",
               "--out", str(tmp_path), "--device", "cpu"])
    err = _err(capsys)
    assert rc == 2 and "1 video(s) of 2x100000x100000 px (1,250,000,000 video tokens each) need at least" in err
    assert "GiB are free; lower --height / --width / --frames or --batch-size" in err


def test_prepare_with_an_unknown_tokenizer_writes_nothing(tmp_path, capsys):
    (tmp_path / "raw").mkdir()
    out = tmp_path / "out"
    assert main(["prepare", f"input={tmp_path / 'raw'}", f"output={out}", "tokenizer=bogus"]) == 2
    assert "unknown tokenizer 'bogus'; choose one of: identity" in _err(capsys) and not out.exists()


def test_safetensors_header_whose_objective_is_another_config_class(exp, tmp_path, capsys):
    from safetensors import safe_open
    from safetensors.torch import save_file

    good = tmp_path / "good.safetensors"
    assert main(["generate", "--ckpt", str(exp), "--export-safetensors", str(good)]) == 0
    with safe_open(str(good), "pt") as f:
        meta, tensors = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
    header = json.loads(meta["nemo_vfm"])
    header["objective"] = {"__class__": "nemo_vfm.inference.generate:SamplingConfig"}
    bad = tmp_path / "bad.safetensors"
    save_file(tensors, str(bad), metadata={**meta, "nemo_vfm": json.dumps(header)})
    assert main(["generate", "--ckpt", str(bad), "--prompt", "x", "--out", str(tmp_path / "o"), "--device", "cpu"]) == 2
    assert f"{bad} records a SamplingConfig as its objective, which is not a diffusion objective" in _err(capsys)


def test_second_prepare_on_the_same_output_is_refused_while_the_first_runs(tmp_path, capsys):
    """The first run holds the output's lock (here: a process that took it and waits)."""
    out = tmp_path / "out"
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from nemo_vfm.io.run_lock import acquire
        acquire({str(out / ".prepare" / "rank0.lock")!r}, "output", "")
        print("locked", flush=True)
        time.sleep(60)""")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        (tmp_path / "raw").mkdir()
        assert main(["prepare", f"input={tmp_path / 'raw'}", f"output={out}"]) == 2
        err = _err(capsys)
        assert f"output {out} is in use by pid {holder.pid} on " in err
        assert "wait for that vfm prepare to finish (the same command then resumes), or give another output=" in err
        assert sorted(p.name for p in out.rglob("*")) == [".prepare", "rank0.lock"]  # nothing else written
    finally:
        holder.kill()
        holder.wait()
