"""Training our tokenizer: held-out PSNR rises, artifacts are written, recipes/launcher/benchmark run."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nemo_vfm.tokenizers.causal import CausalTokenizerConfig
from nemo_vfm.tokenizers.metrics import psnr, ssim
from nemo_vfm.tokenizers.registry import build_tokenizer
from nemo_vfm.train_tokenizer import TokenizerDataConfig, TokenizerLossConfig, train_tokenizer

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}  # subprocesses: one thread (see conftest.one_cpu_thread)


def test_metrics():
    x = torch.rand(2, 3, 3, 16, 16) * 2 - 1
    assert torch.allclose(psnr(x, x), torch.full((2,), 100.0))
    y = (x + 0.2).clamp(-1, 1)
    mse = ((x + 1) / 2 - (y + 1) / 2).pow(2).flatten(1).mean(1)
    assert torch.allclose(psnr(y, x), -10 * torch.log10(mse), atol=1e-4)
    assert torch.allclose(ssim(x, x), torch.ones(2), atol=1e-5) and (ssim(torch.rand_like(x), x) < 0.2).all()


def test_training_raises_held_out_psnr_by_3db(tmp_path):
    """200 CPU steps (~7 s on one core) of a width-8 tokenizer on 5x16x16 synthetic clips: >= 3 dB (3.7 measured)."""
    m = train_tokenizer(tokenizer=CausalTokenizerConfig(width=8, latent_channels=8, max_mult=2),
                        data=TokenizerDataConfig(num_frames=5, height=16, width=16, val_clips=4),
                        max_steps=200, batch_size=4, lr=3e-4, val_every=100, out_dir=str(tmp_path), progress=False,
                        device="cpu", threads=1)
    assert m["final"]["psnr"] - m["initial"]["psnr"] >= 3.0, m["history"]
    assert m["final"]["ssim"] > m["initial"]["ssim"]
    saved = json.loads((tmp_path / "metrics.json").read_text())
    assert saved["psnr_gain_db"] == pytest.approx(m["psnr_gain_db"])
    assert (tmp_path / "recon_step0.mp4").stat().st_size > 0 and (tmp_path / "recon_step200.mp4").stat().st_size > 0
    tok = build_tokenizer("causal", checkpoint=str(tmp_path / "tokenizer.pt"))
    from nemo_vfm.train_tokenizer import _Clips

    z = tok.encode(_Clips(TokenizerDataConfig(num_frames=5, height=16, width=16, seed=7)).train_batch(0, 8))
    assert 0.3 < float(z.std()) < 3.0  # normalized with the measured latent statistics


def test_optional_loss_terms_and_validation(tmp_path):
    net = torch.jit.script(torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU()))
    net.save(str(tmp_path / "features.jit"))
    loss = TokenizerLossConfig(perceptual_weight=0.1, perceptual_net=str(tmp_path / "features.jit"),
                               adversarial_weight=0.1, adversarial_start=0, mse_weight=1.0)
    m = train_tokenizer(tokenizer=CausalTokenizerConfig(width=4, latent_channels=4, max_mult=1, bottleneck="kl"),
                        data=TokenizerDataConfig(num_frames=5, height=16, width=16, val_clips=2), loss=loss,
                        max_steps=2, batch_size=2, out_dir=str(tmp_path / "run"), videos=False, progress=False,
                        device="cpu")
    assert all(torch.isfinite(torch.tensor(h["psnr"])) for h in m["history"])
    with pytest.raises(ValueError, match="perceptual_net"):
        TokenizerLossConfig(perceptual_weight=1.0)
    with pytest.raises(ValueError, match=r"num_frames = 1 \+ 4\*k"):
        train_tokenizer(data=TokenizerDataConfig(num_frames=8), max_steps=1, out_dir=str(tmp_path / "bad"))
    with pytest.raises(ValueError, match="source must be 'synthetic' or a directory"):
        TokenizerDataConfig(source="/no/such/dir")


def test_recipes_build_and_serialize():
    run = pytest.importorskip("nemo_run")
    import fiddle as fdl
    from nemo_run.core.serialization.yaml import YamlSerializer

    from nemo_vfm_recipes import tokenizer as recipes

    for name, (tc, sc) in {"tokenizer_4x8x8": (4, 8), "tokenizer_8x8x8": (8, 8), "tokenizer_8x16x16": (8, 16),
                           "tokenizer_tiny": (4, 8)}.items():
        recipe = getattr(recipes, name)()
        assert isinstance(recipe, run.Partial) and recipe.__fn_or_cls__ is train_tokenizer
        cfg = fdl.build(recipe.tokenizer)
        assert (cfg.temporal_compression, cfg.spatial_compression) == (tc, sc)
        data = fdl.build(recipe.data)
        assert (data.num_frames - 1) % tc == 0 and data.height % sc == 0
        assert "tokenizer:" in YamlSerializer().serialize(recipe)


def test_launcher_runs_and_fails_loudly(tmp_path):
    pytest.importorskip("nemo_run")
    cmd = [sys.executable, str(ROOT / "launchers" / "train_tokenizer.py"), "--factory", "tokenizer_tiny", "--yes"]
    bad = subprocess.run(cmd + ["tokenizer.bogus=1"], capture_output=True, text=True, cwd=tmp_path, timeout=300, env=ENV)
    assert bad.returncode != 0
    ok = subprocess.run(cmd + ["max_steps=2", "videos=false", "data.val_clips=1", f"out_dir={tmp_path / 'out'}",
                               "progress=false"], capture_output=True, text=True, cwd=tmp_path, timeout=300, env=ENV)
    assert ok.returncode == 0, ok.stdout[-2000:] + ok.stderr[-2000:]
    assert json.loads((tmp_path / "out" / "metrics.json").read_text())["steps"] == 2


def test_throughput_benchmark_runs_on_cpu(tmp_path):
    out = tmp_path / "bench.json"
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "tokenizer_throughput.py"), "--device", "cpu", "--tiny",
                        "--out", str(out)], capture_output=True, text=True, timeout=300, env=ENV)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = json.loads(out.read_text())["results"]
    assert [row["name"] for row in rows] == ["causal_4x8x8", "causal_8x8x8", "causal_8x16x16"]
    assert all(row["encode_fps"] > 0 and row["decode_fps"] > 0 for row in rows)
