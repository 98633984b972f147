"""Resolve the tokenizer and text encoder that ``vfm prepare`` runs, by name.

Names go through ``nemo_vfm.tokenizers.registry`` (``build_tokenizer`` / ``build_text_encoder``) when
that module is present; otherwise the two built-ins answer: ``identity`` (pixel space-to-depth,
``IdentityTokenizer``) and ``hash`` (``HashTextEncoder``).
"""

from __future__ import annotations

import importlib

BUILTIN_TOKENIZERS = ("identity",)
BUILTIN_TEXT_ENCODERS = ("hash",)


def _registry():
    try:
        return importlib.import_module("nemo_vfm.tokenizers.registry")
    except ModuleNotFoundError as e:
        if e.name != "nemo_vfm.tokenizers.registry":
            raise
        return None


def build_tokenizer(name: str, **kwargs):
    """A ``VideoTokenizer`` by registry name (e.g. ``identity``)."""
    reg = _registry()
    if reg is not None and hasattr(reg, "build_tokenizer"):
        return reg.build_tokenizer(name, **kwargs)
    if name == "identity":
        from nemo_vfm.tokenizers.identity import IdentityTokenizer

        return IdentityTokenizer(**kwargs)
    raise ValueError(f"unknown tokenizer {name!r}; choose one of {BUILTIN_TOKENIZERS}")


def build_text_encoder(name: str, **kwargs):
    """A ``TextEncoder`` by registry name (e.g. ``hash``)."""
    reg = _registry()
    if reg is not None and hasattr(reg, "build_text_encoder"):
        return reg.build_text_encoder(name, **kwargs)
    if name == "hash":
        from nemo_vfm.tokenizers.hash_text import HashTextEncoder

        return HashTextEncoder(**kwargs)
    raise ValueError(f"unknown text encoder {name!r}; choose one of {BUILTIN_TEXT_ENCODERS}")
