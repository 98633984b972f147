"""Load a trained network (and what is needed to sample from it) from a training checkpoint."""

from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass
class LoadedModel:
    net: torch.nn.Module  # EMA weights when the checkpoint has them
    objective: object
    model_config: object
    generation: dict  # tokenizer / text-encoder specs, latent shape, fps (empty when unknown)
    step: int


def load_checkpoint(path: str | Path, device: str | torch.device = "cpu", use_ema: bool = True) -> LoadedModel:
    """Rebuild the network from a Lightning checkpoint written by :func:`nemo_vfm.train.train`."""
    path = Path(path)
    if path.is_dir():  # an experiment folder or its checkpoints/ folder: take the newest checkpoint
        from nemo_vfm.lightning.checkpointing import latest_checkpoint

        found = latest_checkpoint(path / "checkpoints") or latest_checkpoint(path)
        if found is None:
            raise FileNotFoundError(f"no step=N.ckpt checkpoint under {path}")
        path = found
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    ckpt = torch.load(path, map_location="cpu", weights_only=False)
    hp = ckpt.get("hyper_parameters", {})
    if "model_config" not in hp:
        raise ValueError(f"{path} was not written by nemo_vfm.train (no model_config in its hyper-parameters)")
    net = hp["model_config"].build()
    prefix = "ema." if use_ema and any(k.startswith("ema.") for k in ckpt["state_dict"]) else "model."
    state = {k[len(prefix):]: v for k, v in ckpt["state_dict"].items() if k.startswith(prefix)}
    net.load_state_dict(state)
    return LoadedModel(net.to(device).eval(), hp["objective"], hp["model_config"], dict(hp.get("generation", {})),
                       int(ckpt.get("global_step", 0)))
