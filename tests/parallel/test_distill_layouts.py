"""DMD2 distillation (``nemo_vfm.lightning.distill_module``) through ``train()`` on 2 gloo processes trains like one
process: the student's and the critic's weights after 4 steps (two of them updating the student), under FSDP2 with
CP2 (ring and all-to-all) and TP2 with sequence parallel; the teacher never moves. With DMD2's GAN term too (its
head's weights as well), under TP2, TP2 + SP and CP2."""

import pytest
from gloo_launcher import run_distributed

LAYOUTS = {
    "CP2 ring + FSDP": dict(context_parallel_size=2),
    "CP2 all-to-all": dict(context_parallel_size=2, context_parallel_kind="a2a", fsdp=False),
    "TP2 + SP": dict(tensor_model_parallel_size=2, sequence_parallel=True),
}


def _distil(rank, world, root, layouts, gan=None, precision="32-true"):
    import lightning as L
    from torch.distributed.tensor import DTensor

    from nemo_vfm.data.synthetic import MockLatentDataModule
    from nemo_vfm.diffusion.flow_matching import FlowMatching
    from nemo_vfm.lightning.distill_module import DistillConfig
    from nemo_vfm.lightning.module import OptimConfig
    from nemo_vfm.lightning.strategy import VFMParallelStrategy
    from nemo_vfm.models.dit.model import DiTConfig
    from nemo_vfm.parallel.grads import clean_name
    from nemo_vfm.train import ExperimentConfig, TrainerConfig, train

    full = lambda t: (t.full_tensor() if isinstance(t, DTensor) else t).detach().cpu().clone()
    out = {}
    for name, kw in layouts.items():
        seen = out[name] = {}

        class Capture(L.Callback):
            def __init__(self, seen):
                self.seen = seen

            def on_train_start(self, trainer, module):
                self.seen["teacher0"] = {clean_name(n): full(p) for n, p in module.teacher.named_parameters()}
                if gan:
                    self.seen["gan_head0"] = {n: full(p) for n, p in module.gan_head.named_parameters()}

            def on_train_end(self, trainer, module):
                for net in ("model", "critic", "teacher", "ema") + (("gan_head",) if gan else ()):
                    self.seen[net] = {clean_name(n): full(p) for n, p in getattr(module, net).named_parameters()}
                self.seen["teacher_dtypes"] = {p.dtype for p in module.teacher.parameters()}

        model = DiTConfig(num_layers=2, hidden_size=32, num_heads=4, in_channels=4, context_dim=16)
        data = MockLatentDataModule(latent_channels=4, num_frames=2, height=4, width=4, context_dim=16,
                                    context_length=3, batch_size=2, num_samples=16)
        strategy = VFMParallelStrategy(param_dtype=None, **kw) if world > 1 else "auto"
        trainer = TrainerConfig(max_steps=4, devices=world, accelerator="cpu", precision=precision, strategy=strategy,
                                gradient_clip_val=1.0, callbacks=[Capture(seen)], enable_progress_bar=False,
                                checkpoint_every_n_steps=100, final_checkpoint=False)
        train(model=model, data=data, trainer=trainer, objective=FlowMatching(shift=3.0), ema_decay=0.9,
              optim=OptimConfig(lr=1e-3, warmup_steps=0), distill=DistillConfig(num_steps=3, generator_update_every=2, **(gan or {})),
              log=ExperimentConfig(name=name.replace(" ", "_"), root=root, tensorboard=False))
    return out


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return run_distributed(_distil, 1, str(tmp_path_factory.mktemp("one")), {"one": {}})[0]["one"]


def _max_err(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def _off_one_process(results, layouts, ref, nets) -> dict:
    """Layout -> the max errors of ``nets`` against the one-process ``ref``, for the layouts some rank is off by 1e-5."""
    failures = {}
    for name in layouts:
        for r in results:
            errs = {net: _max_err(r[name][net], ref[net]) for net in nets}
            if not all(e < 1e-5 for e in errs.values()):
                failures[name] = errs
    return failures


def test_distillation_layouts_train_like_one_process(reference, tmp_path):
    import torch

    ref = reference
    assert _max_err(ref["teacher"], ref["teacher0"]) == 0  # frozen
    assert _max_err(ref["model"], ref["teacher"]) > 0 and _max_err(ref["critic"], ref["teacher"]) > 0  # both trained
    results = run_distributed(_distil, 2, str(tmp_path), LAYOUTS)
    failures = _off_one_process(results, LAYOUTS, ref, ("model", "critic", "teacher", "ema"))
    assert not failures, failures
    assert all(torch.equal(results[0][n]["model"][k], results[1][n]["model"][k]) for n in LAYOUTS
               for k in ref["model"])


GAN = dict(gan_weight=0.01, gan_critic_weight=0.05)
GAN_LAYOUTS = {
    "TP2": dict(tensor_model_parallel_size=2),
    "TP2 + SP": dict(tensor_model_parallel_size=2, sequence_parallel=True),
    "CP2 ring + FSDP": dict(context_parallel_size=2),
}


def test_the_gan_term_trains_like_one_process_under_tp_sp_and_cp(tmp_path):
    """DMD2's GAN term (the discriminator head on a critic block's output) on 2 ranks gives one process's student,
    critic and head. Under SP / CP the block's output holds each rank's tokens: the head reads them gathered, its
    gradient is whole on every rank (not summed over TP), and the discriminator's input gradient (the generator's
    GAN term) is completed over the token-split ranks."""
    ref = run_distributed(_distil, 1, str(tmp_path / "one"), {"one": {}}, GAN)[0]["one"]
    assert _max_err(ref["gan_head"], ref["gan_head0"]) > 0  # the head trained
    results = run_distributed(_distil, 2, str(tmp_path / "two"), GAN_LAYOUTS, GAN)
    failures = _off_one_process(results, GAN_LAYOUTS, ref, ("model", "critic", "gan_head", "ema"))
    assert not failures, failures


def test_the_gan_heads_stay_replicated_and_a_bf16_teacher_runs_under_fsdp(tmp_path):
    """Under data parallel + FSDP (each rank its own samples) the GAN head, a replicated module beside the sharded
    networks, starts the same on every rank and its gradients are averaged, so it stays the same; it trains. The
    teacher is held in bf16 (``teacher_dtype``, under bf16 autocast) and stays as loaded."""
    import torch

    gan = dict(gan_weight=0.01, gan_critic_weight=0.05, teacher_dtype="bf16")
    results = run_distributed(_distil, 2, str(tmp_path), {"DP2 + FSDP": {}}, gan, "bf16-mixed")
    for r in results:
        assert r["DP2 + FSDP"]["teacher_dtypes"] == {torch.bfloat16}
        assert _max_err(r["DP2 + FSDP"]["teacher"], r["DP2 + FSDP"]["teacher0"]) == 0
    heads = [r["DP2 + FSDP"]["gan_head"] for r in results]
    assert _max_err(heads[0], heads[1]) == 0
    assert _max_err(results[0]["DP2 + FSDP"]["gan_head0"], results[1]["DP2 + FSDP"]["gan_head0"]) == 0
    assert _max_err(heads[0], results[0]["DP2 + FSDP"]["gan_head0"]) > 0  # it trained
    assert all(torch.isfinite(v).all() for r in results for net in ("model", "critic") for v in r["DP2 + FSDP"][net].values())
