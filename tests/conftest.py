"""Suite-wide hygiene: a test that trains in this process under ``VFMParallelStrategy`` (one process, gloo) leaves
the default process group up; tear it down so the next test starts without one."""

import pytest


@pytest.fixture(autouse=True)
def _no_leftover_process_group():
    yield
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
