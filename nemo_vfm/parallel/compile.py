"""``torch.compile`` per transformer block (in place, so parameter names do not change).

Compiling blocks one by one (rather than the whole model) keeps compile time flat in depth, lets
FSDP hooks and pipeline stage boundaries stay outside the compiled graphs, and reuses one graph
for all blocks of the same shape.
"""

from __future__ import annotations

from torch import nn


def compile_blocks(blocks: nn.ModuleList, *, fullgraph: bool = False, mode: str | None = None) -> None:
    for block in blocks:
        if not isinstance(block, nn.Identity):
            block.compile(fullgraph=fullgraph, mode=mode)
