"""``trainer.memory_budget_gb`` on the families with a second (audio) stream: LTX-2 19B and Kandinsky 6 Lite at
their published / derived sizes, built on the meta device (nothing allocated), at the release's default clip
(121 frames x 512 x 768). The plans fit each budget and save more memory at smaller budgets; the audio stream
(LTX-2: ~25 tokens per second, 2048 wide, four attentions a block on each stream) and IC-LoRA's reference tokens
add to the estimate; a family that declares no streams is refused. One network build per family: the LTX-2 tests
share the parameter counts (``count_params`` patched to the cached answer)."""

import dataclasses
import types

import fiddle as fdl
import pytest

from nemo_vfm.lightning import memory_workload
from nemo_vfm.lightning.memory_budget import (
    HEADROOM,
    MemorySettings,
    estimate_gib,
    plan_memory_budget,
    workload,
)
from nemo_vfm.models.common.memory import Clip
from nemo_vfm.models.families import family_spec
from nemo_vfm_recipes import kandinsky6, ltx2

LTX2_LATENT = (128, 16, 16, 24)  # 121 frames x 512 x 768 through the LTX-2 video VAE (8 x 32 x 32): 6,144 tokens
K6_LATENT = (16, 31, 64, 96)  # 121 frames x 512 x 768 through HunyuanVideo's VAE (4 x 8 x 8); patch (1, 2, 2): 47,616
BUDGETS = (24, 32, 48, 80)


def _data(latent, **kw):
    return types.SimpleNamespace(latent_shape=latent, batch_size=1, max_seq_length=None, **kw)


def _parts(recipe) -> dict:
    """The recipe's configs the chooser reads (the data replaced by the clip size: no prepared dataset here)."""
    return {k: fdl.build(getattr(recipe, k)) for k in ("model", "lora", "objective", "trainer", "optim")}


@pytest.fixture(scope="module")
def ltx2_counts():
    """lora_ltx2's configs and its network's parameter counts (one meta build for the module)."""
    parts = _parts(ltx2.lora_ltx2())
    return parts, memory_workload.count_params(parts["model"], parts["lora"])


@pytest.fixture
def ltx2_lora(ltx2_counts, monkeypatch):
    """lora_ltx2's configs, its parameter counts cached for the workloads of the test (LoRA adapters alike)."""
    parts, counts = ltx2_counts
    monkeypatch.setattr(memory_workload, "count_params", lambda *a, **k: counts)
    return parts


def _plans(parts, latent):
    """budget -> (choice, the recipe's settings) of a one-GPU CUDA run (compiled blocks), host not checked."""
    return {b: plan_memory_budget(b, data=_data(latent), cuda=True, torchao=False, host_limit_gib=None, **parts)
            for b in BUDGETS}


def _check_plans(plans):
    """Each estimate fits 90% of its budget; a smaller budget never gets a faster or larger plan."""
    for b, (c, _) in plans.items():
        assert c.gib <= (1 - HEADROOM) * b
    ordered = [plans[b][0] for b in BUDGETS]
    assert all(s.slowdown >= f.slowdown and s.gib <= f.gib for s, f in zip(ordered, ordered[1:]))


def test_lora_ltx2_plans_fit_each_budget(ltx2_lora):
    """24 GiB: block swapping (the 19B base does not fit in bf16 or fp8 with the rest); 32-80: nothing offloaded,
    fp8 bases."""
    plans = _plans(ltx2_lora, LTX2_LATENT)
    _check_plans(plans)
    s24, s32, s80 = (plans[b][0].settings for b in (24, 32, 80))
    assert s24.block_swap > 0 and s32.frozen_dtype == "fp8"
    assert s32.block_swap == 0 and not s32.activation_offload and s80.block_swap == 0 and not s80.activation_offload
    assert s80.activation_checkpointing != "full"  # 80 GiB recomputes less than the recipe's full checkpointing
    assert plans[24][0].slowdown > plans[80][0].slowdown


def test_the_audio_stream_adds_to_the_ltx2_estimate(ltx2_lora):
    """lora_ltx2's objective trains both streams: 126 audio tokens (121 frames at 24 fps, 25 a second) 2048 wide
    beside 6,144 video tokens, and four attentions a block on each stream; video only, the audio stream does not run
    and the video stream keeps two attentions: smaller at every setting (same adapters, so the weights are equal)."""
    model, lora = ltx2_lora["model"], ltx2_lora["lora"]
    both = workload(model, _data(LTX2_LATENT), lora, compile=True, streams=ltx2_lora["objective"].trained_streams)
    video = workload(model, _data(LTX2_LATENT), lora, compile=True, streams=("video",))
    assert [(s.name, s.tokens, s.hidden_size, s.attentions) for s in both.streams] == [
        ("video", 6144, 4096, 4), ("audio", 126, 2048, 4)]
    assert [(s.name, s.tokens, s.attentions) for s in video.streams] == [("video", 6144, 2)]
    assert video.forward_flops < both.forward_flops
    for ac in ("none", "save_attention", "full"):
        s = MemorySettings(activation_checkpointing=ac, frozen_dtype="bf16")
        assert estimate_gib(video, s) < estimate_gib(both, s)
    objective = fdl.build(ltx2.lora_ltx2_video().objective)
    assert objective.trained_streams == ("video",)  # with_video_only: what the chooser reads of the objective


def test_audio_latents_in_the_data_give_the_audio_tokens(ltx2_lora):
    """``audio_shape (Ca, La, M)`` of the data: La tokens (here 2 s of audio against the clip's 5 s)."""
    w = workload(ltx2_lora["model"], _data(LTX2_LATENT, audio_shape=(8, 50, 16)), ltx2_lora["lora"],
                 streams=("video", "audio"))
    assert w.streams[1].tokens == 50


def test_ic_lora_reference_tokens_join_the_video_stream(ltx2_lora):
    """A reference video at half the height and width: 16 x 8 x 12 = 1,536 more video tokens, a larger estimate."""
    model, lora = ltx2_lora["model"], ltx2_lora["lora"]
    plain = workload(model, _data(LTX2_LATENT), lora, streams=("video", "audio"))
    ref = workload(model, _data(LTX2_LATENT, reference_shape=(128, 16, 8, 12)), lora, streams=("video", "audio"))
    assert ref.tokens == plain.tokens + 1536 and ref.streams[1] == plain.streams[1]
    s = MemorySettings(activation_checkpointing="save_attention", frozen_dtype="bf16")
    assert estimate_gib(ref, s) > estimate_gib(plain, s)


def test_context_parallelism_splits_the_video_tokens_only(ltx2_lora):
    """The audio stream is replicated over CP ranks (the LTX-2 family's token split)."""
    w = workload(ltx2_lora["model"], _data(LTX2_LATENT), ltx2_lora["lora"], token_shards=2,
                 streams=("video", "audio"))
    assert [s.tokens for s in w.streams] == [3072, 126]


def test_lora_kandinsky6_3b_plans_fit_each_budget():
    """Video stream only (the training path): 47,616 tokens 1792 wide; the audio stream's weights are held (the
    network is built whole, 3.4B parameters) but run no tokens. 24 GiB keeps full checkpointing; 32-80 take
    save_attention; nothing offloaded."""
    parts = _parts(kandinsky6.lora_kandinsky6_3b())
    plans = _plans(parts, K6_LATENT)
    _check_plans(plans)
    assert plans[24][0].settings.activation_checkpointing == "full"
    assert all(not c.settings.block_swap and not c.settings.activation_offload for c, _ in plans.values())
    w = workload(parts["model"], _data(K6_LATENT), parts["lora"])
    assert [(s.name, s.tokens, s.hidden_size) for s in w.streams] == [("video", 47616, 1792)]
    assert 3.3e9 < sum(p.total for p in w.blocks) + w.outside.total < 3.5e9


def test_kandinsky6_without_checkpointing_is_not_chosen_where_it_ran_out_of_memory():
    """No checkpointing ran out of memory on a 139.8 GiB H200 with 137.3 GiB allocated (2026-11-28): its estimate is
    above that, so the H200's budget takes save_attention (measured there at 24.1 GiB) instead."""
    from nemo_vfm.lightning.memory_budget import MemorySettings, estimate_gib

    parts = _parts(kandinsky6.lora_kandinsky6_3b())
    w = workload(parts["model"], _data(K6_LATENT), parts["lora"], compile=True, autocast=True)
    assert estimate_gib(w, MemorySettings(activation_checkpointing="none", frozen_dtype="bf16")) > 137.3 + 0.6
    choice, _ = plan_memory_budget(139.8, data=_data(K6_LATENT), cuda=True, torchao=False, host_limit_gib=None, **parts)
    assert choice.settings.activation_checkpointing == "save_attention"


def test_streams_a_family_does_not_run_are_refused():
    """An audio objective on Kandinsky 6 (its training path runs video only) or on a one-stream family, and
    reference tokens on Wan: refused, not estimated as video."""
    from nemo_vfm.models.kandinsky6.flavors import kandinsky6_config
    from nemo_vfm.models.wan.flavors import wan_config

    for cfg in (kandinsky6_config("tiny"), wan_config("t2v_1_3b")):
        with pytest.raises(ValueError, match="cannot count"):
            family_spec(cfg).memory_streams(cfg, Clip(grid=(2, 4, 4), streams=("video", "audio")), family_spec(cfg).flops)
    with pytest.raises(ValueError, match="reference tokens"):
        workload(wan_config("t2v_1_3b"), _data((16, 21, 60, 104), reference_shape=(16, 21, 60, 104)))


def test_a_family_without_memory_streams_is_refused(monkeypatch):
    """A declared family whose spec says nothing about its streams, and a config no family declares: both raise
    (never estimated as Wan), naming what to do."""
    from nemo_vfm.models import families
    from nemo_vfm.models.wan.flavors import wan_config

    table = families._table()
    monkeypatch.setattr(families, "_table", lambda: tuple(
        dataclasses.replace(s, memory_streams=None) if s.name == "wan" else s for s in table))
    with pytest.raises(NotImplementedError, match="the wan family declares no memory_streams"):
        workload(wan_config("t2v_1_3b"), _data((16, 21, 60, 104)))

    @dataclasses.dataclass
    class Unknown:
        patch_size: tuple = (1, 2, 2)
        hidden_size: int = 64

    with pytest.raises(NotImplementedError, match="belongs to no declared model family.*unset trainer.memory_budget_gb"):
        workload(Unknown(), _data((16, 2, 4, 4)))


def test_train_hands_its_objective_to_the_chooser(monkeypatch, tmp_path):
    """``train()`` passes the run's objective (whose ``trained_streams`` decide the streams counted), before
    anything is built; with a tiny LTX-2 (LoRA: activations, not gradients, decide), the joint objective's estimate
    exceeds the video-only one."""
    from nemo_vfm.data.synthetic import MockLatentDataModule
    from nemo_vfm.diffusion.audio_video import AudioVideoFlowMatching
    from nemo_vfm.lightning import memory_budget
    from nemo_vfm.lightning.module import OptimConfig
    from nemo_vfm.models.common.lora import LoRAConfig
    from nemo_vfm.models.ltx2.flavors import ltx2_config
    from nemo_vfm.train import ExperimentConfig, TrainerConfig, train

    seen = {}

    def stop(*a, **kw):
        seen.update(kw)
        raise RuntimeError("chooser reached")

    monkeypatch.setattr(memory_budget, "apply_memory_budget", stop)
    objective = AudioVideoFlowMatching(video_only=True)
    model = ltx2_config("tiny")
    data = MockLatentDataModule(latent_channels=8, num_frames=2, height=4, width=4, context_dim=16, context_length=8,
                                audio_shape=(2, 6, 4), batch_size=1, num_samples=2)
    with pytest.raises(RuntimeError, match="chooser reached"):
        train(model=model, data=data, objective=objective, log=ExperimentConfig(root=str(tmp_path)),
              trainer=TrainerConfig(memory_budget_gb=24, accelerator="cpu", devices=1))
    assert seen["objective"] is objective and not (tmp_path / "default").exists()
    monkeypatch.undo()
    trainer = TrainerConfig(accelerator="cpu", devices=1)
    gib = {o.video_only: plan_memory_budget(80, model=model, data=data, trainer=trainer, optim=OptimConfig(),
                                            objective=o, host_limit_gib=None, lora=LoRAConfig(rank=1))[0].gib
           for o in (AudioVideoFlowMatching(), AudioVideoFlowMatching(video_only=True))}
    assert gib[True] < gib[False]


def test_per_token_times_count_where_the_family_declares_them(ltx2_lora):
    """Wan 2.2 TI2V-5B's objective gives per-token times: its stream counts the per-token modulation (a larger
    estimate for an un-checkpointed block, the same with every block's recomputation dropped); a family whose
    streams cannot count it (LTX-2 declares its own) is refused, never under-estimated."""
    from nemo_vfm.models.wan.flavors import wan_config, wan_objective

    assert wan_objective("ti2v_5b").token_timesteps and not hasattr(wan_objective("t2v_1_3b"), "token_timesteps")
    cfg, data = wan_config("ti2v_5b"), _data((48, 31, 44, 80))
    plain, per_token = (workload(cfg, data, token_timesteps=t) for t in (False, True))
    assert per_token.streams[0].token_modulation and not plain.streams[0].token_modulation
    none = MemorySettings(activation_checkpointing="none")
    assert estimate_gib(per_token, none) > estimate_gib(plain, none) + 30  # 30 blocks x 27,280 x 3072 x 29 B
    with pytest.raises(NotImplementedError, match="per-token times.*ltx2 family's memory_streams"):
        workload(ltx2_lora["model"], _data(LTX2_LATENT), ltx2_lora["lora"], token_timesteps=True)
