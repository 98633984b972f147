"""DMD2 distillation as a training run (``nemo_vfm.lightning.distill_module``): what each step updates, that one
micro-batch's gradients are the DMD2 objective's, checkpoints that resume exactly, ``init_from`` filling all three
networks, and the student's own sampler in previews, ``vfm generate`` and ``vfm evaluate``."""

import argparse
import math

import lightning as L
import pytest
import torch

from nemo_vfm.data.synthetic import MockLatentDataModule
from nemo_vfm.diffusion.edm import EDM
from nemo_vfm.diffusion.flow_matching import FlowMatching
from nemo_vfm.lightning.distill_module import DistillationModule, DistillConfig, student_sampling
from nemo_vfm.lightning.module import OptimConfig
from nemo_vfm.models.dit.model import DiTConfig


def _cfg():
    return DiTConfig(num_layers=1, hidden_size=32, num_heads=2, in_channels=4, context_dim=16)


def _data(batch_size=2):
    return MockLatentDataModule(latent_channels=4, num_frames=2, height=4, width=4, context_dim=16, context_length=3,
                                batch_size=batch_size, num_samples=64)


def _fit(module, steps, callbacks=()):
    trainer = L.Trainer(max_steps=steps, accelerator="cpu", devices=1, precision="32-true", gradient_clip_val=1.0,
                        callbacks=list(callbacks), logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, datamodule=_data())
    return trainer


def _built(module):
    """``module`` with its networks built and the student's weights perturbed (a zero-initialised output layer gives
    every network the same prediction, so the DMD gradient would be 0), copied into the teacher, critic and EMA."""
    module.configure_model()
    with torch.no_grad():
        for p in module.model.parameters():
            p.add_(0.2 * torch.randn_like(p))
        for net in (module.teacher, module.critic, module.ema):
            if net is not None:
                net.load_state_dict(module.model.state_dict())
    return module


def _snapshot(module):
    return {net: [p.detach().clone() for p in getattr(module, net).parameters()]
            for net in ("model", "critic", "teacher", "ema")}


def test_each_step_updates_the_critic_and_every_nth_the_student_the_teacher_never():
    torch.manual_seed(0)
    module = _built(DistillationModule(_cfg(), EDM(), DistillConfig(num_steps=2, generator_update_every=3),
                                       OptimConfig(warmup_steps=0, lr=1e-3), ema_decay=0.9))
    history = []

    class Record(L.Callback):
        def on_train_batch_start(self, trainer, m, batch, batch_idx):
            history.append(_snapshot(m))

        def on_train_end(self, trainer, m):
            history.append(_snapshot(m))

    trainer = _fit(module, 4, [Record()])
    assert trainer.global_step == 4
    moved = lambda net, i: any(not torch.equal(a, b) for a, b in zip(history[i][net], history[i + 1][net]))
    assert [moved("critic", i) for i in range(4)] == [True] * 4
    assert [moved("model", i) for i in range(4)] == [True, False, False, True]  # steps 0 and 3 (every 3rd)
    assert [moved("ema", i) for i in range(4)] == [True, False, False, True]  # the EMA follows the student's steps
    assert not any(moved("teacher", i) for i in range(4))
    assert all(p.grad is None for p in module.teacher.parameters())
    groups = trainer.optimizers[0].param_groups  # the student's two groups, then the critic's
    n_model = sum(p.numel() for g in groups[:2] for p in g["params"])
    assert n_model == sum(p.numel() for p in module.model.parameters())
    assert {id(p) for g in groups[2:] for p in g["params"]} == {id(p) for p in module.critic.parameters()}


@pytest.mark.parametrize("objective", [EDM(), FlowMatching(shift=3.0)], ids=["edm", "flow"])
def test_a_micro_batch_backward_is_the_dmd2_objective(objective):
    """The student's gradient is the DMD2 generator loss's and the critic's is the denoising loss on the student's
    (detached) sample, with the module's own draws replayed by hand."""
    torch.manual_seed(0)
    module = _built(DistillationModule(_cfg(), objective, DistillConfig(num_steps=3, generator_update_every=1),
                                       OptimConfig(warmup_steps=0), ema_decay=None))
    data = _data()
    data.setup("fit")
    batch = next(iter(data.train_dataloader()))
    module.step_generator = lambda device, micro: torch.Generator().manual_seed(7)
    module._shared_generator = lambda micro: torch.Generator().manual_seed(3)
    loss, logs, n = module.forward_backward(batch, 0, lambda loss: loss.backward())
    got = {net: [p.grad.clone() for p in getattr(module, net).parameters()] for net in ("model", "critic")}
    for net in (module.model, module.critic):
        net.zero_grad()

    dmd, g = module.dmd, torch.Generator().manual_seed(7)
    cond = {k: batch[k] for k in ("context", "context_mask") if k in batch}
    from nemo_vfm.diffusion.conditioning import null_condition

    k = dmd.pick_step(torch.Generator().manual_seed(3))
    noise = torch.randn(batch["latents"].shape, generator=g)
    x0 = dmd.generate(module.model, noise, cond, k, g)
    gen_loss, _ = dmd.generator_loss(x0, module.teacher, module.critic, cond, null_condition(cond), g)
    gen_loss.backward()
    critic_loss, _ = dmd.critic_loss(module.critic, x0, cond, None, g)
    critic_loss.backward()
    assert n == 2 and float(logs["student_step"]) == k
    assert torch.allclose(loss, gen_loss + critic_loss)
    for net in ("model", "critic"):
        want = [p.grad for p in getattr(module, net).parameters()]
        assert all(torch.equal(a, b) for a, b in zip(got[net], want)), net
    assert any(float(p.abs().max()) > 0 for p in got["model"]) and any(float(p.abs().max()) > 0 for p in got["critic"])


def _train(root, steps, init_from=None, lora=None, **distill):
    from nemo_vfm.train import ExperimentConfig, TrainerConfig, train

    trainer = TrainerConfig(max_steps=steps, accelerator="cpu", devices=1, precision="32-true", log_every_n_steps=1,
                            checkpoint_every_n_steps=2, enable_progress_bar=False, gradient_clip_val=1.0)
    return train(model=_cfg(), data=_data(), trainer=trainer, objective=FlowMatching(shift=3.0), ema_decay=0.9,
                 optim=OptimConfig(lr=1e-3, warmup_steps=0), init_from=init_from, lora=lora,
                 distill=DistillConfig(num_steps=2, generator_update_every=2, **distill),
                 log=ExperimentConfig(name="d", root=str(root), tensorboard=False))


def _state(ckpt):
    state = torch.load(ckpt, map_location="cpu", weights_only=False)
    return state["state_dict"], state


def test_resume_is_exact_and_checkpoints_hold_the_critic_but_no_teacher_optimizer_state(tmp_path):
    """With the GAN term on (its head is saved, trained with the critic and logged); without it, the same path minus
    the head (``tests/test_recipes_resume.py`` resumes ``distill_quickstart``)."""
    gan = dict(gan_weight=0.01, gan_critic_weight=0.05)
    straight = _train(tmp_path / "a", 4, **gan)
    _train(tmp_path / "b", 2, **gan)
    resumed = _train(tmp_path / "b", 4, **gan)
    assert resumed["step"] == 4
    a, full = _state(straight["checkpoint"])
    b, _ = _state(resumed["checkpoint"])
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert {k.split(".")[0] for k in a} == {"model", "ema", "teacher", "critic", "gan_head"}
    assert {k for k in a if k.startswith("gan_head.")} == {f"gan_head.net.{i}.{w}" for i in (0, 1, 3)
                                                          for w in ("weight", "bias")}
    n_trained = sum(1 for k in a if k.startswith(("model.", "critic.", "gan_head.")))
    assert len(full["optimizer_states"][0]["state"]) == n_trained  # AdamW state for student, critic and head only
    text = "".join(p.read_text() for p in (tmp_path / "a").rglob("metrics.jsonl"))
    assert "critic_gan_loss" in text and "gan_generator_loss" in text


def test_init_from_fills_teacher_critic_and_student_with_the_teachers_ema(tmp_path):
    from nemo_vfm.train import ExperimentConfig, TrainerConfig, train

    teacher_run = train(model=_cfg(), data=_data(), objective=FlowMatching(shift=3.0), ema_decay=0.5,
                        trainer=TrainerConfig(max_steps=2, accelerator="cpu", devices=1, precision="32-true",
                                              enable_progress_bar=False),
                        log=ExperimentConfig(name="t", root=str(tmp_path), tensorboard=False))
    teacher_ema, _ = _state(teacher_run["checkpoint"])
    for teacher_dtype, precision in ((None, "32-true"), ("bf16", "bf16-mixed")):  # a half-precision teacher too
        seen = {}

        class Capture(L.Callback):
            def on_train_start(self, trainer, module, seen=seen):
                for net in ("model", "critic", "teacher", "ema"):
                    seen[net] = {n: p.detach().clone() for n, p in getattr(module, net).named_parameters()}

        trainer = TrainerConfig(max_steps=1, accelerator="cpu", devices=1, precision=precision, callbacks=[Capture()],
                                enable_progress_bar=False)
        result = train(model=_cfg(), data=_data(), trainer=trainer, objective=FlowMatching(shift=3.0), ema_decay=0.9,
                       init_from=teacher_run["checkpoint"], distill=DistillConfig(num_steps=2, teacher_dtype=teacher_dtype),
                       log=ExperimentConfig(name=f"s{teacher_dtype}", root=str(tmp_path), tensorboard=False))
        assert math.isfinite(result["loss"])
        for net, params in seen.items():
            dtype = torch.bfloat16 if net == "teacher" and teacher_dtype else torch.float32
            assert all(p.dtype == dtype and torch.equal(p, teacher_ema[f"ema.{n}"].to(dtype)) for n, p in params.items()), net
    assert not all(torch.equal(teacher_ema[f"ema.{n}"], teacher_ema[f"model.{n}"]) for n in seen["model"])
    with pytest.raises(ValueError, match="distill.teacher_dtype='bf16' keeps frozen weights in half precision"):
        train(model=_cfg(), data=_data(), trainer=TrainerConfig(max_steps=1, accelerator="cpu", precision="32-true"),
              distill=DistillConfig(teacher_dtype="bf16"), log=ExperimentConfig(name="x", root=str(tmp_path)))
    with pytest.raises(NotImplementedError, match="FP8 frozen teacher"):
        DistillConfig(teacher_dtype="fp8")
    with pytest.raises(ValueError, match="teacher_dtype must be one of"):
        DistillConfig(teacher_dtype="int8")


@pytest.mark.parametrize("objective", [EDM(), FlowMatching(shift=3.0)], ids=["edm", "flow"])
def test_the_few_step_sampler_is_the_students_sample(objective):
    from nemo_vfm.diffusion.distillation import DMD2
    from nemo_vfm.inference.generate import SamplingConfig
    from nemo_vfm.inference.sampling import sample_latents

    torch.manual_seed(0)
    net = _cfg().build().eval()
    dmd = DMD2(objective=objective, num_steps=3)
    cond = {"context": torch.randn(2, 3, 16), "context_mask": torch.ones(2, 3, dtype=torch.bool)}
    shape = (2, 4, 2, 4, 4)
    got = sample_latents(net, objective, shape, cond, None, guidance=1.0, num_steps=3, sampler="few-step", seed=5,
                         levels=dmd.schedule().tolist())
    noise = torch.randn(shape, generator=torch.Generator().manual_seed(5))
    want = dmd.sample(net, noise, cond, torch.Generator().manual_seed(6))
    assert torch.allclose(got, want, atol=1e-6)
    sampling = student_sampling(SamplingConfig(), dmd)
    assert (sampling.sampler, sampling.num_steps, sampling.guidance) == ("few-step", 3, 1.0)


def test_cli_samples_a_student_its_way_and_refuses_contradicting_flags(capsys):
    from nemo_vfm.cli.generate import sampling_config
    from nemo_vfm.inference.checkpoint_info import Generation

    gen = Generation.from_dict({"student": {"method": "dmd2", "num_steps": 2, "levels": [1.0, 0.5]}})
    args = lambda **kw: argparse.Namespace(**{"steps": None, "guidance": None, "sampler": None, "seed": 0, **kw})
    cfg = sampling_config(args(), gen, FlowMatching(), "run/ckpt")
    assert (cfg.sampler, cfg.num_steps, cfg.guidance, cfg.levels) == ("few-step", 2, 1.0, (1.0, 0.5))
    assert "2-step distilled student" in capsys.readouterr().out
    with pytest.raises(ValueError, match="samples 2 steps; drop --steps"):
        sampling_config(args(steps=35), gen, FlowMatching(), "run/ckpt")
    with pytest.raises(ValueError, match="without classifier-free guidance; drop --guidance"):
        sampling_config(args(guidance=5.0), gen, FlowMatching(), "run/ckpt")
    teacher = sampling_config(args(), Generation.from_dict({}), FlowMatching(), "run/ckpt")
    assert (teacher.sampler, teacher.num_steps, teacher.guidance) == ("flow-euler", 35, 5.0)


def test_bad_distillation_settings_fail_before_anything_is_built(tmp_path):
    from nemo_vfm.diffusion.first_frame import FirstFrameFlowMatching
    from nemo_vfm.train import ExperimentConfig, TrainerConfig, train

    log = ExperimentConfig(name="x", root=str(tmp_path), tensorboard=False)
    with pytest.raises(ValueError, match="num_steps must be >= 1"):
        train(model=_cfg(), data=_data(), distill=DistillConfig(num_steps=0), log=log)
    with pytest.raises(NotImplementedError, match="not built yet"):
        train(model=_cfg(), data=_data(), objective=FirstFrameFlowMatching(patch_size=(1, 2, 2)),
              distill=DistillConfig(), log=log)
    with pytest.raises(ValueError, match="critic_lr must be > 0"):
        DistillConfig(critic_lr=0.0)
    with pytest.raises(NotImplementedError, match="DMD2 holds three"):
        train(model=_cfg(), data=_data(), distill=DistillConfig(), log=log,
              trainer=TrainerConfig(max_steps=1, accelerator="cpu", memory_budget_gb=24))
    assert not (tmp_path / "x").exists()


def test_a_lora_distillation_names_every_frozen_weight_for_checkpoints_to_leave_out():
    """On published weights a LoRA run's checkpoint leaves out what the folder holds: here the teacher whole and the
    student's and critic's frozen bases (``lora_checkpoint.module_frozen_keys``); the adapters stay."""
    from nemo_vfm.lightning.lora_checkpoint import module_frozen_keys
    from nemo_vfm.models.common.lora import LoRAConfig

    module = DistillationModule(_cfg(), FlowMatching(), DistillConfig(), ema_decay=None,
                                lora=LoRAConfig(rank=2, targets=("attn.q", "attn.k")))
    module.configure_model()
    frozen = module_frozen_keys(module)
    state = module.state_dict()
    assert {k for k in state if k.startswith("teacher.")} <= frozen
    assert not [k for k in frozen if ".lora_" in k]
    for root in ("model", "critic"):
        adapters = [k for k in state if k.startswith(root + ".") and ".lora_" in k]
        assert adapters and not set(adapters) & frozen
        assert any(k.startswith(root + ".") for k in frozen)


def test_the_generators_gan_term_leaves_the_critics_weights_alone():
    torch.manual_seed(0)
    module = _built(DistillationModule(_cfg(), FlowMatching(shift=3.0), DistillConfig(num_steps=2, gan_weight=0.01),
                                       OptimConfig(warmup_steps=0)))
    assert module.gan_head is not None and module.network_groups()[1] == [module.critic, module.gan_head]
    data = _data()
    data.setup("fit")
    batch = next(iter(data.train_dataloader()))
    cond = {k: batch[k] for k in ("context", "context_mask")}
    x0 = module.dmd.generate(module.model, torch.randn_like(batch["latents"]), cond, 0)
    loss, logs = module.dmd.gan_generator_loss(x0, module._discriminate(cond))
    loss.backward()
    assert all(p.grad is None for p in module.critic.parameters())
    assert all(p.grad is None for p in module.gan_head.parameters())
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in module.model.parameters())
    assert logs["gan_generator_loss"] > 0


def test_the_gan_term_refuses_a_missing_block(tmp_path):
    module = DistillationModule(_cfg(), FlowMatching(), DistillConfig(gan_weight=0.01, gan_feature_block=5),
                                OptimConfig())
    with pytest.raises(ValueError, match="gan_feature_block=5 is not a block"):
        module.configure_model()
