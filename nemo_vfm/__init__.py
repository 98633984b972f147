"""nemo-vfm: train video foundation models (video diffusion transformers) at cluster scale.

Importing the package is cheap: submodules are imported on use, and no optional dependency
(nemo_run, fiddle, energon, diffusers, ray) is touched here. The training entry point is
:func:`nemo_vfm.train.train`.
"""

__version__ = "0.1.0"
