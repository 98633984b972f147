"""NeMo's diffusion factory names and the MoE recipes: they build, serialize and dry-run through
launchers/train.py; every flavor's parameter count matches its name; the staged recipes chain."""

import subprocess
import sys
from pathlib import Path

import fiddle as fdl
import nemo_run as run
import pytest
import torch

from nemo_vfm.train import train
from nemo_vfm_recipes import moe, upstream

ROOT = Path(__file__).resolve().parents[1]
UPSTREAM = ["pretrain_ditllama1b", "pretrain_ditllama3b", "pretrain_ditllama5b", "pretrain_ditllama30b",
            "pretrain_ditllama30b_stage2_mock", "pretrain_ditllama30b_stage3_mock",
            "pretrain_ditllama30b_stage3_mock_with_pp", "pretrain_ditllama5b_stage3_mock_with_pp", "pretrain_7b_pack",
            "pretrain_7b_256p_joint", "pretrain_7b_256p_joint_pack", "mock_ditllama5b_8k", "mock_dit7b_8k",
            "train_mock"]
MOE = ["pretrain_ecditllama1b", "quickstart_moe"]
SEED_NAMES = ["pretrain", "pretrain_l", "pretrain_xl", "pretrain_7b"] + UPSTREAM + MOE  # NeMo's names we carry


@pytest.mark.parametrize("name", UPSTREAM + MOE)
def test_recipe_builds_and_serializes(name):
    from nemo_run.core.serialization.yaml import YamlSerializer

    recipe = getattr(upstream if name in UPSTREAM else moe, name)()
    assert isinstance(recipe, run.Partial) and recipe.__fn_or_cls__ is train
    fdl.build(recipe.model).build("meta")
    if not isinstance(recipe.trainer.strategy, str):
        fdl.build(recipe.trainer.strategy)  # the layout's knobs agree with each other
    assert "model:" in YamlSerializer().serialize(recipe)


def test_every_seed_factory_name_dry_runs_and_ecditllama_takes_ep2():
    script = (
        "import sys; sys.path.insert(0, 'launchers'); import train as T\n"
        f"names = {SEED_NAMES!r}\n"
        "bad = [n for n in names if T.main(['--factory', n, '--yes', '--dryrun']) != 0]\n"
        "rc = T.main(['--factory', 'pretrain_ecditllama1b', '--yes', '--dryrun',"
        " 'trainer.strategy.expert_model_parallel_size=2'])\n"
        "print('BAD', bad, 'EP2', rc)\n"
    )
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "BAD [] EP2 0" in r.stdout, (r.stdout[-3000:], r.stderr[-3000:])
    assert "expert_model_parallel_size=2" in r.stdout and r.stdout.count("Dry run for task") == len(SEED_NAMES) + 1


def test_launcher_dryrun_of_ecditllama1b_with_ep2_exits_zero():
    r = subprocess.run([sys.executable, str(ROOT / "launchers" / "train.py"), "--factory", "pretrain_ecditllama1b",
                        "--yes", "--dryrun", "trainer.strategy.expert_model_parallel_size=2"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "expert_model_parallel_size=2" in r.stdout and "routing='expert_choice'" in r.stdout


# -- parameter counts -------------------------------------------------------------------------------
# NeMo's DiT-Llama 1B/3B count the transformer without the text cross-attention; 5B, 30B and the DiTs with it
# (4096-dim T5 text). Every count lies within 15% of its name.
COUNTS = [("moviegen", "1b", 1e9, False), ("moviegen", "3b", 3e9, False), ("moviegen", "5b", 5e9, True),
          ("moviegen", "30b", 30e9, True), ("dit", "7b", 7e9, True), ("dit", "14b", 14e9, True),
          ("dit", "28b", 28e9, True)]


@pytest.mark.parametrize("family, flavor, named, cross", COUNTS)
def test_flavor_parameter_count_matches_its_name(family, flavor, named, cross):
    if family == "dit":
        from nemo_vfm.models.dit.flavors import dit_config as config
    else:
        from nemo_vfm.models.moviegen.flavors import moviegen_config as config
    n = config(flavor, in_channels=16, context_dim=4096 if cross else None).build("meta").num_params()
    assert abs(n - named) / named < 0.15, f"{family}-{flavor}: {n / 1e9:.2f}B"


def test_moviegen_30b_is_the_papers_shape():
    from nemo_vfm.models.moviegen.flavors import moviegen_config

    cfg = moviegen_config("30b")
    assert (cfg.num_layers, cfg.hidden_size, cfg.ffn_size, cfg.num_heads, cfg.num_kv_heads) == (48, 6144, 16384,
                                                                                                 48, 48)


def test_ecditllama1b_active_parameters_match_the_dense_1b():
    recipe = moe.pretrain_ecditllama1b()
    cfg = fdl.build(recipe.model)
    net = cfg.build("meta")
    experts = sum(p.numel() for n, p in net.named_parameters() if ".experts." in n)
    active = net.num_params() - experts + experts * cfg.moe.capacity_factor / cfg.moe.num_experts
    dense = fdl.build(upstream.pretrain_ditllama1b().model).build("meta").num_params()
    assert abs(active - dense) / dense < 0.01 and net.num_params() > 1.4 * dense


def test_ecditllama1b_steps_on_the_dense_1b_global_batch_in_two_micro_batches():
    recipe, dense = moe.pretrain_ecditllama1b(), upstream.pretrain_ditllama1b()
    assert recipe.data.batch_size * recipe.trainer.accumulate_grad_batches == dense.data.batch_size == 96
    assert recipe.data.batch_size == 48


# -- the staged recipes chain -------------------------------------------------------------------------
def _tiny_stage(recipe, root: Path, latent, lr=1e-3):
    from nemo_vfm_recipes.moviegen import moviegen_model

    recipe.model = moviegen_model("tiny", in_channels=4, context_dim=16)
    recipe.data.latent_channels, recipe.data.context_dim, recipe.data.context_length = 4, 16, 4
    recipe.data.num_frames, recipe.data.height, recipe.data.width = latent
    recipe.data.batch_size, recipe.data.num_samples = 2, 8
    recipe.trainer.strategy, recipe.trainer.devices, recipe.trainer.accelerator = "auto", 1, "cpu"
    recipe.trainer.precision, recipe.trainer.max_steps, recipe.trainer.checkpoint_every_n_steps = "32-true", 2, 2
    recipe.trainer.log_every_n_steps, recipe.trainer.enable_progress_bar = 1, False
    recipe.optim.lr, recipe.optim.warmup_steps = lr, 0
    recipe.log.root = str(root)
    if recipe.init_from is not None:  # the previous stage's experiment folder, under this test's root
        recipe.init_from = str(root / Path(recipe.init_from).name)
    return recipe


def _weights(ckpt: str, ema: bool) -> dict:
    from nemo_vfm.inference.checkpoint import full_state_dict, read_checkpoint_info

    return full_state_dict(read_checkpoint_info(ckpt), use_ema=ema)


def test_three_stages_chain_on_cpu(tmp_path):
    s1 = upstream.pretrain_ditllama30b()
    s2 = upstream.pretrain_ditllama30b_stage2_mock()
    s3 = upstream.pretrain_ditllama30b_stage3_mock()
    assert s1.init_from is None and s2.init_from == f"experiments/{s1.log.name}"
    assert s3.init_from == f"experiments/{s2.log.name}"
    out1 = fdl.build(_tiny_stage(s1, tmp_path, (1, 4, 4)))()  # 256 px images (tiny)
    # stage 2 barely moves (lr 1e-12): its weights end where stage 1's ended; its EMA started from stage 1's EMA
    # and took two warm-up steps towards those weights (decay (1 + step) / (10 + step))
    out2 = fdl.build(_tiny_stage(s2, tmp_path, (2, 4, 4), lr=1e-12))()
    m1, e1 = _weights(out1["checkpoint"], False), _weights(out1["checkpoint"], True)
    m2, e2 = _weights(out2["checkpoint"], False), _weights(out2["checkpoint"], True)
    assert set(m1) == set(m2) and all(torch.allclose(m1[k], m2[k], atol=1e-6) for k in m1)
    for k in e1:
        want = e1[k]
        for step in (1, 2):
            d = (1 + step) / (10 + step)
            want = d * want + (1 - d) * m1[k]
        assert torch.allclose(e2[k], want, atol=1e-6), k
    out3 = fdl.build(_tiny_stage(s3, tmp_path, (4, 8, 8)))()  # longer sequences
    assert out3["step"] == 2 and out3["loss"] is not None
    # control: without init_from the second stage starts from a fresh initialisation
    fresh = _tiny_stage(upstream.pretrain_ditllama30b_stage2_mock(), tmp_path, (2, 4, 4), lr=1e-12)
    fresh.init_from, fresh.log.name = None, "fresh"
    w = _weights(fdl.build(fresh)()["checkpoint"], False)
    w1 = _weights(out1["checkpoint"], False)
    assert not all(torch.allclose(w1[k], w[k], atol=1e-6) for k in w1)


def test_init_from_a_missing_stage_fails_before_training(tmp_path):
    recipe = _tiny_stage(upstream.pretrain_ditllama30b_stage2_mock(), tmp_path, (2, 4, 4))
    with pytest.raises(FileNotFoundError, match="train the previous stage first"):
        fdl.build(recipe)()
