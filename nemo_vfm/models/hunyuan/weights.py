"""HunyuanVideo 1.5 weights on disk, declared for the generic adapter (:class:`~nemo_vfm.models.common.weights.
WeightsAdapter`): :data:`ADAPTER`. Ours are the original release's names; diffusers' are
``HunyuanVideo15Transformer3DModel``'s (no model import: ``model.py`` loads through here).

Besides names: the token refiner's fused ``self_attn_qkv`` is diffusers' ``to_q/to_k/to_v``, and the final
layer's modulation is ``(shift, scale)`` in the release and ``(scale, shift)`` in diffusers' ``norm_out``. The
release's last double block has a text-stream output projection and MLP whose output nothing reads; our model
does not build them, loading drops them and export writes them as zeros (what they are worth to the output).
"""

import re

import torch

from nemo_vfm.models.common.weights import Fused, WeightsAdapter, prefix_rules

_R = "txt_in.individual_token_refiner.blocks.{i}."
_DR = "context_embedder.token_refiner.refiner_blocks.{i}."
# (our prefix, diffusers prefix); {i} is a block index. Longest prefixes first where one contains another.
_RULES: list[tuple[str, str]] = [
    ("img_in.proj.", "x_embedder.proj."),
    ("time_in.mlp.0.", "time_embed.timestep_embedder.linear_1."),
    ("time_in.mlp.2.", "time_embed.timestep_embedder.linear_2."),
    ("time_r_in.mlp.0.", "time_embed.timestep_embedder_r.linear_1."),
    ("time_r_in.mlp.2.", "time_embed.timestep_embedder_r.linear_2."),
    ("txt_in.t_embedder.mlp.0.", "context_embedder.time_text_embed.timestep_embedder.linear_1."),
    ("txt_in.t_embedder.mlp.2.", "context_embedder.time_text_embed.timestep_embedder.linear_2."),
    ("txt_in.c_embedder.", "context_embedder.time_text_embed.text_embedder."),
    ("txt_in.input_embedder.", "context_embedder.proj_in."),
    (_R + "norm1.", _DR + "norm1."), (_R + "norm2.", _DR + "norm2."),
    (_R + "self_attn_proj.", _DR + "attn.to_out.0."),
    (_R + "mlp.fc1.", _DR + "ff.net.0.proj."), (_R + "mlp.fc2.", _DR + "ff.net.2."),
    (_R + "adaLN_modulation.1.", _DR + "norm_out.linear."),
    ("byt5_in.layernorm.", "context_embedder_2.norm."),
    ("byt5_in.fc1.", "context_embedder_2.linear_1."), ("byt5_in.fc2.", "context_embedder_2.linear_2."),
    ("byt5_in.fc3.", "context_embedder_2.linear_3."),
    ("vision_in.proj.0.", "image_embedder.norm_in."), ("vision_in.proj.1.", "image_embedder.linear_1."),
    ("vision_in.proj.3.", "image_embedder.linear_2."), ("vision_in.proj.4.", "image_embedder.norm_out."),
    ("cond_type_embedding.", "cond_type_embed."),
    ("final_layer.linear.", "proj_out."),
]
_B, _DB = "double_blocks.{i}.", "transformer_blocks.{i}."
for ours, theirs in [("img_mod.linear.", "norm1.linear."), ("txt_mod.linear.", "norm1_context.linear."),
                     ("img_attn_q.", "attn.to_q."), ("img_attn_k.", "attn.to_k."), ("img_attn_v.", "attn.to_v."),
                     ("img_attn_q_norm.", "attn.norm_q."), ("img_attn_k_norm.", "attn.norm_k."),
                     ("img_attn_proj.", "attn.to_out.0."),
                     ("txt_attn_q.", "attn.add_q_proj."), ("txt_attn_k.", "attn.add_k_proj."),
                     ("txt_attn_v.", "attn.add_v_proj."), ("txt_attn_q_norm.", "attn.norm_added_q."),
                     ("txt_attn_k_norm.", "attn.norm_added_k."), ("txt_attn_proj.", "attn.to_add_out."),
                     ("img_mlp.fc1.", "ff.net.0.proj."), ("img_mlp.fc2.", "ff.net.2."),
                     ("txt_mlp.fc1.", "ff_context.net.0.proj."), ("txt_mlp.fc2.", "ff_context.net.2.")]:
    _RULES.append((_B + ours, _DB + theirs))
_FINAL_MOD = ("final_layer.adaLN_modulation.1.", "norm_out.linear.")  # (shift, scale) <-> (scale, shift)
_DEAD = ("txt_attn_proj.", "txt_mlp.")  # of the last double block: its text output is never read


def _last_block(state, prefix: str) -> int:
    ids = [int(m.group(1)) for k in state if (m := re.match(rf"^{re.escape(prefix)}(\d+)\.", k))]
    return max(ids) if ids else -1


def drop_dead_weights(state: dict) -> dict:
    """Our-names ``state`` (tensors, or anything keyed by our names) without the last block's text-stream projection
    and MLP."""
    n = _last_block(state, "double_blocks.")
    dead = tuple(f"double_blocks.{n}.{p}" for p in _DEAD)
    return {k: v for k, v in state.items() if not k.startswith(dead)}


def add_dead_weights(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our-names ``state`` with zeros for the last block's text-stream projection and MLP (as the release has)."""
    n = _last_block(state, "double_blocks.")
    b = f"double_blocks.{n}."
    if n < 0 or b + "txt_attn_proj.weight" in state:
        return dict(state)
    d, f = state[b + "img_attn_q.weight"].shape[0], state[b + "img_mlp.fc1.weight"].shape[0]
    like = state[b + "img_attn_q.weight"]
    out = dict(state)
    for name, shape in (("txt_attn_proj.weight", (d, d)), ("txt_attn_proj.bias", (d,)),
                        ("txt_mlp.fc1.weight", (f, d)), ("txt_mlp.fc1.bias", (f,)),
                        ("txt_mlp.fc2.weight", (d, f)), ("txt_mlp.fc2.bias", (d,))):
        out[b + name] = like.new_zeros(shape)
    return out


ADAPTER = WeightsAdapter(
    family="HunyuanVideo", diffusers_class="HunyuanVideo15Transformer3DModel",
    to_diffusers=prefix_rules(_RULES, 0), from_diffusers=prefix_rules(_RULES, 1), complete=True,
    diffusers_keys=r"^(transformer_blocks|x_embedder)\.", original_keys=r"^(double_blocks|img_in)\.",
    fused=(Fused("txt_in.individual_token_refiner.blocks.{i}.self_attn_qkv.{p}",
                 tuple(f"context_embedder.token_refiner.refiner_blocks.{{i}}.attn.to_{x}.{{p}}" for x in "qkv")),),
    swapped=(_FINAL_MOD,), unbuilt=drop_dead_weights, complete_release=add_dead_weights,
    folder_hint="a HunyuanVideo 1.5 transformer folder or a pipeline folder with transformer/",
    config_hint="flavor: layers, sizes, embedder widths")
load_weights, to_diffusers, from_diffusers = ADAPTER.load_weights, ADAPTER.state_to_diffusers, ADAPTER.state_from_diffusers
to_diffusers_name, read_state, transformer_dir = ADAPTER.to_diffusers_name, ADAPTER.read_state, ADAPTER.transformer_dir
