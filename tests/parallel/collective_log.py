"""What the multi-process tests record of the collectives a rank issues (call inside a gloo rank)."""

from __future__ import annotations

from contextlib import contextmanager

import torch.distributed as dist


@contextmanager
def logged_all_to_alls(events: list):
    """While active, every ``dist.all_to_all_single`` appends ``"a2a"`` (started without waiting, ``async_op``) or
    ``"a2a (waited)"`` to ``events`` before it runs."""
    a2a = dist.all_to_all_single

    def logged(*args, **kwargs):
        events.append("a2a" if kwargs.get("async_op") else "a2a (waited)")
        return a2a(*args, **kwargs)

    dist.all_to_all_single = logged
    try:
        yield events
    finally:
        dist.all_to_all_single = a2a
