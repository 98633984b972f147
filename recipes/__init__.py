"""NeMo-Run recipes for nemo-vfm, installed as ``nemo_vfm_recipes``.

Recipes are nullary factories returning ``run.Partial``/``run.Config`` trees; they pick
combinations and hold no library logic. Import a submodule to register its CLI factories::

    from nemo_vfm_recipes import dit
    recipe = dit.pretrain_xl()
"""
