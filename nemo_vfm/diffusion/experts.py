"""Two denoising experts split at a time boundary (Wan 2.2 A14B: high noise for ``t >= boundary``, low below).

- Training one expert: :class:`ExpertFlowMatching` draws times only from that expert's range (the flow-matching
  time distribution restricted to ``[boundary, 1]`` or ``[0, boundary)``, by inverse CDF: no rejection loop).
- Sampling: :func:`switch_experts` calls the high-noise predictor while ``t >= boundary`` and the low-noise one
  after, as diffusers' ``WanPipeline`` compares ``t >= boundary_ratio * num_train_timesteps``.

The boundary is a fraction of the time axis (``boundary_ratio``; 0.875 for Wan2.2-T2V-A14B, 0.9 for I2V).
"""

from dataclasses import dataclass

import torch

from nemo_vfm.diffusion.flow_matching import FlowMatching

EXPERTS = ("high", "low")


def uses_high(t: torch.Tensor, boundary: float, num_train_timesteps: int = 1000) -> bool:
    """Whether time ``t`` (a scalar or the same value per sample) belongs to the high-noise expert: ``1000 t >=
    1000 boundary``, with a 1e-3 tolerance for float32 times on the integer training grid."""
    return float(t.reshape(-1)[0]) * num_train_timesteps >= boundary * num_train_timesteps - 1e-3


def switch_experts(high, low, boundary: float):
    """``g(x, t)``: ``high(x, t)`` for ``t >= boundary``, else ``low(x, t)`` (each its own guided predictor)."""
    return lambda x, t: (high if uses_high(t, boundary) else low)(x, t)


@dataclass(kw_only=True)
class ExpertFlowMatching(FlowMatching):
    """Flow matching for one expert of a two-expert model: ``expert="high"`` trains on times in ``[boundary, 1]``,
    ``"low"`` on ``[0, boundary)``, each with the (shifted) time distribution of :class:`FlowMatching` restricted
    to that range. Sampling (``velocity``) is :class:`FlowMatching`'s."""

    expert: str = "high"
    boundary: float = 0.875

    def __post_init__(self):
        super().__post_init__()
        if self.expert not in EXPERTS:
            raise ValueError(f"ExpertFlowMatching.expert must be 'high' or 'low', got {self.expert!r}")
        if not 0.0 < self.boundary < 1.0:
            raise ValueError(f"ExpertFlowMatching.boundary must be in (0, 1), got {self.boundary}")

    def _unshift(self, t: float) -> float:
        """The unshifted time whose shift is ``t`` (``shift_time`` is increasing)."""
        return t / (self.shift - (self.shift - 1) * t)

    def sample_time(self, batch: int, generator=None, device=None) -> torch.Tensor:
        u_b = self._unshift(self.boundary)  # the range in unshifted time
        lo, hi = (u_b, 1.0) if self.expert == "high" else (0.0, u_b)
        r = torch.rand(batch, generator=generator, device=device)
        if self.time_sampling == "uniform":
            u = lo + (hi - lo) * r
        else:  # logit-normal: a truncated normal in logit space, by inverse CDF
            normal = torch.distributions.Normal(self.logit_mean, self.logit_std)
            edges = torch.tensor([lo, hi], dtype=torch.float64).clamp(1e-12, 1 - 1e-12)
            c_lo, c_hi = normal.cdf(torch.logit(edges).float()).tolist()
            z = normal.icdf((c_lo + (c_hi - c_lo) * r).clamp(1e-7, 1 - 1e-7))
            u = torch.sigmoid(z).clamp(lo, hi)
        t = self.shift_time(u)
        if self.expert == "high":  # float rounding must not cross the boundary
            return t.clamp(self.boundary, 1.0)
        below = torch.nextafter(torch.tensor(self.boundary, dtype=t.dtype), torch.tensor(0.0, dtype=t.dtype))
        return t.clamp(0.0, float(below))
