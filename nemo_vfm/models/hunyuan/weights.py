"""HunyuanVideo 1.5 weight names: ours (the original release's) <-> diffusers' ``HunyuanVideo15Transformer3DModel``,
and loading a transformer folder into a network (no model import: ``model.py`` loads through here).

Besides names: the token refiner's fused ``self_attn_qkv`` is diffusers' ``to_q/to_k/to_v``, and the final
layer's modulation is ``(shift, scale)`` in the release and ``(scale, shift)`` in diffusers' ``norm_out``. The
release's last double block has a text-stream output projection and MLP whose output nothing reads; our model
does not build them, loading drops them and export writes them as zeros (what they are worth to the output).
:func:`load_weights` streams a folder through the loader every family shares
(``nemo_vfm.models.common.published_weights``) with :func:`sources` as the key map: each rank reads the slices of
its shards (the fused refiner qkv and the final modulation are computed whole, they are small), FP8 LoRA bases
quantised as read.
"""

import re
from pathlib import Path

import torch
from torch import nn

from nemo_vfm.models.common.published_weights import Source, load_published, safetensors_files

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


def _compile(rules, src: int):
    out = []
    for pair in rules:
        pat = re.escape(pair[src]).replace(re.escape("{i}"), r"(\d+)")
        out.append((re.compile("^" + pat), pair[1 - src]))
    return out


_TO_DIFF, _FROM_DIFF = _compile(_RULES, 0), _compile(_RULES, 1)


def _rename(name: str, rules) -> str | None:
    for pat, template in rules:
        m = pat.match(name)
        if m:
            head = template.replace("{i}", m.group(1)) if m.groups() else template
            return head + name[m.end():]
    return None


def _swap_halves(t: torch.Tensor) -> torch.Tensor:
    a, b = t.chunk(2, dim=0)
    return torch.cat([b, a], dim=0)


def _last_block(state, prefix: str) -> int:
    ids = [int(m.group(1)) for k in state if (m := re.match(rf"^{re.escape(prefix)}(\d+)\.", k))]
    return max(ids) if ids else -1


_DEAD = ("txt_attn_proj.", "txt_mlp.")  # of the last double block: its text output is never read


def drop_dead_weights(state: dict) -> dict:
    """Our-names ``state`` (tensors, or anything keyed by our names) without the last block's text-stream projection
    and MLP."""
    n = _last_block(state, "double_blocks.")
    dead = tuple(f"double_blocks.{n}.{p}" for p in _DEAD)
    return {k: v for k, v in state.items() if not k.startswith(dead)}


def _add_dead_weights(out: dict[str, torch.Tensor]) -> None:
    """Zeros for the last block's ``to_add_out`` / ``ff_context`` that diffusers' model has (in place)."""
    n = _last_block(out, "transformer_blocks.")
    b = f"transformer_blocks.{n}."
    if n < 0 or b + "attn.to_add_out.weight" in out:
        return
    d, f = out[b + "attn.to_q.weight"].shape[0], out[b + "ff.net.0.proj.weight"].shape[0]
    like = out[b + "attn.to_q.weight"]
    for name, shape in (("attn.to_add_out.weight", (d, d)), ("attn.to_add_out.bias", (d,)),
                        ("ff_context.net.0.proj.weight", (f, d)), ("ff_context.net.0.proj.bias", (f,)),
                        ("ff_context.net.2.weight", (d, f)), ("ff_context.net.2.bias", (d,))):
        out[b + name] = like.new_zeros(shape)


def to_diffusers(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our state dict -> diffusers names (the refiner's qkv split, the final modulation reordered, zeros for the
    last block's unread text-stream weights)."""
    out = {}
    for k, v in state.items():
        if k.startswith(_FINAL_MOD[0]):
            out[_FINAL_MOD[1] + k[len(_FINAL_MOD[0]):]] = _swap_halves(v)
            continue
        m = re.match(r"^txt_in\.individual_token_refiner\.blocks\.(\d+)\.self_attn_qkv\.(weight|bias)$", k)
        if m:
            for n, part in zip(("to_q", "to_k", "to_v"), v.chunk(3, dim=0)):
                out[f"context_embedder.token_refiner.refiner_blocks.{m.group(1)}.attn.{n}.{m.group(2)}"] = part
            continue
        name = _rename(k, _TO_DIFF)
        if name is None:
            raise KeyError(f"no diffusers name for {k!r}: not a HunyuanVideoModel parameter")
        out[name] = v
    _add_dead_weights(out)
    return out


def to_diffusers_name(name: str) -> str:
    """Our parameter name (or a LoRA adapter's: ``...img_attn_q.lora_A.weight``) -> diffusers'; the fused refiner
    qkv and the final modulation have no one-to-one diffusers name and raise."""
    if ".self_attn_qkv." in name or name.startswith(_FINAL_MOD[0]):
        raise KeyError(f"{name!r} has no one-to-one diffusers name (diffusers splits / reorders it); convert whole "
                       f"state dicts with to_diffusers")
    out = _rename(name, _TO_DIFF)
    if out is None:
        raise KeyError(f"no diffusers name for {name!r}: not a HunyuanVideoModel parameter")
    return out


def _diffusers_sources(keys) -> dict[str, Source]:
    """Diffusers' keys -> ``{our name: Source}`` (the refiner's q/k/v fused, the final modulation's halves swapped,
    the last block's unread text-stream weights dropped)."""
    out, qkv = {}, {}
    for k in keys:
        if k.startswith(_FINAL_MOD[1]):
            out[_FINAL_MOD[0] + k[len(_FINAL_MOD[1]):]] = Source((k,), _swap_halves)
            continue
        m = re.match(r"^context_embedder\.token_refiner\.refiner_blocks\.(\d+)\.attn\.to_([qkv])\.(weight|bias)$", k)
        if m:
            qkv.setdefault((m.group(1), m.group(3)), {})[m.group(2)] = k
            continue
        name = _rename(k, _FROM_DIFF)
        if name is None:
            raise KeyError(f"no HunyuanVideoModel name for diffusers key {k!r}")
        out[name] = Source((k,))
    for (i, kind), parts in qkv.items():
        if set(parts) != {"q", "k", "v"}:
            raise KeyError(f"refiner block {i} lacks some of to_q/to_k/to_v.{kind}")
        out[f"txt_in.individual_token_refiner.blocks.{i}.self_attn_qkv.{kind}"] = Source(
            (parts["q"], parts["k"], parts["v"]), lambda q, k, v: torch.cat([q, k, v], dim=0))
    return drop_dead_weights(out)


def sources(keys: list[str]) -> dict[str, Source]:
    """A HunyuanVideo folder's keys (diffusers or original layout, told apart by the names) -> ``{our name:
    Source}``, without the last block's unread text-stream weights."""
    if any(k.startswith(("transformer_blocks.", "x_embedder.")) for k in keys):
        return _diffusers_sources(keys)
    return drop_dead_weights({k: Source((k,)) for k in keys})


def _resolve(state: dict[str, torch.Tensor], srcs: dict[str, Source]) -> dict[str, torch.Tensor]:
    return {n: s.convert(*(state[k] for k in s.keys)) if s.convert else state[s.keys[0]] for n, s in srcs.items()}


def from_diffusers(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Diffusers' ``HunyuanVideo15Transformer3DModel`` state dict -> our names."""
    return _resolve(state, _diffusers_sources(state))


def transformer_dir(path: str | Path) -> Path:
    """The folder holding the transformer weights: ``path`` or its ``transformer/`` (a pipeline folder)."""
    path = Path(path)
    if (path / "transformer").is_dir():
        return path / "transformer"
    if not path.is_dir():
        raise FileNotFoundError(f"{path} is not a HunyuanVideo 1.5 folder (a transformer folder or a pipeline folder "
                                f"with transformer/)")
    return path


def weight_files(path: str | Path) -> list[Path]:
    """The safetensors files of a HunyuanVideo folder (from the index when there is one)."""
    return safetensors_files(transformer_dir(path), "a HunyuanVideo 1.5 transformer folder or a pipeline folder with "
                                                    "transformer/")


def read_state(path: str | Path) -> dict[str, torch.Tensor]:
    """The folder's weights under our names (diffusers or original layout, detected from the keys), read whole."""
    from safetensors.torch import load_file

    state = {}
    for f in weight_files(path):
        state.update(load_file(str(f)))
    return _resolve(state, sources(list(state)))


def load_weights(model: nn.Module, path: str | Path, strict: bool = True) -> int:
    """Stream a folder's weights into ``model`` and return the number of elements read. ``model`` may be plain, on
    the meta device (parameters assigned), or parallelised and wrapped (DTensor parameters take their shards, read
    as slices; activation checkpointing / compile wrappers and LoRA adapters are looked through: adapted linears take
    the weights as their base, an FP8 base quantised as read, the adapters left as they are;
    ``nemo_vfm.models.common.published_weights.load_published``). Raises naming a missing or unexpected parameter."""
    return load_published(model, weight_files(path), sources, family="HunyuanVideo", path=path, strict=strict,
                          hint="flavor: layers, sizes, embedder widths")
