"""Frozen linear weights stored in FP8 (e4m3) with one fp32 scale per output channel, for LoRA bases
(``LoRAConfig.frozen_dtype="fp8"``).

    W_OI ~= e4m3(W_OI / s_O1) * s_O1,   s_O = amax_I |W_OI| / 448 (rounded up to a bf16 value)

Legend: ``O`` output features, ``I`` input features. :class:`FP8FrozenLinear` holds

- ``weight``: ``[O, I]`` **uint8**, the bit patterns of the e4m3 (``torch.float8_e4m3fn``) values: 1 byte a
  weight. uint8 and not a float8 dtype because gloo collectives and DTensor's scatter reject float8 tensors
  (measured, torch 2.13: "Invalid scalar type"), and FSDP2 casts every floating parameter to its ``param_dtype``
  before the all-gather (2 bytes a weight) while it gathers an integer one as it is (1 byte);
- ``weight_scale``: ``[O, 1]`` fp32, rounded up to a bf16-representable value so that FSDP2's bf16 all-gather of
  it is exact; sharded with the weight's rows (FSDP2, column-parallel) or replicated (row-parallel);
- ``bias``: as the original layer's (the caller picks its dtype).

The forward dequantises the weight to the compute dtype (the autocast dtype under autocast, else the input's)
and runs ``F.linear``: the matmul is a bf16 (or fp32) one; FP8 saves memory, not time. Frozen: no gradient
reaches these parameters (the input gradient flows through the dequantised weight).

State-dict keys: ``weight`` (uint8) and ``weight_scale`` beside ``bias``: a LoRA base stays ``<path>.base.weight``
with ``<path>.base.weight_scale`` next to it. :func:`dequantize` turns a saved pair back into a float weight
(``nemo_vfm.models.common.lora.merge_lora_state_dict`` does, for merged exports). Loading a float ``weight``
without a scale into the module (``load_state_dict``, e.g. a bf16 run's checkpoint) quantises it.

Loaders that fill a built (possibly parallelised) network from float weights quantise on the way in:
:func:`fill_quantized` from a reader of regions (a family's streamed ``model.pretrained``:
``nemo_vfm.models.common.published_weights``), :func:`fill_quantized_from`
from a tensor (``init_from`` a plain checkpoint; :func:`quantized_bases` finds the bases under the plain names).
"""

import torch
import torch.nn.functional as F
from torch import nn

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max


def _round_up_to_bf16(x: torch.Tensor) -> torch.Tensor:
    """The smallest bf16-representable fp32 value >= ``x`` (positive finite fp32)."""
    bits = x.contiguous().view(torch.int32)
    return ((bits + 0xFFFF) & -0x10000).view(torch.float32)


@torch.no_grad()
def quantize_rowwise(w_OI: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``w_OI`` (any float dtype) -> (e4m3 bits ``[O, I]`` uint8, scale ``[O, 1]`` fp32); an all-zero row gets
    scale 1."""
    if w_OI.dim() != 2 or not w_OI.is_floating_point():
        raise ValueError(f"quantize_rowwise takes a 2-D float weight [out, in], got {w_OI.dim()}-D {w_OI.dtype}")
    w = w_OI.float()
    amax = w.abs().amax(dim=1, keepdim=True)
    scale = _round_up_to_bf16(torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax)))
    q = (w / scale).clamp_(-E4M3_MAX, E4M3_MAX).to(E4M3)
    return q.view(torch.uint8), scale


def dequantize(bits_OI: torch.Tensor, scale_O1: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """e4m3 bits ``[O, I]`` (uint8, or float8_e4m3fn) and their scale ``[O, 1]`` -> the weight in ``dtype``."""
    if bits_OI.dtype == torch.uint8:
        bits_OI = bits_OI.view(E4M3)
    if bits_OI.dtype != E4M3:
        raise ValueError(f"dequantize takes e4m3 bits (uint8 or float8_e4m3fn), got {bits_OI.dtype}")
    return bits_OI.to(dtype) * scale_O1.to(dtype)


class FP8FrozenLinear(nn.Linear):
    """A frozen ``nn.Linear`` whose weight is stored as e4m3 with row-wise scales (module docstring). A subclass
    of ``nn.Linear`` so that the tensor-parallel styles (column/row-wise) shard it like the layer it replaces."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None,
                 bias_dtype: torch.dtype | None = None):
        nn.Module.__init__(self)
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.zeros(out_features, in_features, dtype=torch.uint8, device=device),
                                   requires_grad=False)
        self.weight_scale = nn.Parameter(torch.ones(out_features, 1, dtype=torch.float32, device=device),
                                         requires_grad=False)
        if bias:
            self.bias = nn.Parameter(torch.zeros(out_features, dtype=bias_dtype, device=device), requires_grad=False)
        else:
            self.register_parameter("bias", None)

    @classmethod
    @torch.no_grad()
    def from_linear(cls, linear: nn.Linear, bias_dtype: torch.dtype | None = None) -> "FP8FrozenLinear":
        """The quantised copy of ``linear`` (plain or on the meta device; its bias cast to ``bias_dtype``)."""
        w = linear.weight
        b = linear.bias
        out = cls(linear.in_features, linear.out_features, bias=b is not None, device=w.device,
                  bias_dtype=bias_dtype or (b.dtype if b is not None else None))
        if w.device.type != "meta":
            out.set_weight(w)
            if b is not None:
                out.bias.copy_(b)
        return out

    @torch.no_grad()
    def set_weight(self, w_OI: torch.Tensor) -> None:
        """Quantise the float weight ``w_OI`` ``[O, I]`` into this (unparallelised) module."""
        if tuple(w_OI.shape) != (self.out_features, self.in_features):
            raise ValueError(f"weight of shape {tuple(w_OI.shape)} for an FP8FrozenLinear of "
                             f"[{self.out_features}, {self.in_features}]")
        bits, scale = quantize_rowwise(w_OI)
        self.weight.copy_(bits)
        self.weight_scale.copy_(scale)

    def compute_dtype(self, x: torch.Tensor) -> torch.dtype:
        dev = x.device.type
        return torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else x.dtype

    def dequantized_weight(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The weight in ``dtype``: a plain tensor, or a DTensor laid out as ``weight`` (tensor parallel), computed
        from the local pieces (the scale's local rows are the weight's: both ``Shard(0)``, or the scale replicated)."""
        from torch.distributed.tensor import DTensor

        w, s = self.weight, self.weight_scale
        if not isinstance(w, DTensor):
            return dequantize(w, s.full_tensor() if isinstance(s, DTensor) else s, dtype)
        local = dequantize(w.to_local(), s.to_local() if isinstance(s, DTensor) else s, dtype)
        return DTensor.from_local(local, w.device_mesh, w.placements, run_check=False, shape=w.shape,
                                  stride=w.stride())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = self.compute_dtype(x)
        b = self.bias.to(dtype) if self.bias is not None else None
        return F.linear(x, self.dequantized_weight(dtype), b)

    def reset_parameters(self) -> None:
        raise NotImplementedError("an FP8FrozenLinear holds frozen quantised weights; set them with set_weight(w) "
                                  "(or load a state dict), not by initialisation")

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        w = state_dict.get(prefix + "weight")
        if torch.is_tensor(w) and w.is_floating_point() and prefix + "weight_scale" not in state_dict:
            from torch.distributed.tensor import DTensor

            bits, scale = quantize_rowwise(w.full_tensor() if isinstance(w, DTensor) else w)
            state_dict[prefix + "weight"], state_dict[prefix + "weight_scale"] = bits, scale
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, e4m3"


@torch.no_grad()
def fill_quantized(module: FP8FrozenLinear, read) -> int:
    """Quantise a float weight into ``module`` (plain or parallelised), reading only what this rank needs:
    ``read(region)`` returns the full ``[O, I]`` weight's ``region`` (slices per dim; the whole weight for
    None), as for ``nemo_vfm.parallel.materialize.fill_local``. A rank reads whole rows (a row's scale needs all of
    it): its own rows under FSDP2 / column-wise TP, every row under row-wise TP, everything where the placements are
    not plain shards. Returns the number of elements read. For loaders that stream weights into a network built on
    the meta device (a plain copy into ``weight`` would store the values' raw casts to integers)."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    from nemo_vfm.parallel.materialize import local_region

    w, s = module.weight, module.weight_scale
    lw = w.to_local() if isinstance(w, DTensor) else w
    ls = s.to_local() if isinstance(s, DTensor) else s
    region, s_region = local_region(w), local_region(s)
    if region is None or s_region is None or s_region[0] != region[0]:
        full = read(None)
        bits, scale = quantize_rowwise(full)
        for dst, src, like in ((lw, bits, w), (ls, scale, s)):
            dst.copy_(distribute_tensor(src, like.device_mesh, like.placements, src_data_rank=None).to_local()
                      if isinstance(like, DTensor) else src)
        return full.numel()
    if lw.numel() == 0:
        return 0
    piece = read((region[0], slice(0, module.in_features)))
    bits, scale = quantize_rowwise(piece)
    lw.copy_(bits[:, region[1]])
    ls.copy_(scale)
    return piece.numel()


@torch.no_grad()
def fill_quantized_from(module: FP8FrozenLinear, w_OI: torch.Tensor) -> None:
    """Quantise the float weight ``w_OI`` into ``module`` (plain or parallelised): ``w_OI`` is the full ``[O, I]``
    tensor, or a DTensor laid out as ``module.weight`` (e.g. what a distributed checkpoint loaded into a float
    stand-in for it). Every rank calls it: a DTensor whose rows are split across ranks (row-wise TP) is gathered."""
    from torch.distributed.tensor import DTensor, Shard

    from nemo_vfm.parallel.materialize import local_region

    if tuple(w_OI.shape) != (module.out_features, module.in_features) or not w_OI.is_floating_point():
        raise ValueError(f"a float weight of shape [{module.out_features}, {module.in_features}] quantises into this "
                         f"FP8FrozenLinear, got {tuple(w_OI.shape)} {w_OI.dtype}; is it the same model config?")
    if isinstance(w_OI, DTensor):
        rows = local_region(w_OI)
        if rows is None or any(isinstance(p, Shard) and p.dim != 0 for p in w_OI.placements):
            w_OI = w_OI.full_tensor()  # this rank's rows are not whole here: one weight at a time
        else:  # whole rows on this rank (FSDP2, column-wise TP): the rows asked for are local
            local, first, full = w_OI.to_local(), rows[0].start, w_OI.full_tensor
            fill_quantized(module, lambda region: full() if region is None else
                           local[region[0].start - first:region[0].stop - first][:, region[1]])
            return
    fill_quantized(module, lambda region: w_OI if region is None else w_OI[region])


def quantized_bases(model: nn.Module, keys) -> dict[str, FP8FrozenLinear]:
    """``{key: FP8FrozenLinear}`` for ``model``'s FP8 LoRA bases, keyed by the entry of ``keys`` (a LoRA network's
    state-dict keys under the plain network's names) that holds the base's weight (``p.weight`` for ``p.base``):
    for loaders that fill a LoRA network from plain weights. Raises if a base's weight is not among ``keys``."""
    from nemo_vfm.parallel.grads import clean_name

    bases = {clean_name(n).removesuffix(".base") + ".weight": m for n, m in model.named_modules()
             if isinstance(m, FP8FrozenLinear)}
    out = {k: bases[clean_name(k)] for k in keys if clean_name(k) in bases}
    if len(out) != len(bases):
        lost = sorted(set(bases) - {clean_name(k) for k in out})
        raise ValueError(f"the FP8 base weights {lost[:3]} are not among the keys to load; pass the LoRA network's "
                         "state-dict keys under the plain network's names (p.base.weight as p.weight)")
    return out


def frozen_weight_bytes(model: nn.Module) -> int:
    """Bytes of the frozen parameters and the buffers of ``model`` (local pieces of DTensors)."""
    from torch.distributed.tensor import DTensor

    def nbytes(t):
        t = t.to_local() if isinstance(t, DTensor) else t
        return t.numel() * t.element_size()

    return (sum(nbytes(p) for p in model.parameters() if not p.requires_grad)
            + sum(nbytes(b) for b in model.buffers()))
