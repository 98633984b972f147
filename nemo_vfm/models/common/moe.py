"""Mixture-of-experts feed-forward layer: a router, SwiGLU experts run as one grouped GEMM, optional
shared experts. Single-device code; expert parallelism (experts split over ranks, tokens sent to them
by all-to-all) is applied from outside (``nemo_vfm.parallel.expert_parallel``) by setting ``.dispatcher``.

Routing (``MoEConfig.routing``):

- ``"expert_choice"`` (EC-DiT): every expert takes its ``k = capacity_factor * S / E`` highest-scoring
  tokens of each sequence (a sample, or a whole packed row), so the load is balanced by construction and
  no token is dropped by imbalance (a token may be chosen by no expert: its MoE output is zero and it keeps
  its residual). Scores: softmax over experts (or sigmoid), the chosen token's output weighted by its score.
- ``"top_k"`` (token choice): every token goes to its ``top_k`` experts (weights renormalised over them,
  no capacity limit, no drops), with the Switch-Transformer load-balancing loss per sequence
  ``E * sum_e f_e * P_e`` (f: fraction of assignments to e, P: mean router probability of e), averaged over
  sequences and scaled by ``aux_loss_coef``. The layer stores it in ``.aux_loss``; the training module adds
  the sum over layers to the objective's loss (:func:`collect_aux_loss`), so the network still only predicts.

Each forward also leaves detached router statistics in ``.stats`` (tokens per expert, tokens routed to no
expert), read at log steps only (:func:`router_stats`): no host synchronisation per step.

Under context / sequence parallelism a sequence's tokens are spread over ranks: the plan sets
``.seq_groups`` (the process groups that split a sequence) and ``.valid_fn`` (which local tokens are
padding); expert choice then takes every expert's k-th best score over the whole sequence, and the
load-balancing statistics are summed over those groups, so the result equals one process.

Legend: B batch, S tokens per sequence (local), D hidden, E experts, F expert FFN width, A assignments.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

ROUTINGS = ("expert_choice", "top_k")
SCORES = ("softmax", "sigmoid")
GEMMS = ("auto", "grouped", "loop")


@dataclass(kw_only=True)
class MoEConfig:
    """Which blocks' feed-forward layers are mixtures of experts, and how they route."""

    num_experts: int = 8
    expert_ffn_size: int = 1024  # inner width of each SwiGLU expert
    routing: str = "expert_choice"  # "expert_choice" | "top_k"
    capacity_factor: float = 2.0  # expert choice: on average each token is taken by this many experts
    top_k: int = 2  # token choice: experts per token
    aux_loss_coef: float = 1e-2  # token choice: weight of the load-balancing loss (0 = none)
    score: str = "softmax"  # router score over experts: "softmax" | "sigmoid"
    num_shared_experts: int = 0  # dense SwiGLU of num_shared_experts * expert_ffn_size run on every token
    every: int = 1  # every Nth block (blocks N-1, 2N-1, ...) is MoE; 1 = all
    gemm: str = "auto"  # "auto" (grouped GEMM on CUDA, loop elsewhere) | "grouped" | "loop"

    def __post_init__(self):
        if self.routing not in ROUTINGS:
            raise ValueError(f"MoEConfig.routing must be one of {ROUTINGS}, got {self.routing!r}")
        if self.score not in SCORES:
            raise ValueError(f"MoEConfig.score must be one of {SCORES}, got {self.score!r}")
        if self.gemm not in GEMMS:
            raise ValueError(f"MoEConfig.gemm must be one of {GEMMS}, got {self.gemm!r}")
        if min(self.num_experts, self.expert_ffn_size, self.every) < 1 or self.num_shared_experts < 0:
            raise ValueError("MoEConfig.num_experts, expert_ffn_size and every must be >= 1, num_shared_experts >= 0")
        if not 1 <= self.top_k <= self.num_experts:
            raise ValueError(f"MoEConfig.top_k must be in [1, num_experts={self.num_experts}], got {self.top_k}")
        if self.capacity_factor <= 0 or self.aux_loss_coef < 0:
            raise ValueError("MoEConfig.capacity_factor must be > 0 and aux_loss_coef >= 0")

    def is_moe_layer(self, index: int) -> bool:
        return index % self.every == self.every - 1

    def active_ffn_size(self) -> float:
        """FFN width a token sees on average (routed experts + shared), to compare with a dense model."""
        per_token = self.capacity_factor if self.routing == "expert_choice" else self.top_k
        return (per_token + self.num_shared_experts) * self.expert_ffn_size


def _local(t: torch.Tensor) -> torch.Tensor:
    """The local shard of a DTensor parameter (experts under expert parallelism), the tensor otherwise. An
    ``isinstance`` test, not ``hasattr``: under ``torch.compile`` the latter is False for a DTensor."""
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def grouped_gemm_available(x: torch.Tensor) -> bool:
    """``torch._grouped_mm`` on this tensor's device: CUDA with bf16 (Hopper kernels), or the CPU fallback."""
    if not hasattr(torch, "_grouped_mm"):
        return False
    if x.is_cuda:
        return x.dtype == torch.bfloat16 and torch.cuda.get_device_capability(x.device)[0] >= 9
    return x.device.type == "cpu"


class GroupedExperts(nn.Module):
    """``E`` SwiGLU experts stored as ``w1, w3 (E, D, F)`` and ``w2 (E, F, D)``; under expert parallelism
    they are DTensors sharded on dim 0 (each rank computes with its ``E / ep`` local experts)."""

    def __init__(self, num_experts: int, hidden_size: int, ffn_size: int, gemm: str = "auto"):
        super().__init__()
        self.num_experts, self.gemm = num_experts, gemm
        self.w1 = nn.Parameter(torch.empty(num_experts, hidden_size, ffn_size))
        self.w3 = nn.Parameter(torch.empty(num_experts, hidden_size, ffn_size))
        self.w2 = nn.Parameter(torch.empty(num_experts, ffn_size, hidden_size))

    def forward(self, x_AD: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """``x_AD``: tokens sorted by (local) expert; ``counts (E_local,)``: how many rows each expert takes.
        Under autocast the GEMMs run in the autocast dtype (``torch._grouped_mm`` is not an autocast op)."""
        dtype = x_AD.dtype
        if torch.is_autocast_enabled(x_AD.device.type):
            dtype = torch.get_autocast_dtype(x_AD.device.type)
        x_AD = x_AD.to(dtype)
        w1, w3, w2 = (_local(w).to(dtype) for w in (self.w1, self.w3, self.w2))
        use_grouped = self.gemm == "grouped" or (self.gemm == "auto" and x_AD.is_cuda and grouped_gemm_available(x_AD))
        if use_grouped:
            offs = torch.cumsum(counts, 0, dtype=torch.int32)
            h = F.silu(torch._grouped_mm(x_AD, w1, offs=offs)) * torch._grouped_mm(x_AD, w3, offs=offs)
            return torch._grouped_mm(h, w2, offs=offs)
        with torch.autocast(x_AD.device.type, enabled=False):  # the same dtype as the grouped path
            return self.forward_loop(x_AD, counts, w1, w3, w2)

    @staticmethod
    def forward_loop(x_AD, counts, w1, w3, w2) -> torch.Tensor:
        """The reference: one matmul chain per expert (a host sync for the split sizes)."""
        outs = []
        for e, x in enumerate(torch.split(x_AD, counts.tolist())):
            outs.append((F.silu(x @ w1[e]) * (x @ w3[e])) @ w2[e])
        return torch.cat(outs) if outs else x_AD.new_zeros(0, w2.shape[-1])

    def init_weights(self, std: float = 0.02):
        for w in (self.w1, self.w3, self.w2):
            nn.init.trunc_normal_(w, std=std)


class LocalDispatcher:
    """All experts on this rank: compute the sorted tokens directly."""

    def __call__(self, experts: GroupedExperts, x_AD: torch.Tensor, counts_E: torch.Tensor) -> torch.Tensor:
        return experts(x_AD, counts_E)


class MoE(nn.Module):
    """``forward(x (B, S, D)) -> (B, S, D)``; see the module docstring for routing, losses and statistics."""

    def __init__(self, cfg: MoEConfig, hidden_size: int):
        super().__init__()
        from nemo_vfm.models.common.mlp import SwiGLU

        self.cfg = cfg
        self.router = nn.Linear(hidden_size, cfg.num_experts, bias=False)
        self.experts = GroupedExperts(cfg.num_experts, hidden_size, cfg.expert_ffn_size, cfg.gemm)
        self.shared = SwiGLU(hidden_size, cfg.num_shared_experts * cfg.expert_ffn_size) if cfg.num_shared_experts else None
        self.dispatcher = LocalDispatcher()  # replaced under expert parallelism
        self.seq_groups: tuple = ()  # process groups that split one sequence (CP, SP); set by the plan
        self.valid_fn = None  # (S_local, device) -> bool (S_local,) of real (not padding) tokens; set by the plan
        self.aux_grad_scale = 1.0  # CP size under context parallelism (set by the plan)
        self.aux_loss: torch.Tensor | None = None
        self.stats: dict[str, torch.Tensor] = {}

    # -- routing ----------------------------------------------------------------------------------
    def _scores(self, x_BSD: torch.Tensor) -> torch.Tensor:
        logits = self.router(x_BSD).float()
        return logits.softmax(-1) if self.cfg.score == "softmax" else logits.sigmoid()

    def _valid(self, S: int, device) -> torch.Tensor | None:
        return self.valid_fn(S, device) if self.valid_fn is not None else None

    def _seq_sum(self, t: torch.Tensor) -> torch.Tensor:
        """Sum of a per-sequence statistic over the ranks that share the sequence (no autograd)."""
        import torch.distributed as dist

        t = t.detach().clone()
        for g in self.seq_groups:
            dist.all_reduce(t, group=g)
        return t

    def _expert_choice(self, scores_BSE: torch.Tensor, valid: torch.Tensor | None):
        """Assignments ``(token index into B*S, expert, weight)`` sorted by expert, and counts per expert."""
        import torch.distributed as dist

        B, S, E = scores_BSE.shape
        if valid is None:  # every rank of the sequence holds S real tokens
            n = S * math.prod(dist.get_world_size(g) for g in self.seq_groups)
        else:
            n = int(self._seq_sum(valid.sum()))
        k = max(1, min(n, int(self.cfg.capacity_factor * n / E)))
        if not self.seq_groups and valid is None:  # static shapes: every expert takes k tokens of each sequence
            w, idx = scores_BSE.topk(k, dim=1)  # (B, k, E)
            tok = (idx + torch.arange(B, device=idx.device)[:, None, None] * S).permute(2, 0, 1).reshape(-1)
            counts = torch.full((E,), B * k, device=idx.device, dtype=torch.long)
            return tok, w.permute(2, 0, 1).reshape(-1), counts
        # the sequence is split (CP/SP) or padded: every expert's k-th best score over the whole sequence
        masked = scores_BSE.detach() if valid is None else scores_BSE.detach().masked_fill(~valid[None, :, None], -1.0)
        full = masked
        for g in self.seq_groups:
            parts = [torch.empty_like(full) for _ in range(dist.get_world_size(g))]
            dist.all_gather(parts, full.contiguous(), group=g)
            full = torch.cat(parts, 1)
        thr = full.topk(k, dim=1).values[:, -1:, :]  # (B, 1, E)
        sel = masked >= thr
        if valid is not None:
            sel &= valid[None, :, None]
        e, b, s = sel.permute(2, 0, 1).nonzero(as_tuple=True)  # sorted by expert
        return b * S + s, scores_BSE[b, s, e], torch.bincount(e, minlength=E)

    def _top_k(self, scores_BSE: torch.Tensor, valid: torch.Tensor | None):
        B, S, E = scores_BSE.shape
        k = self.cfg.top_k
        w, idx = scores_BSE.topk(k, dim=-1)  # (B, S, k)
        if k > 1:
            w = w / w.sum(-1, keepdim=True)
        keep = torch.ones(B, S, k, dtype=torch.bool, device=w.device) if valid is None else \
            valid[None, :, None].expand(B, S, k)
        if self.training and self.cfg.aux_loss_coef > 0:
            vm = keep[..., 0].to(scores_BSE.dtype)  # (B, S)
            f = torch.zeros(B, E, device=w.device).scatter_add_(1, idx.flatten(1), keep.flatten(1).float())
            n = self._seq_sum(vm.sum(1))[:, None].clamp_min(1)  # (B, 1) real tokens per sequence
            f = self._seq_sum(f) / (n * k)  # fraction of each sequence's assignments per expert (not differentiable)
            local = E * (f * (scores_BSE * vm[..., None]).sum(1) / n).sum(1)  # this rank's tokens' share (B,)
            # value: the whole sequence's loss; gradient: this rank's tokens' share, times aux_grad_scale (CP ranks'
            # gradients are averaged like every dense gradient, see the token gather's grad_scale)
            s_ = self.aux_grad_scale
            per_seq = s_ * local + (self._seq_sum(local) - s_ * local).detach() if self.seq_groups else local
            self.aux_loss = self.cfg.aux_loss_coef * per_seq.mean()
        flat_e = idx.reshape(-1)
        order = torch.argsort(flat_e, stable=True)
        tok = torch.arange(B * S, device=w.device).repeat_interleave(k)[order]
        kept = keep.reshape(-1)[order]
        w_sorted = w.reshape(-1)[order] * kept.to(w.dtype)
        counts = torch.bincount(flat_e, minlength=E)  # rows per expert (padding tokens included, with weight 0)
        return tok, w_sorted, counts

    def forward(self, x_BSD: torch.Tensor) -> torch.Tensor:
        B, S, D = x_BSD.shape
        scores = self._scores(x_BSD)
        valid = self._valid(S, x_BSD.device)
        self.aux_loss = None
        if self.cfg.routing == "expert_choice":
            tok, w, counts = self._expert_choice(scores, valid)
        else:
            tok, w, counts = self._top_k(scores, valid)
        x_flat = x_BSD.reshape(B * S, D)
        out_AD = self.dispatcher(self.experts, x_flat[tok], counts)
        y = x_flat.new_zeros(x_flat.shape, dtype=out_AD.dtype).index_add_(0, tok, out_AD * w[:, None].to(out_AD.dtype))
        with torch.no_grad():
            routed = torch.zeros(B * S, device=x_BSD.device).index_add_(0, tok, (w != 0).float())
            none = (routed == 0) if valid is None else (routed == 0) & valid.repeat(B)
            tokens = torch.full((), float(B * S), device=x_BSD.device) if valid is None else valid.sum().float() * B
            self.stats = {"tokens_per_expert": counts.detach(), "unrouted": none.sum(), "tokens": tokens}
        y = y.view(B, S, D)
        if self.shared is not None:
            y = y + self.shared(x_BSD)
        return y

    def init_weights(self):
        nn.init.normal_(self.router.weight, std=0.02)
        self.experts.init_weights()
        if self.shared is not None:
            self.shared.init_weights()


def moe_layers(model: nn.Module) -> list[MoE]:
    return [m for m in model.modules() if isinstance(m, MoE)]


def collect_aux_loss(model: nn.Module) -> torch.Tensor | None:
    """Sum of the load-balancing losses the MoE layers left from the last forward (None if there are none)."""
    losses = [m.aux_loss for m in moe_layers(model) if m.aux_loss is not None]
    return torch.stack(losses).sum() if losses else None


@torch.no_grad()
def router_stats(model: nn.Module) -> dict[str, torch.Tensor]:
    """Router statistics of the last forward, as device tensors (no sync): ``moe/max_load`` (busiest expert's
    tokens over the mean, averaged over layers; 1 = balanced), ``moe/min_load``, ``moe/unrouted`` (fraction
    of tokens no expert took), and ``moe/tokens_per_expert`` (the mean over layers, (E,))."""
    layers = [m for m in moe_layers(model) if m.stats]
    if not layers:
        return {}
    counts = torch.stack([m.stats["tokens_per_expert"].float() for m in layers])  # (layers, E)
    mean = counts.mean(1).clamp_min(1e-9)
    tokens = torch.stack([m.stats["tokens"] for m in layers]).clamp_min(1)
    unrouted = torch.stack([m.stats["unrouted"].float() for m in layers]) / tokens
    return {"moe/max_load": (counts.max(1).values / mean).mean(), "moe/min_load": (counts.min(1).values / mean).mean(),
            "moe/unrouted": unrouted.mean(), "moe/tokens_per_expert": counts.mean(0)}
