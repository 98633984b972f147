"""A published family's weights on disk, as one generic adapter: :class:`WeightsAdapter`.

A family declares its name maps (ours <-> diffusers as ordered regex rules, ours <-> the original release as a key
prefix), what tells the two layouts apart, and the conversions that are not a rename (a fused tensor, reordered
halves, weights the network does not build); the adapter gives every family the same operations:

- folders: :meth:`~WeightsAdapter.transformer_dir` (a transformer folder, a pipeline folder's ``transformer/``, a
  two-expert folder's chosen expert, or a file's parent), :meth:`~WeightsAdapter.weight_files`,
  :meth:`~WeightsAdapter.is_folder`;
- names: :meth:`~WeightsAdapter.detect_layout` (``"diffusers"`` or ``"original"``), per-name and whole-state
  conversion in both directions;
- loading: :meth:`~WeightsAdapter.load_weights` streams a folder into a plain, meta-device or parallelised network
  (FP8 LoRA bases quantised as read) through :func:`~nemo_vfm.models.common.published_weights.load_published`;
- saving: :meth:`~WeightsAdapter.save` writes a folder in either layout (config + safetensors shards).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from nemo_vfm.models.common.published_weights import Source, load_published, safetensors_files

__all__ = ["Fused", "WeightsAdapter", "prefix_rules"]

Rules = tuple[tuple[str, str | Callable], ...]


def prefix_rules(pairs, src: int) -> Rules:
    """Regex rules from ``(our prefix, diffusers prefix)`` ``pairs`` (``{i}``: a block index), reading side ``src``
    (0: ours -> diffusers, 1: diffusers -> ours)."""
    out = []
    for pair in pairs:
        pat = "^" + re.escape(pair[src]).replace(re.escape("{i}"), r"(\d+)")
        out.append((pat, pair[1 - src].replace("{i}", r"\1")))
    return tuple(out)


@dataclass(frozen=True)
class Fused:
    """One of our parameters that diffusers stores as ``len(parts)`` tensors concatenated on dim 0 (a fused qkv):
    name templates with ``{i}`` (a block index) and ``{p}`` (``weight`` / ``bias``)."""

    ours: str
    parts: tuple[str, ...]

    def pattern(self, template: str) -> re.Pattern:
        esc = re.escape(template).replace(re.escape("{i}"), r"(?P<i>\d+)")
        esc = esc.replace(re.escape("{p}"), r"(?P<p>weight|bias)")
        return re.compile("^" + esc + "$")


@dataclass(frozen=True, kw_only=True)
class WeightsAdapter:
    """A family's weights layouts, declared (module docstring).

    ``to_diffusers`` / ``from_diffusers``: ``(pattern, replacement)`` rules applied in order to a dotted name;
    ``complete``: a name no rule matches raises (else it is kept). ``diffusers_keys`` / ``original_keys``: a regex
    found in some key of a folder of that layout. ``original_prefix``: what the release puts before our names;
    ``original_extras``: substrings of release entries that are not parameters (dropped). ``unloaded``: a regex of
    diffusers keys not loaded. ``fused`` / ``swapped``: parameters diffusers splits (:class:`Fused`) or stores with
    its two halves swapped (``(our prefix, diffusers prefix)``). ``unbuilt``: drops from our names the release's
    weights the network does not build; ``complete_release``: adds them (zeros) for a release or diffusers folder.
    ``experts``: ``{expert: (diffusers subfolder, original subfolder)}`` of a folder holding several networks
(``experts_what`` names them in errors).
    ``layouts``: those :meth:`save` writes. ``folder_hint`` /
    ``config_hint``: what a folder should be and what a mismatched config gets wrong (for errors)."""

    family: str
    diffusers_class: str
    original_classes: tuple[str, ...] = ()
    original_config_keys: tuple[str, ...] = ()
    to_diffusers: Rules
    from_diffusers: Rules
    diffusers_keys: str
    original_keys: str
    complete: bool = False
    original_prefix: str = ""
    original_extras: tuple[str, ...] = ()
    unloaded: str | None = None
    fused: tuple[Fused, ...] = ()
    swapped: tuple[tuple[str, str], ...] = ()
    unbuilt: Callable[[dict], dict] | None = None
    complete_release: Callable[[dict], dict] | None = None
    experts: dict[str, tuple[str, str]] = field(default_factory=dict)
    experts_what: str = "several experts"
    layouts: tuple[str, ...] = ("diffusers", "original")
    folder_hint: str
    config_hint: str

    # -- names ---------------------------------------------------------------------------------------------
    def _rename(self, name: str, rules: Rules, direction: str) -> str:
        hit = False
        for pat, rep in rules:
            name, n = re.subn(pat, rep, name)
            hit = hit or n > 0
        if self.complete and not hit:
            raise KeyError(f"no {direction} name for {name!r}: not a {self.family}Model parameter")
        return name

    def _special(self, name: str) -> bool:
        fused = any(f.pattern(f.ours).match(name) for f in self.fused)
        return fused or name.startswith(tuple(o for o, _ in self.swapped))

    def to_diffusers_name(self, name: str) -> str:
        """Our parameter name (or a LoRA adapter's) -> diffusers'; a fused or reordered one raises."""
        if self._special(name):
            raise KeyError(f"{name!r} has no one-to-one diffusers name (diffusers splits / reorders it); convert whole "
                           f"state dicts with to_diffusers")
        return self._rename(name, self.to_diffusers, "diffusers")

    def from_diffusers_name(self, name: str) -> str:
        """Diffusers' parameter name -> ours."""
        return self._rename(name, self.from_diffusers, f"{self.family}Model")

    def detect_layout(self, keys) -> str:
        """``'diffusers'`` or ``'original'`` from a folder's keys; ``ValueError`` when neither."""
        keys = list(keys)
        if any(re.search(self.diffusers_keys, k) for k in keys):
            return "diffusers"
        if any(re.search(self.original_keys, k) for k in keys):
            return "original"
        raise ValueError(f"these weights are neither a diffusers {self.diffusers_class} nor an original "
                         f"{self.family} network (no key matches {self.diffusers_keys!r} or {self.original_keys!r})")

    # -- whole state dicts ---------------------------------------------------------------------------------
    def _complete(self, state: dict) -> dict:
        return self.complete_release(state) if self.complete_release else dict(state)

    def state_to_diffusers(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Our state dict -> diffusers' (fused tensors split, swapped halves reordered, unbuilt weights as zeros)."""
        out = {}
        for k, v in self._complete(state).items():
            swap = next(((o, d) for o, d in self.swapped if k.startswith(o)), None)
            if swap:
                out[swap[1] + k[len(swap[0]):]] = _swap_halves(v)
                continue
            fused = next(((f, m) for f in self.fused if (m := f.pattern(f.ours).match(k))), None)
            if fused:
                f, m = fused
                for part, t in zip(f.parts, v.chunk(len(f.parts), dim=0)):
                    out[part.format(i=m["i"], p=m["p"])] = t
                continue
            out[self.to_diffusers_name(k)] = v
        return out

    def state_from_diffusers(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Diffusers' state dict -> ours."""
        return _resolve(state, self._diffusers_sources(list(state)))

    def state_to_original(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Our state dict -> the release's (its prefix; unbuilt weights as zeros)."""
        return {self.original_prefix + k: v for k, v in self._complete(state).items()}

    def state_from_original(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The release's state dict -> ours (prefix removed, non-parameter entries and unbuilt weights dropped)."""
        return _resolve(state, self._original_sources(list(state)))

    # -- sources: a folder's keys -> our parameters --------------------------------------------------------
    def _drop_unbuilt(self, out: dict) -> dict:
        return self.unbuilt(out) if self.unbuilt else out

    def _original_sources(self, keys) -> dict[str, Source]:
        out = {k.removeprefix(self.original_prefix): Source((k,)) for k in keys
               if not any(e in k for e in self.original_extras)}
        return self._drop_unbuilt(out)

    def _diffusers_sources(self, keys) -> dict[str, Source]:
        out, groups = {}, {}
        patterns = [(f, [f.pattern(p) for p in f.parts]) for f in self.fused]
        for k in keys:
            if self.unloaded and re.search(self.unloaded, k):
                continue
            swap = next(((o, d) for o, d in self.swapped if k.startswith(d)), None)
            if swap:
                out[swap[0] + k[len(swap[1]):]] = Source((k,), _swap_halves)
                continue
            part = next(((f, j, m) for f, ps in patterns for j, p in enumerate(ps) if (m := p.match(k))), None)
            if part:
                f, j, m = part
                groups.setdefault((f, m["i"], m["p"]), {})[j] = k
                continue
            out[self.from_diffusers_name(k)] = Source((k,))
        for (f, i, p), parts in groups.items():
            if len(parts) != len(f.parts):
                raise KeyError(f"{f.ours.format(i=i, p=p)!r} is made of {len(f.parts)} diffusers tensors; the folder "
                               f"has {sorted(parts.values())}")
            out[f.ours.format(i=i, p=p)] = Source(tuple(parts[j] for j in range(len(f.parts))),
                                                  lambda *ts: torch.cat(ts, dim=0))
        return self._drop_unbuilt(out)

    def sources(self, keys: list[str]) -> dict[str, Source]:
        """A folder's keys (either layout) -> ``{our name: Source}``."""
        if self.detect_layout(keys) == "diffusers":
            return self._diffusers_sources(keys)
        return self._original_sources(keys)

    # -- folders -------------------------------------------------------------------------------------------
    def expert_dirs(self, path: str | Path) -> dict[str, Path] | None:
        """``{expert: folder}`` of a folder holding every declared expert (either layout), else None."""
        p = Path(path)
        for i in (0, 1):
            dirs = {e: p / names[i] for e, names in self.experts.items()}
            if dirs and all(d.is_dir() for d in dirs.values()):
                return dirs
        return None

    def transformer_dir(self, path: str | Path, expert: str | None = None) -> Path:
        """The folder holding the transformer weights: a file's parent, ``path`` itself, a pipeline's
        ``transformer/``, or ``expert``'s folder of a multi-expert folder (``ValueError`` when ``expert`` is needed and
        not given); ``FileNotFoundError`` when ``path`` does not exist."""
        p = Path(path)
        if p.is_file():
            return p.parent
        if not p.is_dir():
            raise FileNotFoundError(f"{p} does not exist; point at {self.folder_hint}")
        experts = self.expert_dirs(p)
        if experts is not None:
            if expert not in experts:
                names = " and ".join(f"{d.name}/" for d in experts.values())
                choices = " or ".join(repr(e) for e in experts)
                raise ValueError(f"{p} holds {self.experts_what} ({names}); choose one with expert={choices} (a "
                                 f"recipe: model.expert={next(iter(experts))}), got {expert!r}")
            return experts[expert]
        return p / "transformer" if (p / "transformer").is_dir() else p

    def weight_files(self, path: str | Path, expert: str | None = None) -> list[Path]:
        """The safetensors files of a folder (from the index when there is one), or ``path`` itself if a file."""
        if Path(path).is_file():
            return [Path(path)]
        return safetensors_files(self.transformer_dir(path, expert), self.folder_hint)

    def is_folder(self, path: str | Path) -> bool:
        """Whether ``path`` is a weights folder of this family (either layout, a pipeline or a multi-expert folder)."""
        try:
            first = next(iter(self.experts), None) if self.expert_dirs(path) else None
            c = json.loads((self.transformer_dir(path, first) / "config.json").read_text())
        except (OSError, ValueError):
            return False
        if c.get("_class_name") in (self.diffusers_class, *self.original_classes):
            return True
        return bool(self.original_config_keys) and all(k in c for k in self.original_config_keys)

    # -- load / save ---------------------------------------------------------------------------------------
    def load_weights(self, model: nn.Module, path: str | Path, strict: bool = True, expert: str | None = None) -> int:
        """Stream a folder's weights into ``model`` one tensor at a time and return the number of elements read:
        plain, on the meta device or parallelised (each rank its shards), LoRA bases as base weights, FP8 bases
        quantised as read. ``expert``: which network of a multi-expert folder (default: the config's ``expert``)."""
        expert = expert or getattr(getattr(model, "cfg", None), "expert", None)
        return load_published(model, self.weight_files(path, expert), self.sources, family=self.family, path=path,
                              strict=strict, hint=self.config_hint)

    def load_new(self, network: Callable[[], nn.Module], path: str | Path, device="cpu",
                 dtype: torch.dtype | None = None) -> nn.Module:
        """``network()`` built on the meta device (in ``dtype``), each tensor assigned from the folder's shards (no
        random init, no second copy), moved to ``device``."""
        with torch.device("meta"):
            model = network()
        if dtype is not None:
            model.to(dtype)
        self.load_weights(model, path)
        return model.to(device)

    def read_state(self, path: str | Path, expert: str | None = None) -> dict[str, torch.Tensor]:
        """A folder's weights under our names, read whole."""
        from safetensors.torch import load_file

        state = {}
        for f in self.weight_files(path, expert):
            state.update(load_file(str(f)))
        return _resolve(state, self.sources(list(state)))

    def save(self, state: dict[str, torch.Tensor], folder: str | Path, cfg, config_json: Callable,
             layout: str = "diffusers", max_shard_bytes: int = 5 * 2**30) -> Path:
        """Write ``state`` (our names) as a folder in ``layout``: ``config.json`` (``config_json(cfg, layout)``) and
        safetensors shards of at most ``max_shard_bytes`` (with the ``.index.json`` when sharded). One expert of a
        multi-expert model (``cfg.expert``) goes to its subfolder of ``folder``; returns the folder written."""
        import dataclasses

        from nemo_vfm.io.sharded_safetensors import save_sharded

        if layout not in self.layouts:
            raise ValueError(f"{self.family} weights export to layout {' or '.join(map(repr, self.layouts))}, "
                             f"got {layout!r}")
        folder = Path(folder)
        if getattr(cfg, "expert", None) is not None and self.experts:
            folder = folder / self.experts[cfg.expert][0 if layout == "diffusers" else 1]
            cfg = dataclasses.replace(cfg, expert=None)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(json.dumps(config_json(cfg, layout), indent=2))
        out = self.state_to_diffusers(state) if layout == "diffusers" else self.state_to_original(state)
        return save_sharded(out, folder, max_shard_bytes)


def _swap_halves(t: torch.Tensor) -> torch.Tensor:
    a, b = t.chunk(2, dim=0)
    return torch.cat([b, a], dim=0)


def _resolve(state: dict[str, torch.Tensor], srcs: dict[str, Source]) -> dict[str, torch.Tensor]:
    return {n: s.convert(*(state[k] for k in s.keys)) if s.convert else state[s.keys[0]] for n, s in srcs.items()}
