"""The project's own errors: designed stops and settings a run cannot use.

An error of these types carries a complete message (what was wrong, what to do), so that entry points print it as
one line, without a traceback (:func:`user_message`); any other exception is a bug or an environment failure and
keeps its traceback. ``ValueError``, ``NotImplementedError`` and ``FileNotFoundError`` raised by a ``raise``
statement in this package (configuration checks such as a config's ``__post_init__``) count as designed too.
"""

from __future__ import annotations

import dis
import os
from types import TracebackType

__all__ = ["VFMError", "user_message"]


class VFMError(Exception):
    """A designed stop (e.g. training stopped on NaN/Inf) or a setting the run cannot use; the message says what was
    wrong and what to do. Subclasses also derive from the builtin type they refine (``RuntimeError``, ...)."""


# builtin types whose message is ours when our own code raised them (configuration checks)
_CHECK_TYPES = (ValueError, NotImplementedError, FileNotFoundError)
_RAISE = dis.opmap["RAISE_VARARGS"]


def _raised_by_a_statement_in(tb: TracebackType | None, roots: tuple[str, ...]) -> bool:
    """Whether the innermost frame of ``tb`` is a ``raise`` statement in a file under one of ``roots`` (not an error
    from a builtin or a library that our code merely called)."""
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    code = tb.tb_frame.f_code
    if not os.path.abspath(code.co_filename).startswith(roots):
        return False
    return 0 <= tb.tb_lasti < len(code.co_code) and code.co_code[tb.tb_lasti] == _RAISE


def user_message(exc: BaseException, packages: tuple[str, ...] = ("nemo_vfm",)) -> str | None:
    """The one-line message of a designed error (a :class:`VFMError`, or a ``ValueError`` /
    ``NotImplementedError`` / ``FileNotFoundError`` raised by a statement in one of ``packages``), else None.
    Unwraps Fiddle's build-time proxy (which appends its own context to the message)."""
    import importlib.util

    exc = getattr(exc, "proxy_base_exception", exc)
    if isinstance(exc, VFMError):
        return str(exc)
    if not isinstance(exc, _CHECK_TYPES):
        return None
    roots = []
    for name in packages:
        spec = importlib.util.find_spec(name)
        roots += [os.path.join(os.path.abspath(p), "") for p in (spec.submodule_search_locations or [])] if spec else []
    return str(exc) if roots and _raised_by_a_statement_in(exc.__traceback__, tuple(roots)) else None
