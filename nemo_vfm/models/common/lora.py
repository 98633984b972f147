"""Low-rank adapters (LoRA) for the ``nn.Linear`` layers of any family, built to compose with our
parallel plans (TP/SP by module path, FSDP2 per block, compiled blocks).

    y = base(x) + scale * lora_B(lora_A(dropout(x))),   scale = alpha / rank,   lora_B = 0 at start

:func:`apply_lora` swaps each targeted ``nn.Linear`` at ``path`` for a :class:`LoRALinear` whose children
are ``path.base`` (the original layer, frozen), ``path.lora_A`` (``in -> rank``) and ``path.lora_B``
(``rank -> out``), and freezes everything else. Apply it BEFORE parallelizing: FSDP2 then shards base and
adapters of a block together (frozen parameters get no gradient and no optimizer state), and
``nemo_vfm.parallel.tensor_parallel`` expands a plan entry that lands on a LoRALinear into its three
pieces (see :func:`lora_tp_entries`).

Why not ``peft``: peft keeps adapters in per-adapter-name ``ModuleDict`` s (``lora_A.default``) behind a
Python dispatch over active adapters, and is not installed with the framework (it pulls transformers and
accelerate). Our plans address linears by module path and need stable names for the TP expansion, the
state-dict keys and the diffusers export (``nemo_vfm.models.common.lora_export``); the module below is
~150 lines. Interop with peft/diffusers goes through the exported file (``lora_A.weight`` /
``lora_B.weight`` per layer, the layout ``load_lora_weights`` reads).

State-dict keys: ``<path>.base.weight``, ``<path>.base.bias``, ``<path>.lora_A.weight``,
``<path>.lora_B.weight``. :func:`merge_lora_state_dict` folds them into plain ``<path>.weight`` keys.

``frozen_dtype``: None keeps the frozen weights as built; "bf16" / "fp16" cast every frozen floating parameter;
"fp8" stores each base weight as e4m3 bits with a per-output-channel scale
(:class:`~nemo_vfm.models.common.fp8_weights.FP8FrozenLinear`: ``<path>.base.weight`` is then uint8 and
``<path>.base.weight_scale`` sits beside it) and casts every other frozen parameter to bf16. The half-precision
modes compute under bf16/fp16 autocast.
"""

import fnmatch
import math
import zlib
from dataclasses import dataclass

import torch
from torch import nn

from nemo_vfm.models.common.lora_names import plain_param_name  # noqa: F401  (re-exported)

LORA_KEYS = (".lora_A.", ".lora_B.")
FROZEN_DTYPES = (None, "bf16", "fp16", "fp8")


@dataclass(kw_only=True)
class LoRAConfig:
    """LoRA knobs. ``targets``: module-path patterns of the linears to adapt (``fnmatch``, matched against
    the full path and against every dotted suffix, so ``"attn.q"`` matches ``blocks.3.attn.q``); ``None``
    = every linear the family's tensor-parallel plan names (its attention and MLP linears)."""

    rank: int = 16
    alpha: float = 16.0
    dropout: float = 0.0
    targets: tuple[str, ...] | None = None
    # "bf16": the frozen weights in bf16 (half the memory); "fp8": base weights as e4m3 + row scales (1 byte a
    # weight), the other frozen weights in bf16. Both need bf16 autocast.
    frozen_dtype: str | None = None

    def __post_init__(self):
        if self.frozen_dtype not in FROZEN_DTYPES:
            raise ValueError(f"LoRAConfig.frozen_dtype must be one of {FROZEN_DTYPES}, got {self.frozen_dtype!r}")
        if self.rank < 1:
            raise ValueError(f"LoRAConfig.rank must be >= 1, got {self.rank}")
        if self.alpha <= 0:
            raise ValueError(f"LoRAConfig.alpha must be > 0, got {self.alpha}")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"LoRAConfig.dropout must be in [0, 1), got {self.dropout}")
        if self.targets is not None:
            self.targets = tuple(self.targets)
            if not self.targets:
                raise ValueError("LoRAConfig.targets must name at least one module pattern (or be None)")

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


class LoRALinear(nn.Module):
    """``base(x) + scale * lora_B(lora_A(dropout(x)))`` around a (frozen) ``nn.Linear``."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float, dropout: float = 0.0):
        super().__init__()
        w = base.weight
        self.base = base
        self.lora_A = nn.Linear(base.in_features, rank, bias=False, device=w.device, dtype=w.dtype)
        self.lora_B = nn.Linear(rank, base.out_features, bias=False, device=w.device, dtype=w.dtype)
        self.dropout = nn.Dropout(dropout) if dropout else nn.Identity()
        self.rank, self.alpha, self.scale = rank, alpha, alpha / rank
        self.merged = False
        if w.device.type != "meta":
            self.reset_lora()

    @property
    def in_features(self) -> int:
        return self.base.in_features

    @property
    def out_features(self) -> int:
        return self.base.out_features

    @torch.no_grad()
    def reset_lora(self, generator: torch.Generator | None = None) -> None:
        """A: Kaiming-uniform (as nn.Linear); B: zeros, so the adapted layer starts equal to the base. Under
        tensor parallelism / FSDP2 (DTensor weights) A is drawn whole (it is small) and each rank keeps its shard."""
        from torch.distributed.tensor import DTensor

        from nemo_vfm.parallel.materialize import fill_local

        a, b = self.lora_A.weight, self.lora_B.weight
        full = torch.empty(a.shape, dtype=torch.float32)
        nn.init.kaiming_uniform_(full, a=math.sqrt(5), generator=generator)
        fill_local(a, lambda region: full if region is None else full[region])
        (b.to_local() if isinstance(b, DTensor) else b).zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        if self.merged:
            return y
        return y + self.lora_B(self.lora_A(self.dropout(x))) * self.scale

    def delta_weight(self) -> torch.Tensor:
        return (self.lora_B.weight.float() @ self.lora_A.weight.float()) * self.scale

    @torch.no_grad()
    def merge(self) -> None:
        """Fold the adapter into the base weight (inference: one matmul); :meth:`unmerge` undoes it."""
        if self.merged:
            return
        self._check_plain()
        self._check_not_fp8()
        self.base.weight.add_(self.delta_weight().to(self.base.weight.dtype))
        self.merged = True

    @torch.no_grad()
    def unmerge(self) -> None:
        if not self.merged:
            return
        self._check_plain()
        self._check_not_fp8()
        self.base.weight.sub_(self.delta_weight().to(self.base.weight.dtype))
        self.merged = False

    def _check_plain(self) -> None:
        from torch.distributed.tensor import DTensor

        if any(isinstance(p, DTensor) for p in self.parameters()):
            raise RuntimeError("merge/unmerge work on a plain (unparallelized) model; merge before parallelizing, "
                               "or merge the saved weights (merge_lora_state_dict).")

    def _check_not_fp8(self) -> None:
        from nemo_vfm.models.common.fp8_weights import FP8FrozenLinear

        if isinstance(self.base, FP8FrozenLinear):
            raise NotImplementedError("merge/unmerge in place would re-quantise an FP8 base (frozen_dtype='fp8'); use "
                                      "merge_lora(model), which puts a dequantised bf16 nn.Linear in its place")

    @staticmethod
    def tp_entries(path: str, style: str) -> dict[str, str]:
        """Read by ``nemo_vfm.parallel.tensor_parallel`` (see :func:`lora_tp_entries`)."""
        return lora_tp_entries(path, style)

    def extra_repr(self) -> str:
        return f"rank={self.rank}, alpha={self.alpha}, merged={self.merged}"


def default_targets(model: nn.Module) -> tuple[str, ...]:
    """The linears that the family's tensor-parallel plan names (block-relative paths), as patterns."""
    from nemo_vfm.models.families import family_spec

    plan = family_spec(model, "pass LoRAConfig.targets explicitly").tp_plan
    return tuple(path for path, style in plan.items() if style in ("colwise", "rowwise"))


def _matches(name: str, patterns) -> bool:
    parts = name.split(".")
    suffixes = [".".join(parts[i:]) for i in range(len(parts))]
    return any(fnmatch.fnmatchcase(s, p) for p in patterns for s in suffixes)


def apply_lora(model: nn.Module, cfg: LoRAConfig | None = None, *, targets=None, rank: int | None = None,
               alpha: float | None = None, dropout: float | None = None) -> list[str]:
    """Wrap the targeted linears of ``model`` in :class:`LoRALinear` (in place), freeze every other
    parameter, and return the adapted module paths. Keyword arguments override ``cfg``'s fields."""
    cfg = cfg or LoRAConfig()
    over = {k: v for k, v in dict(targets=targets, rank=rank, alpha=alpha, dropout=dropout).items() if v is not None}
    if over:
        cfg = LoRAConfig(**{**cfg.__dict__, **over})
    if any(isinstance(m, LoRALinear) for m in model.modules()):
        raise ValueError("this model already has LoRA adapters; apply_lora once (merge_lora() to fold them in).")
    patterns = cfg.targets if cfg.targets is not None else default_targets(model)
    chosen = [(name, m) for name, m in model.named_modules() if type(m) is nn.Linear and _matches(name, patterns)]
    if not chosen:
        raise ValueError(f"LoRAConfig.targets {list(patterns)} match no nn.Linear in {type(model).__name__}; "
                         f"name module paths such as 'attn.q' or 'blocks.*.mlp.fc1'.")
    model.requires_grad_(False)
    for name, lin in chosen:
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, attr, LoRALinear(lin, cfg.rank, cfg.alpha, cfg.dropout))
    if cfg.frozen_dtype is not None:
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.bfloat16}[cfg.frozen_dtype]
        keep = set()
        if cfg.frozen_dtype == "fp8":
            from nemo_vfm.models.common.fp8_weights import FP8FrozenLinear

            for m in lora_modules(model).values():
                m.base = FP8FrozenLinear.from_linear(m.base, bias_dtype=dtype)
                keep.add(id(m.base.weight_scale))  # fp32 (bf16-representable values)
        for p in model.parameters():
            if not p.requires_grad and p.is_floating_point() and id(p) not in keep:
                p.data = p.data.to(dtype)
    return [name for name, _ in chosen]


def lora_modules(model: nn.Module) -> dict[str, LoRALinear]:
    return {n: m for n, m in model.named_modules() if isinstance(m, LoRALinear)}


def init_lora_weights(model: nn.Module, seed: int = 0) -> None:
    """Initialise every adapter from ``seed`` and its module path (the same values in any parallel layout and
    in any order; e.g. after ``to_empty`` of a model that was built and adapted on the meta device)."""
    from nemo_vfm.parallel.grads import clean_name

    for name, m in lora_modules(model).items():
        g = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(clean_name(name).encode()))
        m.reset_lora(g)


@torch.no_grad()
def merge_lora(model: nn.Module) -> nn.Module:
    """Fold every adapter into its base weight and put the plain ``nn.Linear`` back (in place); an FP8 base
    (``frozen_dtype="fp8"``) becomes a bf16 ``nn.Linear`` holding the dequantised weight plus the adapter."""
    from nemo_vfm.models.common.fp8_weights import FP8FrozenLinear

    for name, m in lora_modules(model).items():
        if isinstance(m.base, FP8FrozenLinear):
            m._check_plain()
            b = m.base.bias
            plain = nn.Linear(m.in_features, m.out_features, bias=b is not None, device=b.device if b is not None
                              else m.base.weight.device, dtype=torch.bfloat16)
            plain.weight.copy_(m.base.dequantized_weight(torch.float32) + m.delta_weight())
            if b is not None:
                plain.bias.copy_(b)
            plain.requires_grad_(False)
            m.base, m.merged = plain, True
        else:
            m.merge()
        parent_name, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, attr, m.base)
    return model


def lora_state_dict(model_or_state) -> dict[str, torch.Tensor]:
    """Only the adapter weights (``...lora_A.weight`` / ``...lora_B.weight``) of a model or state dict."""
    state = model_or_state.state_dict() if isinstance(model_or_state, nn.Module) else model_or_state
    return {k: v for k, v in state.items() if any(s in k for s in LORA_KEYS)}


def has_lora(state: dict) -> bool:
    return any(any(s in k for s in LORA_KEYS) for k in state)


def merge_lora_state_dict(state: dict[str, torch.Tensor], scale: float) -> dict[str, torch.Tensor]:
    """A plain model's state dict from a LoRA one: ``p.base.weight + scale * B @ A`` -> ``p.weight``,
    ``p.base.bias`` -> ``p.bias``; adapter keys dropped. An FP8 base (``p.base.weight_scale`` beside it) is
    dequantised, and its merged weight is bf16."""
    from nemo_vfm.models.common.fp8_weights import dequantize

    out = {}
    for k, v in state.items():
        if any(s in k for s in LORA_KEYS) or k.endswith(".base.weight_scale"):
            continue
        if k.endswith(".base.weight"):
            p = k[: -len(".base.weight")]
            a, b = state[p + ".lora_A.weight"], state[p + ".lora_B.weight"]
            dtype = v.dtype
            if p + ".base.weight_scale" in state:
                v, dtype = dequantize(v, state[p + ".base.weight_scale"]), torch.bfloat16
            v = (v.float() + scale * (b.float() @ a.float())).to(dtype)
            out[p + ".weight"] = v
        elif k.endswith(".base.bias"):
            out[k[: -len(".base.bias")] + ".bias"] = v
        else:
            out[k] = v
    return out


# -- tensor parallelism: a plan entry that lands on a LoRALinear -------------------------------------
def lora_tp_entries(path: str, style: str) -> dict[str, str]:
    """The plan entries for a LoRALinear at ``path`` whose base layer has ``style``.

    colwise base (input replicated over TP, output features split): ``lora_A`` column-split with its
    ``rank`` outputs gathered (``colwise_replicate``), ``lora_B`` column-split like the base.
    rowwise base (input features split): ``lora_A`` row-split with its partial ``rank`` outputs summed
    (``rowwise_replicate``), ``lora_B`` column-split and gathered into the base's output layout
    (``colwise_out``: replicated, or split over tokens under sequence parallel). Every adapter weight is a
    DTensor, so DTensor's autograd reduces their gradients and the input gradient over TP.
    """
    if style == "colwise":
        return {f"{path}.base": "colwise", f"{path}.lora_A": "colwise_replicate", f"{path}.lora_B": "colwise"}
    if style == "rowwise":
        return {f"{path}.base": "rowwise", f"{path}.lora_A": "rowwise_replicate", f"{path}.lora_B": "colwise_out"}
    raise ValueError(f"no LoRA tensor-parallel expansion for style {style!r} at {path}")
