"""``vfm evaluate``: samples vocabulary captions from a checkpoint, scores them, prints a table, writes JSON."""

import json

import torch

from nemo_vfm.cli.evaluate import vocabulary_captions
from nemo_vfm.cli.main import main
from nemo_vfm.diffusion.edm import EDM
from nemo_vfm.evaluation.shapes import parse_caption

GEN = {"tokenizer": {"name": "identity", "kwargs": {"spatial_compression": 2}},
       "text_encoder": {"name": "hash", "kwargs": {"dim": 8, "max_length": 12}}, "latent_shape": [12, 2, 4, 4],
       "fps": 8.0}


def _checkpoint(root, generation):
    from nemo_vfm.models.dit.model import DiTConfig

    net = DiTConfig(num_layers=1, hidden_size=32, num_heads=4, in_channels=12, context_dim=8).build()
    (root / "checkpoints").mkdir(parents=True)
    torch.save({"hyper_parameters": {"model_config": net.cfg, "objective": EDM(), "generation": generation},
                "state_dict": {f"model.{k}": v for k, v in net.state_dict().items()}, "global_step": 3},
               root / "checkpoints" / "step=00000003.ckpt")
    return root


def test_vocabulary_captions_parse_and_are_seeded():
    caps = vocabulary_captions(20, seed=3)
    assert caps == vocabulary_captions(20, seed=3) and caps != vocabulary_captions(20, seed=4)
    assert all(parse_caption(c) for c in caps)


def test_evaluate_writes_a_table_and_json(tmp_path, capsys):
    exp = _checkpoint(tmp_path / "exp", GEN)
    rc = main(["evaluate", "--ckpt", str(exp), "--num", "3", "--batch-size", "2", "--steps", "2", "--device", "cpu",
               "--out", str(tmp_path / "ev")])
    assert rc == 0
    out = capsys.readouterr().out
    assert "passed all criteria:" in out and "caption" in out
    report = json.loads((tmp_path / "ev" / "evaluation.json").read_text())
    assert report["num_videos"] == 3 and len(report["cells"]) == 3 and report["step"] == 3
    assert report["pass_rate"] == sum(c["passed"] for c in report["cells"]) / 3
    assert [c["caption"] for c in report["cells"]] == vocabulary_captions(3, seed=0)
    assert (tmp_path / "ev" / "samples.gif").exists()


def test_evaluate_refuses_checkpoints_without_a_tokenizer(tmp_path, capsys):
    exp = _checkpoint(tmp_path / "exp", {})
    assert main(["evaluate", "--ckpt", str(exp), "--device", "cpu", "--out", str(tmp_path / "ev")]) == 2
    assert "does not record its tokenizer" in capsys.readouterr().err
    assert main(["evaluate", "--ckpt", str(exp), "--num", "0"]) == 2
