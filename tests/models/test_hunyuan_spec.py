"""HunyuanVideo's declared family: the analytic FLOPs equal what FlopCounterMode measures on a real forward
(T2V; I2V with glyph and image tokens), the plan names modules and arguments the block has, knobs are keywords, and
the layouts without a plan raise naming them."""

import inspect

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from nemo_vfm.models.families import family_spec
from nemo_vfm.models.hunyuan.flavors import hunyuan_config
from nemo_vfm.parallel.config import PARALLELIZE_KNOBS
from nemo_vfm.parallel.dims import ParallelDims
from nemo_vfm.parallel.tensor_parallel import check_tp_plan

B = 2


def measured(net, *args, **kwargs) -> tuple[int, int]:
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as fc:
        net(*args, **kwargs)
    counts = {str(op): n for op, n in fc.get_flop_counts()["Global"].items()}
    attention = counts.pop("aten.bmm", 0) + counts.pop("aten.baddbmm", 0)
    return sum(counts.values()), attention


@pytest.mark.parametrize("i2v", [False, True], ids=["t2v", "i2v-glyph-meanflow-mlp3"])
def test_flops_equal_the_measured_forward(i2v):
    """The I2V case also has ``mlp_ratio=3``: the blocks' MLPs 3 D wide, the token refiner's 4 D."""
    cfg = hunyuan_config("tiny", patch_size=(1, 2, 2), use_meanflow=i2v, **({"mlp_ratio": 3.0} if i2v else {}))
    net = cfg.build().eval()
    x, t = torch.randn(B, cfg.out_channels, 3, 8, 4), torch.rand(B)
    ctx, mask = torch.randn(B, 5, cfg.text_dim), torch.ones(B, 5, dtype=torch.bool)
    mask[0, 3:] = False  # masked keys cost the same
    kw, extra = {}, {}
    if i2v:
        kw = dict(image_embeds=torch.randn(B, 6, cfg.image_dim), glyph_context=torch.randn(B, 4, cfg.glyph_dim),
                  cond_latents=torch.randn(B, cfg.cond_channels, 3, 8, 4), timesteps_r=t * 0.5)
        extra = dict(glyph_tokens=4, image_tokens=6)
    got = family_spec(cfg).flops(cfg, [24] * B, [5] * B, [(3, 4, 2)] * B, **extra)
    assert (got.linear, got.attention) == measured(net, x, t, ctx, mask, **kw)
    assert got.attention > 0 and got.linear > 0


def test_the_plan_names_what_the_block_has():
    cfg = hunyuan_config("tiny")
    spec = family_spec(cfg)
    assert spec.name == "hunyuanvideo"
    block = cfg.build("meta").blocks[0]
    check_tp_plan([block], spec.tp_plan, optional=spec.tp_optional)
    assert set(spec.token_split.names()) <= inspect.signature(block.forward).parameters.keys()
    assert spec.knobs <= set(PARALLELIZE_KNOBS)
    with pytest.raises(ValueError, match=r"does not read float8='rowwise'"):
        spec.select_knobs({"float8": "rowwise"}, {"float8": None})


@pytest.mark.parametrize("kw,match", [
    (dict(cp=2), "context parallelism"), (dict(tp=2, sequence_parallel=True), "sequence parallelism"),
    (dict(pp=2), "pipeline-parallel"), (dict(tp=4), "num_heads=2 is not divisible"),
])
def test_unsupported_layouts_raise_naming_them(kw, match):
    with pytest.raises((ValueError, NotImplementedError), match=match):
        family_spec(hunyuan_config("tiny")).check_layout(hunyuan_config("tiny"), ParallelDims(world_size=4, **kw))
