"""``VFMParallelStrategy.batch_to_device`` on CUDA: the copy runs on a side stream that the compute stream
waits for, and every tensor of the batch (nested dicts, dataclasses) arrives intact."""

import dataclasses

import pytest
import torch

pytestmark = pytest.mark.gpu


@dataclasses.dataclass
class _Packed:
    tokens: torch.Tensor
    lengths: list


def test_batch_copied_on_a_side_stream_and_intact():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from nemo_vfm.lightning.strategy import VFMParallelStrategy

    strategy = VFMParallelStrategy(compile=False)
    strategy._lightning_module = None  # no module: Lightning's plain move_data_to_device path
    strategy.parallel_devices = [torch.device("cuda", 0)]
    batch = {"latents": torch.randn(4, 16, 2, 8, 8).pin_memory(), "meta": [torch.arange(5).pin_memory()],
             "packed": _Packed(torch.randn(3, 7).pin_memory(), [3, 4])}
    expect = {"latents": batch["latents"].clone(), "arange": batch["meta"][0].clone(),
              "tokens": batch["packed"].tokens.clone()}
    out = strategy.batch_to_device(batch, torch.device("cuda", 0))
    assert strategy._copy_stream is not None and strategy._copy_stream != torch.cuda.current_stream()
    assert out["latents"].is_cuda and out["packed"].tokens.is_cuda and out["meta"][0].is_cuda
    # the compute stream waits for the copy: reading on it sees the data
    assert torch.equal(out["latents"].cpu(), expect["latents"])
    assert torch.equal(out["meta"][0].cpu(), expect["arange"])
    assert torch.equal(out["packed"].tokens.cpu(), expect["tokens"]) and out["packed"].lengths == [3, 4]
