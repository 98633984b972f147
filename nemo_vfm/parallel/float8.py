"""FP8 training of the transformer blocks' linear layers with torchao (``pip install nemo-vfm[fp8]``).

    apply_float8(model.blocks, recipe="rowwise", modules="mlp")

Each selected ``nn.Linear`` becomes a ``torchao.float8.Float8Linear``: weights and master weights stay
in their dtype; inputs, weights and output gradients are cast to float8 (e4m3) with dynamic scales
(``tensorwise``: one scale per tensor; ``rowwise``: one per row, more accurate, what torchao
recommends for training) and the three GEMMs of forward/backward run on FP8 tensor cores.
Only worth it under ``torch.compile`` (the casts fuse into neighbouring kernels) and for large
GEMMs; the adaLN modulation (M = batch) and the embedders stay in bf16. Applied after tensor/context
parallelism and before activation checkpointing, compile and FSDP. Not with tensor parallelism
(torchao needs its own float8 TP styles there): :func:`check_float8` says so up front.
"""

from torch import nn

RECIPES = ("tensorwise", "rowwise")
MODULES = ("mlp", "all")  # the MLPs (~2/3 of a DiT block's matmul FLOPs) | + every attention projection


def check_float8(recipe: str | None, modules: str = "mlp", tp: int = 1) -> None:
    """Validate the knobs before any model is built; raises with the fix."""
    if recipe is None:
        return
    if recipe not in RECIPES:
        raise ValueError(f"float8 recipe must be one of {RECIPES} or None, got {recipe!r}.")
    if modules not in MODULES:
        raise ValueError(f"float8 modules must be one of {MODULES}, got {modules!r}.")
    if tp > 1:
        raise NotImplementedError(f"float8 with tensor parallelism (tp={tp}) is not supported; use float8 with "
                                  "FSDP/CP/DP, or tp=1.")
    try:
        import torchao.float8  # noqa: F401
    except ImportError as e:
        raise ImportError("float8 training needs torchao: pip install 'nemo-vfm[fp8]' (torchao>=0.17)") from e


def _selected(fqn: str, mod: nn.Module, modules: str) -> bool:
    """A linear inside an ``mlp`` / ``ffn`` (or, for "all", also inside any ``*attn`` module: attn, cross_attn,
    spatial_attn, ...); never adaLN or embedders. FP8 GEMMs need in/out features divisible by 16."""
    parents = fqn.split(".")[:-1]
    inside = "mlp" in parents or "ffn" in parents or (modules == "all" and any(p.endswith("attn") for p in parents))
    return type(mod) is nn.Linear and inside and mod.in_features % 16 == 0 and mod.out_features % 16 == 0


def apply_float8(blocks: nn.Module, recipe: str = "rowwise", modules: str = "mlp") -> int:
    """Swap the selected linears of ``blocks`` (a block list, one block, or a model: then its ``.blocks``
    only, never its embedders) for Float8Linear, in place; returns how many were converted."""
    check_float8(recipe, modules)
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    blocks = getattr(blocks, "blocks", blocks)
    chosen = {n for n, m in blocks.named_modules() if _selected(n, m, modules)}
    if not chosen:
        raise ValueError(f"no linear layer of {type(blocks).__name__} matches float8 modules={modules!r} "
                         "with in/out features divisible by 16.")
    config = Float8LinearConfig.from_recipe_name(recipe)
    convert_to_float8_training(blocks, config=config, module_filter_fn=lambda m, fqn: fqn in chosen)
    return len(chosen)
