"""Parallel-layout fiddlers: plain functions over a recipe that set ``trainer.strategy``.

    from nemo_vfm_recipes import dit, parallel
    recipe = parallel.with_cp(parallel.with_tp(dit.pretrain_7b(), 2, sequence_parallel=True), 4)
    recipe = parallel.with_fsdp(recipe, activation_checkpointing="selective")
    recipe = parallel.with_pp(recipe, 2, schedule="interleaved")   # 2 pipeline ranks, 4 stages
    recipe = parallel.with_ep(moe.pretrain_ecditllama1b(), 4)        # MoE experts over 4 ranks

CLI (NeMo-Run dotted overrides reach the same knobs)::

    torchrun --nproc-per-node 8 launchers/train.py --factory pretrain_7b --yes \
        trainer.strategy.tensor_model_parallel_size=2 trainer.strategy.context_parallel_size=4

Every fiddler keeps the other knobs already set, so they compose in any order. Sizes are checked
against the world size and the model when the processes start, before the model is built.
"""

from __future__ import annotations

import nemo_run as run

from nemo_vfm.lightning.strategy import VFMParallelStrategy


def strategy(recipe: run.Partial) -> run.Config[VFMParallelStrategy]:
    """The recipe's ``VFMParallelStrategy`` config, put in place of a Lightning strategy name (``"auto"``) first,
    so that its knobs can be set on any recipe: ``parallel.strategy(recipe).tensor_model_parallel_size = 2``."""
    s = recipe.trainer.strategy
    if not (isinstance(s, run.Config) and s.__fn_or_cls__ is VFMParallelStrategy):
        s = run.Config(VFMParallelStrategy)
        recipe.trainer.strategy = s
    return s


def with_fsdp(recipe: run.Partial, *, replicate: int = 1, activation_checkpointing: str | None = None,
              param_dtype: str = "bf16", reduce_dtype: str = "fp32") -> run.Partial:
    """Shard parameters, gradients and optimizer state over the data-parallel (and CP) ranks with FSDP2;
    ``replicate > 1``: HSDP (shard within groups, replicate across ``replicate`` groups)."""
    s = strategy(recipe)
    s.fsdp, s.data_parallel_replicate_size = True, replicate
    s.param_dtype, s.reduce_dtype = param_dtype, reduce_dtype
    if activation_checkpointing is not None:
        s.activation_checkpointing = activation_checkpointing
    return recipe


def with_ddp(recipe: run.Partial) -> run.Partial:
    """Plain data parallel: every data-parallel rank keeps all parameters, gradients are all-reduced."""
    strategy(recipe).fsdp = False
    return recipe


def with_tp(recipe: run.Partial, size: int, *, sequence_parallel: bool = True) -> run.Partial:
    """Tensor parallel over ``size`` ranks (heads, MLP columns); sequence parallel splits the tokens
    between them outside attention/MLP (recommended: it cuts activation memory by ``size``)."""
    s = strategy(recipe)
    s.tensor_model_parallel_size, s.sequence_parallel = size, sequence_parallel and size > 1
    return recipe


def with_cp(recipe: run.Partial, size: int, kind: str = "ring") -> run.Partial:
    """Context parallel over ``size`` ranks: ``kind="ring"`` (P2P, any head count) or ``"a2a"``
    (all-to-all / Ulysses, needs heads per TP rank divisible by ``size``)."""
    if kind not in ("ring", "a2a"):
        raise ValueError(f"with_cp kind must be 'ring' or 'a2a', got {kind!r}")
    s = strategy(recipe)
    s.context_parallel_size, s.context_parallel_kind = size, kind
    return recipe


def with_pp(recipe: run.Partial, size: int, schedule: str = "1f1b", microbatches: int | None = None) -> run.Partial:
    """Pipeline parallel over ``size`` ranks: the blocks split into ``size`` stages (``schedule="interleaved"``:
    two per rank), the conditioning embedders run on every stage. ``schedule``: ``"1f1b"``, ``"interleaved"`` or
    ``"gpipe"``; ``microbatches`` per step defaults to the number of stages and must divide each data-parallel
    rank's batch."""
    from nemo_vfm.parallel.dims import PP_SCHEDULES

    if schedule not in PP_SCHEDULES:
        raise ValueError(f"with_pp schedule must be one of {PP_SCHEDULES}, got {schedule!r}")
    s = strategy(recipe)
    s.pipeline_model_parallel_size, s.pipeline_schedule, s.microbatches = size, schedule, microbatches
    return recipe


def with_ep(recipe: run.Partial, size: int) -> run.Partial:
    """Expert parallel over ``size`` ranks: each MoE layer's experts split between them, tokens exchanged by
    all-to-all (``nemo_vfm.parallel.expert_parallel``). ``size`` divides the FSDP data-parallel ranks, which stay
    on (experts are FSDP-sharded over the rest)."""
    s = strategy(recipe)
    s.expert_model_parallel_size, s.fsdp = size, True
    return recipe


def with_activation_checkpointing(recipe: run.Partial, mode: str = "full", every: int = 2) -> run.Partial:
    """``"full"`` (every block), ``"save_attention"`` (every block, its self-attention output kept),
    ``"selective"`` (every ``every``-th block) or ``"selective_op"`` (``nemo_vfm.parallel.activation_checkpoint``)."""
    s = strategy(recipe)
    s.activation_checkpointing, s.activation_checkpointing_every = mode, every
    return recipe


def with_compile(recipe: run.Partial) -> run.Partial:
    """``torch.compile`` each transformer block."""
    strategy(recipe).compile = True
    return recipe


def with_float8(recipe: run.Partial, scaling: str = "tensorwise", modules: str = "all") -> run.Partial:
    """FP8 training of the blocks' linears through torchao (``scaling``: "tensorwise" | "rowwise";
    ``modules``: "mlp" | "all"), with compiled blocks, where it pays: wide models (-12% forward+backward time for DiT-7B
    at 8k tokens on an H100), not DiT-XL (docs/benchmarks.md). Not with tensor parallelism. The defaults are
    what measured fastest there (tensorwise, every linear; rowwise gained nothing), not the strategy's
    conservative ``mlp``/off."""
    s = strategy(recipe)
    s.float8, s.float8_modules, s.compile = scaling, modules, True
    return recipe


# -- default layouts (per 8-GPU node; the leftover ranks become FSDP data parallel) ------------------
def layout_7b(recipe: run.Partial, context: str = "8k", tp: int | None = None) -> run.Partial:
    """DiT-7B on 80 GB GPUs: selective activation checkpointing at 8k tokens (``pretrain_7b`` adds
    ``trainer.memory_budget_gb="auto"``, which chooses for the card: none on 141 GB, ``save_attention`` on 7 of the 28
    blocks on 80 GB). At 8k tokens FSDP over every GPU, no TP
    (``tp`` default 1): faster per GPU than the paper's TP2 + SP + FSDP (docs/benchmarks.md section 7); at this width TP's collectives sit between the GEMMs and cost
    about what TP divides. Either layout shards the weights, gradients, AdamW state and EMA (20 bytes a parameter)
    over every GPU, so 4 GPUs of 80 GB are the fewest (at 2, ~74 GiB of state alone; measured peaks in
    docs/benchmarks.md section 7).
    At 74k tokens TP2 + SP + CP4 (``tp`` default 2, not measured there: sequence parallel halves the activations)
    with all-to-all CP and compiled blocks (measured faster than ring and than eager at 74k: docs/parallelism.md) and
    ``save_attention`` checkpointing: at 74k the attention is most of a block's work, and keeping its output runs
    as fast as selective at half the memory (TP1 + CP4 on 4 H200s: 6,502 ms, 46.9 GiB against 6,529 ms, 94.1 GiB;
    docs/benchmarks.md section 8). ``tp=2`` at 8k is the paper's layout (NeMo's 519 TFLOP/s setting)."""
    if context not in ("8k", "74k"):
        raise ValueError(f"layout_7b context must be '8k' or '74k', got {context!r}")
    tp = tp if tp is not None else (2 if context == "74k" else 1)  # a tp that does not divide the heads: check_model
    checkpointing = "save_attention" if context == "74k" else "selective"
    recipe = with_fsdp(with_tp(recipe, tp), activation_checkpointing=checkpointing)
    if context == "74k":
        recipe = with_compile(with_cp(recipe, 4, kind="a2a"))
    return recipe


def layout_28b(recipe: run.Partial) -> run.Partial:
    """DiT-28B: TP4 + SP, FSDP over the rest, full activation checkpointing. 28B x 16 bytes of
    weights, gradients and Adam state = 448 GB, so at least 16 GPUs of 80 GB (28 GB each)."""
    return with_fsdp(with_tp(recipe, 4), activation_checkpointing="full")
