"""How a :class:`~nemo_vfm.models.moviegen.model.MovieGen` is parallelised: the plan as data.

Order: tensor/sequence parallel -> context parallel -> activation checkpointing -> compile -> FSDP,
with the DiT's token hooks and CP cores (``nemo_vfm.models.dit.parallelize``): the MovieGen block
takes the same token/conditioning arguments. Under TP the query heads and the key/value heads are
split alike, so ``num_kv_heads`` must be divisible by ``tp``. FSDP2 is the default for the large
flavors (``recipes/moviegen.py``: 30B shards over every data-parallel rank).

Not here: pipeline parallelism (raises ``NotImplementedError``); packed batches under CP/SP.
"""

from __future__ import annotations

from torch import nn

from nemo_vfm.models.dit.parallelize import _install_token_hooks, _replace_cores, _TokenParallel
from nemo_vfm.parallel.activation_checkpoint import apply_activation_checkpointing
from nemo_vfm.parallel.compile import compile_blocks
from nemo_vfm.parallel.dims import ParallelDims
from nemo_vfm.parallel.fsdp import apply_fsdp
from nemo_vfm.parallel.mesh import ParallelMesh
from nemo_vfm.parallel.tensor_parallel import apply_tensor_parallel

TP_PLAN: dict[str, str] = {
    "attn": "sp_input",
    "attn.q": "colwise", "attn.k": "colwise", "attn.v": "colwise", "attn.proj": "rowwise",
    "cross_attn": "sp_input",
    "cross_attn.q": "colwise", "cross_attn.k": "colwise", "cross_attn.v": "colwise", "cross_attn.proj": "rowwise",
    "mlp": "sp_input",
    "mlp.w1": "colwise", "mlp.w3": "colwise", "mlp.w2": "rowwise",
}
SP_INPUT_ARITY = {"attn": 2, "cross_attn": 3, "mlp": 1}
SELF_ATTENTION_CORES = ("attn.core",)
TP_PARTIAL = ("blocks.*.q_norm.weight", "blocks.*.k_norm.weight")
PP_DUPLICATED = ("t_embedder.*", "fps_embedder.*", "y_embedder.*", "t_block.*")


def check_layout(cfg, dims: ParallelDims, latent_shape: tuple[int, int, int] | None = None) -> None:
    """Fail before building anything if ``cfg`` (a MovieGenConfig) does not fit ``dims``."""
    if dims.pp > 1:
        raise NotImplementedError("pipeline parallelism is not implemented for MovieGen yet; use TP/CP/FSDP "
                                  "(FSDP is how MovieGen 30B is trained).")
    if cfg.num_kv_heads % dims.tp:
        raise ValueError(f"num_kv_heads={cfg.num_kv_heads} is not divisible by tensor parallel size tp={dims.tp}; "
                         f"pick tp among the divisors of {cfg.num_kv_heads}.")
    tokens = None
    if latent_shape is not None:
        tokens = 1
        for n, p in zip(latent_shape, cfg.patch_size):
            tokens *= n // p
    dims.check_model(num_heads=cfg.num_heads, num_layers=cfg.num_layers, num_tokens=tokens)


def parallelize_moviegen(
    model: nn.Module,
    pmesh: ParallelMesh,
    *,
    activation_checkpointing: str = "none",
    ac_every: int = 2,
    compile: bool = False,
    param_dtype: str | None = "bf16",
    reduce_dtype: str | None = "fp32",
    attention_backend: str = "auto",
    reshard_after_forward: bool = True,
) -> nn.Module:
    """Apply TP/SP, CP, activation checkpointing, compile and FSDP to ``model`` in place; return it."""
    d = pmesh.dims
    check_layout(model.cfg, d)
    blocks = model.blocks
    if d.tp > 1:
        apply_tensor_parallel(blocks, pmesh.get("tp"), TP_PLAN, sequence_parallel=d.sequence_parallel,
                              sp_input_arity=SP_INPUT_ARITY)
    if d.cp > 1:
        _replace_cores(blocks, pmesh, attention_backend)
    if d.cp > 1 or d.sequence_parallel:
        _install_token_hooks(model, _TokenParallel(pmesh))
    apply_activation_checkpointing(blocks, activation_checkpointing, ac_every)
    if compile:
        compile_blocks(blocks)
    if d.fsdp:
        apply_fsdp(model, list(blocks), pmesh.get("fsdp"), param_dtype=param_dtype, reduce_dtype=reduce_dtype,
                   reshard_after_forward=reshard_after_forward)
    return model


parallelize = parallelize_moviegen  # the family-generic name
