"""Model configs in a safetensors header: :func:`to_header_json` writes dataclasses tagged with their class,
:func:`from_header_json` rebuilds only nemo_vfm's config classes (nothing is imported by name from a file)."""

import dataclasses


def to_header_json(obj):
    """Configs (dataclasses of plain values) as JSON for a safetensors header, each tagged with its class."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out = {"__class__": f"{type(obj).__module__}:{type(obj).__qualname__}"}
        out.update({f.name: to_header_json(getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.init})
        return out
    if isinstance(obj, dict):
        return {str(k): to_header_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_header_json(v) for v in obj]
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise TypeError(f"cannot store {type(obj).__name__} in a safetensors header; keep configs to dataclasses of "
                    "plain values")


def from_header_json(obj, path=None):
    """Rebuild configs from a header: plain values, and ``{"__class__": "module:Name", ...}`` only for our config
    classes (:func:`nemo_vfm.io.safe_load.config_class`); anything else is refused, nothing is imported."""
    from nemo_vfm.io.safe_load import UnsafeCheckpointError, config_class

    if isinstance(obj, dict):
        obj = {k: from_header_json(v, path) for k, v in obj.items()}
        if "__class__" in obj:
            name = obj.pop("__class__")
            module, _, qualname = name.partition(":") if isinstance(name, str) else ("", "", "")
            cls = config_class(module, qualname)
            if cls is None or not dataclasses.is_dataclass(cls):
                raise UnsafeCheckpointError(f"refusing to load {path or 'this file'}: its header names {name!r}, which "
                                            "is not one of nemo_vfm's config classes; re-export it with "
                                            "`vfm generate --export-safetensors` from a trusted checkpoint")
            fields = {f.name for f in dataclasses.fields(cls) if f.init}
            if set(obj) - fields:
                raise ValueError(f"{path or 'the header'}: {name} has no field(s) {sorted(set(obj) - fields)}")
            return cls(**obj)
        return obj
    if isinstance(obj, list):
        return [from_header_json(v, path) for v in obj]
    return obj
