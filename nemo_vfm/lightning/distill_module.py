"""DMD2 distillation as a LightningModule: a few-step student trained against a frozen teacher and a critic.

``DistillationModule`` is a :class:`~nemo_vfm.lightning.module.DiffusionModule` whose ``model`` is the
*student* (so its EMA, checkpoints' ``model.`` / ``ema.`` weights, ``vfm generate`` and ``vfm export`` are the
student's) with two more networks of the same config: the frozen ``teacher`` (real score) and the trainable
``critic`` (fake score). All three start from the same weights: the config's published weights
(``model.pretrained``, streamed into each), ``init_from`` (a checkpoint: its EMA weights when it has them), or the
student's own initialisation. The strategy lays out all three alike (FSDP2, TP, CP; pipeline parallelism is
refused). One optimizer holds the student's and the critic's parameters in separate groups (the critic's at
``DistillConfig.critic_lr``); ``train_step`` clips each network by its own norm and steps once per batch, so
``global_step`` counts critic updates. The objective itself is :class:`~nemo_vfm.diffusion.distillation.DMD2`.

One micro-batch (:meth:`DistillationModule.forward_backward`)::

    k = dmd.pick_step(shared)                 # the same student step on every rank
    on the generator's steps (every generator_update_every-th):
        x0 = dmd.generate(student, noise, cond, k)       # backward simulation, last pass with grad
        backward(dmd.generator_loss(x0, teacher, critic, cond, uncond))
    else: x0 = the same, without grad
    backward(dmd.critic_loss(critic, x0.detach(), cond))

With ``gan_weight > 0`` the critic also carries DMD2's GAN discriminator: :class:`GANHead` on the token mean of
one critic block's output (``gan_feature_block``, default the middle one), a replicated module trained with the critic
(its gradients averaged over the data-parallel ranks, clipped with the critic's); the generator's turn adds its GAN
term and every critic turn the classification loss on noised real latents (the batch's) against noised student
samples (:class:`~nemo_vfm.diffusion.distillation.DMD2`). Under FSDP, TP, SP and CP alike: under sequence or
context parallelism the block's output holds each rank's tokens, so the head reads them gathered (the token splitter
that ``parallelize`` leaves on the critic as ``vfm_token_parallel``), its gradient is whole on every rank (no TP sum)
and the discriminator's input gradient is completed over the token-split ranks (:meth:`_whole_input_grad`).

The student's schedule (``generation["student"]``: its noise levels) is saved in every checkpoint's header, so
``vfm generate`` samples a student with its own few-step schedule and no CFG.
"""


import copy
from dataclasses import dataclass, fields

import torch

from nemo_vfm.diffusion.conditioning import null_condition
from nemo_vfm.lightning.module import COND_KEYS, DiffusionModule

TEACHER_DTYPES = {None: None, "bf16": torch.bfloat16, "fp16": torch.float16}
MODULE_KNOBS = ("critic_lr", "teacher_dtype")  # read by the Lightning module, not by DMD2


@dataclass(kw_only=True)
class DistillConfig:
    """DMD2's knobs (:class:`~nemo_vfm.diffusion.distillation.DMD2`, whose ``objective`` is the run's), the
    critic's learning rate (``None``: the optimizer's ``lr``) and the frozen teacher's weight dtype (``None``: as
    built; ``"bf16"`` / ``"fp16"``: its floating weights held in half precision, half the memory, under a ``*-mixed``
    precision only)."""

    num_steps: int = 4
    levels: tuple[float, ...] | None = None
    teacher_guidance: float = 5.0
    level_range: tuple[float, float] = (0.02, 0.98)
    generator_update_every: int = 5
    gan_weight: float = 0.0
    gan_critic_weight: float = 0.01
    gan_feature_block: int | None = None
    rho: float = 7.0
    critic_lr: float | None = None
    teacher_dtype: str | None = None

    def __post_init__(self):
        if self.critic_lr is not None and not self.critic_lr > 0:
            raise ValueError(f"DistillConfig.critic_lr must be > 0 (or None: the optimizer's lr), got {self.critic_lr}")
        if self.teacher_dtype == "fp8":
            raise NotImplementedError("DistillConfig.teacher_dtype='fp8' (an FP8 frozen teacher) is not built; use "
                                      "'bf16' (half the teacher's memory) or None")
        if self.teacher_dtype not in TEACHER_DTYPES:
            raise ValueError(f"DistillConfig.teacher_dtype must be one of {sorted(TEACHER_DTYPES, key=str)}, got "
                             f"{self.teacher_dtype!r}")

    def dmd(self, objective):
        """The DMD2 objective over the teacher's ``objective`` (validates every knob)."""
        from nemo_vfm.diffusion.distillation import DMD2

        return DMD2(objective=objective, **{f.name: getattr(self, f.name) for f in fields(self) if f.name not in MODULE_KNOBS})


def student_generation(dmd) -> dict:
    """What a checkpoint records about its student (``generation["student"]``): method, steps, noise levels."""
    return {"method": "dmd2", "num_steps": dmd.num_steps, "levels": [float(v) for v in dmd.schedule()]}


def student_sampling(sampling, dmd):
    """``sampling`` (a ``SamplingConfig``) drawing the student's way: its levels, no CFG."""
    from dataclasses import replace

    levels = student_generation(dmd)["levels"]
    return replace(sampling, sampler="few-step", levels=tuple(levels), num_steps=len(levels), guidance=1.0)


class GANHead(torch.nn.Module):
    """DMD2's discriminator head: features ``(B, S, D)`` (a critic block's output) -> token mean -> LayerNorm ->
    Linear -> SiLU -> Linear -> logits ``(B,)``. Replicated on every rank (``vfm_replicated``: ``train_step`` averages
    its gradients over the data-parallel ranks)."""

    vfm_replicated = True

    def __init__(self, dim: int):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.LayerNorm(dim), torch.nn.Linear(dim, dim), torch.nn.SiLU(),
                                       torch.nn.Linear(dim, 1))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.net(features.mean(dim=1)).squeeze(-1)


class DistillationModule(DiffusionModule):
    """The student (``model``, with EMA and optional LoRA), the frozen ``teacher`` and the ``critic`` (with the
    student's LoRA adapters when ``lora`` is set, else full weights), trained with DMD2 (``distill``)."""

    def __init__(self, model_config, objective, distill: DistillConfig, optim=None, ema_decay: float | None = 0.9999,
                 seed: int = 0, lora=None):
        super().__init__(model_config, objective, optim, ema_decay=ema_decay, cond_dropout=0.0, seed=seed, lora=lora)
        self.distill, self.dmd = distill, distill.dmd(objective)
        self.teacher: torch.nn.Module | None = None
        self.critic: torch.nn.Module | None = None
        self.gan_head: GANHead | None = None
        self._gan_features: list | None = None  # filled by the hook on the critic's feature block while it is armed
        self.hparams["distill"] = distill

    def configure_model(self):
        """Teacher, critic and student from one build (meta where the strategy fills them): the teacher a frozen
        copy, the critic and the student copies with this run's LoRA adapters, the student's EMA."""
        if self.model is not None:
            return
        strategy = self._trainer.strategy if self._trainer is not None else None
        if getattr(strategy, "pipeline_parallel", False):
            raise NotImplementedError("DMD2 distillation under pipeline parallelism is not built; use FSDP, TP or CP "
                                      "(trainer.strategy.pipeline_model_parallel_size=1)")
        base = self.build_network()
        self.teacher = copy.deepcopy(base).requires_grad_(False)
        if self.distill.teacher_dtype is not None:  # (on the meta device too: the weights arrive cast)
            for p in self.teacher.parameters():
                if p.is_floating_point():
                    p.data = p.data.to(TEACHER_DTYPES[self.distill.teacher_dtype])
        self.critic = self.with_lora(copy.deepcopy(base))
        self.model = self.with_lora(base)
        self.ema = self.ema_copy()
        if self.dmd.gan:
            self._arm_discriminator()

    def _arm_discriminator(self) -> None:
        """The GAN head (its width: the config's ``hidden_size``) and a hook on the critic's feature block."""
        blocks = getattr(self.critic, "blocks", None)
        width = getattr(self.model_config, "hidden_size", None)
        if blocks is None or width is None:
            raise NotImplementedError(f"DMD2's GAN term reads a block's output: {type(self.critic).__name__} has no "
                                      "`blocks` or its config no `hidden_size`; set distill.gan_weight=0")
        index = len(blocks) // 2 if self.dmd.gan_feature_block is None else self.dmd.gan_feature_block
        if not 0 <= index < len(blocks):
            raise ValueError(f"distill.gan_feature_block={index} is not a block of the critic (0..{len(blocks) - 1})")
        with torch.random.fork_rng(devices=[]):  # the same initial head on every rank (the gradients are averaged)
            torch.manual_seed(self.seed)
            self.gan_head = GANHead(int(width))

        def keep(module, args, out):
            if self._gan_features is not None:
                self._gan_features.append(out[0] if isinstance(out, (tuple, list)) else out)

        blocks[index].register_forward_hook(keep)

    def _discriminate(self, cond: dict):
        """``D(x_t, level) -> (B,)``: the critic's pass at ``(x_t, level)`` with ``cond``, its feature block's output
        through the GAN head."""
        from nemo_vfm.diffusion.distillation import predict_x0

        tokens = getattr(self.critic, "vfm_token_parallel", None)  # set by parallelize under SP or CP

        def discriminate(x_t, level):
            self._gan_features = []
            try:
                out = predict_x0(self.objective, self.critic, x_t, level, cond)
                features = self._gan_features[0]
                if tokens is not None:  # under SP / CP the block's output holds this rank's tokens: gather them all
                    features = tokens.gather(features)
            finally:
                self._gan_features = None
            if features.dim() != 3 or features.shape[-1] != self.gan_head.net[0].normalized_shape[0]:
                raise ValueError(f"the critic's feature block gave {tuple(features.shape)}, not (B, S, hidden_size)")
            # the network's output joins the graph (times 0): backward then enters the critic where FSDP2 expects it,
            # so its root-level weights are gathered and their gradients reduced as in any backward
            return self.gan_head(features) + 0.0 * out.float().mean()

        return discriminate

    def _whole_input_grad(self, grad: torch.Tensor) -> torch.Tensor:
        """The discriminator's gradient with respect to its input, whole on every rank. Under sequence or context
        parallelism each rank's holds its own tokens' part (the token split's backward pads the rest with zeros),
        times ``cp`` (the feature gather's backward scale, which the data-parallel average of the critic's weights
        undoes): the sum over the token-split ranks, divided by ``cp``."""
        tokens = getattr(self.critic, "vfm_token_parallel", None)
        if tokens is None:
            return grad
        import torch.distributed as dist

        for group in (tokens.sp_group, tokens.cp_group):
            if group is not None:
                dist.all_reduce(grad, group=group)
        return grad / tokens.cp

    def extra_networks(self) -> dict[str, torch.nn.Module]:
        """The networks the strategy lays out besides ``model`` and ``ema``."""
        return {"teacher": self.teacher, "critic": self.critic}

    def init_targets(self) -> list[tuple[torch.nn.Module, bool]]:
        """``init_from`` fills every network with the checkpoint's EMA weights (its raw ones when it has none)."""
        return [(net, True) for net in (self.model, self.ema, self.teacher, self.critic) if net is not None]

    def network_groups(self) -> list[list[torch.nn.Module]]:
        """The student; the critic (with the GAN head)."""
        return [[self.model], [self.critic] + ([self.gan_head] if self.gan_head is not None else [])]

    def optimizer_groups(self) -> list[dict]:
        """The student's groups, then the critic's and the GAN head's (at ``distill.critic_lr`` when set)."""
        critic_lr = {} if self.distill.critic_lr is None else {"lr": self.distill.critic_lr}
        head = [] if self.gan_head is None else self.param_groups(self.gan_head, **critic_lr)
        return self.param_groups(self.model) + self.param_groups(self.critic, **critic_lr) + head

    def _shared_generator(self, micro_batch: int) -> torch.Generator:
        """Seeded by step and micro-batch only: every rank picks the same student step (same number of passes)."""
        return torch.Generator().manual_seed((self.seed * 1_000_003 + self.global_step) * 131 + micro_batch)

    def forward_backward(self, batch, micro_batch: int, backward) -> tuple[torch.Tensor, dict, int]:
        """One micro-batch of DMD2 (module docstring): the generator's loss and backward on its steps, then the
        critic's; returns their sum (logged as ``loss``), the logs and the batch size."""
        if hasattr(batch, "cu_seqlens"):
            raise NotImplementedError("DMD2 distillation on packed (THD) batches is not built; set "
                                      "data.max_seq_length=None")
        real = batch["latents"]  # its shape and the conditions (and the GAN term's real data): the student samples
        g = self.step_generator(real.device, micro_batch)
        cond = {k: batch[k] for k in COND_KEYS if batch.get(k) is not None}
        uncond = null_condition(cond, self.num_classes) if self.dmd.teacher_guidance != 1.0 else None
        k = self.dmd.pick_step(self._shared_generator(micro_batch))
        noise = torch.randn(real.shape, generator=g, device=real.device, dtype=real.dtype)
        logs = {"student_step": torch.tensor(float(k), device=real.device)}
        generator_turn = self.dmd.updates_generator(self.global_step)
        with torch.enable_grad() if generator_turn else torch.no_grad():
            x0 = self.dmd.generate(self.model, noise, cond, k, g)
        loss = torch.zeros((), device=real.device)
        discriminate = self._discriminate(cond) if self.dmd.gan else None
        if generator_turn:
            gen_loss, gen_logs = self.dmd.generator_loss(x0, self.teacher, self.critic, cond, uncond, g)
            if discriminate is not None:
                gan_loss, gan_logs = self.dmd.gan_generator_loss(x0, discriminate, g, self._whole_input_grad)
                gen_loss, gen_logs = gen_loss + gan_loss, {**gen_logs, **gan_logs}
            backward(gen_loss)
            loss, logs = gen_loss.detach(), {**logs, **gen_logs, "generator_loss": gen_loss.detach()}
        # network passes run, in forwards of this batch (the step log's FLOPs): k + 1 student passes, the critic's
        # training pass (3), and on the generator's steps its backward (2), the teacher (2 with CFG) and the critic
        # (+ the GAN term: the critic's two discriminator passes and their backward (6); on the generator's steps one
        # more pass and its backward to the input (3))
        self.forward_units = k + 1 + 3 + (2 + (1 if uncond is None else 2) + 1 if generator_turn else 0)
        critic_loss, critic_logs = self.dmd.critic_loss(self.critic, x0, cond, batch.get("loss_mask"), g)
        if discriminate is not None:
            self.forward_units += 6 + (3 if generator_turn else 0)
            gan_loss, gan_logs = self.dmd.gan_critic_loss(discriminate, real, x0, g)
            critic_loss, critic_logs = critic_loss + gan_loss, {**critic_logs, **gan_logs}
        backward(critic_loss)
        logs.update({f"critic_{name}": v for name, v in critic_logs.items()}, critic_loss=critic_loss.detach())
        return loss + critic_loss.detach(), logs, real.shape[0]

    def forward_loss(self, batch, micro_batch: int):
        raise NotImplementedError("DistillationModule computes two losses with a backward each: use forward_backward")

    @torch.no_grad()
    def update_ema(self, step: int) -> None:
        """The student's EMA moves on the steps that updated the student (``step`` is 1-based)."""
        if self.dmd.updates_generator(step - 1):
            super().update_ema(step)

