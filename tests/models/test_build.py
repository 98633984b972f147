"""Every family's network is built on meta and initialised once by ``init_weights()``: that must set every parameter
and buffer (nothing left as ``to_empty``'s garbage), and a from-scratch build is exactly that path."""

import pytest
import torch

from nemo_vfm.models.common.moe import MoEConfig
from nemo_vfm.models.cosmos.model import CosmosConfig
from nemo_vfm.models.dit.model import DiTConfig
from nemo_vfm.models.hunyuan.model import HunyuanVideoConfig
from nemo_vfm.models.ltx2.flavors import ltx2_config
from nemo_vfm.models.moviegen.model import MovieGenConfig
from nemo_vfm.models.stdit.flavors import stdit_config
from nemo_vfm.models.wan.model import WanConfig

CONFIGS = {
    "dit": lambda: DiTConfig(num_layers=2, hidden_size=64, num_heads=4, in_channels=4, context_dim=16),
    "dit_adaln_lora": lambda: DiTConfig(num_layers=2, hidden_size=64, num_heads=4, in_channels=4, context_dim=16,
                                        adaln_lora_rank=8),
    "stdit": lambda: stdit_config("tiny", in_channels=4, context_dim=16),
    "moviegen_moe": lambda: MovieGenConfig(num_layers=2, hidden_size=32, num_heads=4, num_kv_heads=2, in_channels=4,
                                           context_dim=16, moe=MoEConfig(num_experts=4, expert_ffn_size=16)),
    "wan_i2v": lambda: WanConfig(num_layers=2, hidden_size=24, num_heads=2, ffn_size=32, in_channels=12,
                                 out_channels=4, context_dim=16, freq_dim=16, image_dim=32),
    "cosmos": lambda: CosmosConfig(num_layers=2, hidden_size=64, num_heads=4, in_channels=4, out_channels=4,
                                   context_dim=32, text_dim=16, adaln_lora_dim=8),
    "hunyuan": lambda: HunyuanVideoConfig(num_layers=2, hidden_size=32, num_heads=4, num_refiner_layers=1,
                                          in_channels=9, out_channels=4, text_dim=16, glyph_dim=8, glyph_hidden=16,
                                          image_dim=12, rope_axes_dim=(2, 2, 4)),
    "ltx2_gated_cross_mod": lambda: ltx2_config("tiny", gated_attn=True, audio_gated_attn=True, cross_attn_mod=True,
                                                audio_cross_attn_mod=True, ff_bias=False),
}


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_init_weights_sets_every_tensor_and_a_build_is_meta_then_init_weights(family):
    cfg = CONFIGS[family]()
    net = cfg.build("meta").to_empty(device="cpu")
    with torch.no_grad():  # poison what to_empty left, so that anything init_weights skips shows
        for t in [*net.parameters(), *net.buffers()]:
            t.fill_(float("nan") if t.is_floating_point() else -7)
    torch.manual_seed(3)
    net.init_weights()
    left = [n for n, t in [*net.named_parameters(), *net.named_buffers()]
            if (t.isnan() if t.is_floating_point() else t == -7).any()]
    assert not left, f"init_weights() leaves {left} uninitialised"
    torch.manual_seed(3)
    built = cfg.build()
    for (n, a), (m, b) in zip([*built.state_dict().items()], [*net.state_dict().items()], strict=True):
        assert n == m and torch.equal(a, b), n
