"""bench/family_step.py on the CPU: a family recipe runs through launchers/train.py on random latents
(``data=mock``) and diffusers' network of the same architecture (peft LoRA or full) steps beside it."""

import json

import pytest

from bench import family_step as fs


@pytest.mark.parametrize("case", ["wan2.2-ti2v-5b-lora", "hunyuan1.5-lora", "kandinsky6-3b-lora", "ltx2-lora"])
def test_ours_and_diffusers_both_step(tmp_path, monkeypatch, case):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    out = tmp_path / "f.json"
    argv = ["--device", "cpu", "--tiny", "--only", case, "--steps", "4", "--every", "2", "--skip", "1",
            "--diffusers-steps", "2", "--warmup", "1", "--commit", "abc", "--out", str(out)]
    assert fs.main(argv) == 0
    d = json.loads(out.read_text())
    (r,) = d["results"]
    assert d["commit"] == "abc" and r["factory"] == fs.CASES[case].factory
    assert r["ours"]["ms"] > 0 and r["ours"]["steps_timed"] == 2  # the run's perf.jsonl, first interval dropped
    assert "data=mock" in r["ours"]["command"] and "launchers/train.py" in r["ours"]["command"]
    assert r["diffusers"]["path"] == "diffusers + peft" and r["diffusers"]["ms"] > 0
    assert r["diffusers"]["trainable_params"] > 0 and r["ratio"] == pytest.approx(r["diffusers"]["ms"] / r["ours"]["ms"])
    assert f"| {case} | tiny |" in out.with_suffix(".md").read_text()


def test_peft_targets_match_the_recipes_linears():
    """diffusers' adapted linears per block are the recipe's LoRA targets (same count), so both train the same."""
    import re

    import torch

    from nemo_vfm_recipes.cosmos import COSMOS_LORA_TARGETS
    from nemo_vfm_recipes.finetune import WAN_LORA_TARGETS
    from nemo_vfm_recipes.hunyuan import HUNYUAN_LORA_TARGETS
    from nemo_vfm_recipes.kandinsky6 import KANDINSKY6_LORA_TARGETS
    from nemo_vfm_recipes.ltx2 import LTX2_LORA_TARGETS, LTX2_VIDEO_LORA_TARGETS

    for name, ours in (("cosmos2.5-2b-lora", COSMOS_LORA_TARGETS), ("hunyuan1.5-lora", HUNYUAN_LORA_TARGETS),
                       ("wan2.2-ti2v-5b-lora", WAN_LORA_TARGETS), ("kandinsky6-3b-lora", KANDINSKY6_LORA_TARGETS),
                       ("ltx2-lora", LTX2_LORA_TARGETS), ("ltx2-video-lora", LTX2_VIDEO_LORA_TARGETS)):
        case = fs.CASES[name]
        model, _ = fs.diffusers_net(case, fs.model_config(case, tiny=True), torch.device("cpu"), torch.float32)
        targets = fs.peft_targets(case)
        linears = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and ".0." in f".{n}."
                   and n.startswith(("transformer_blocks.0.", "blocks.0.", "visual_transformer_blocks.0."))]
        if isinstance(targets, str):
            hit = [n for n in linears if re.fullmatch(targets, n)]
        else:
            hit = [n for n in linears if any(n == t or n.endswith("." + t) for t in targets)]
        assert len(hit) == len(ours), (name, hit)


def test_unknown_case_is_named():
    with pytest.raises(SystemExit):
        fs.parse_args(["--only", "wan9"])
