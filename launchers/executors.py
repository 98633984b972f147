"""Moved to :mod:`nemo_vfm_recipes.executors` (installed with the package); this name stays an alias of it,
so ``import executors`` (with ``launchers/`` on ``sys.path``) and ``from launchers.executors import ...`` still work."""

import importlib
import sys

sys.modules[__name__] = importlib.import_module("nemo_vfm_recipes.executors")
