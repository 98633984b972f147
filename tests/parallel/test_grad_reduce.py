"""Plain data parallel's bucketed gradient all-reduce during backward (``nemo_vfm.parallel.grad_reduce``) leaves
the same gradients as one all-reduce after backward, across micro-batches that only accumulate; through the
strategy, gradient completion runs once per optimizer step (a TP run that accumulates equals one process)."""

import pytest
import torch
from gloo_launcher import run_distributed


def _net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 16), torch.nn.GELU(),
                               torch.nn.Linear(16, 4))


def _grads_with_reducer(rank, world, bucket_mb, micro_batches, reduce_dtype=None):
    import torch.distributed as dist

    from nemo_vfm.parallel.grad_reduce import GradReducer

    net = _net()
    reducer = GradReducer(list(net.parameters()), dist.group.WORLD, bucket_mb=bucket_mb, reduce_dtype=reduce_dtype)
    inputs = [torch.randn(3, 8, generator=torch.Generator().manual_seed(10 * rank + i)) for i in range(micro_batches)]
    for i, x in enumerate(inputs):
        reducer.enabled = i == micro_batches - 1  # the last micro-batch reduces
        net(x).square().sum().backward()
    reducer.finish()
    mine = [p.grad.clone() for p in net.parameters()]
    buckets = len(reducer.buckets)
    reducer.remove()
    # the reference: each rank's accumulated local gradients, averaged by hand
    ref = _net()
    for x in inputs:
        ref(x).square().sum().backward()
    local = [p.grad.clone() for p in ref.parameters()]
    gathered = [[torch.zeros_like(g) for _ in range(world)] for g in local]
    for g, out in zip(local, gathered):
        dist.all_gather(out, g)
    return mine, [torch.stack(out).mean(0) for out in gathered], buckets


@pytest.mark.parametrize("bucket_mb, micro_batches", [(1e-6, 1), (1e-6, 2), (100.0, 2)])
def test_bucketed_reduce_equals_the_average_of_the_ranks(bucket_mb, micro_batches):
    for mine, ref, buckets in run_distributed(_grads_with_reducer, 2, bucket_mb, micro_batches):
        assert buckets == (6 if bucket_mb < 1 else 1)  # one bucket per parameter when tiny, else one
        for a, b in zip(mine, ref):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_bf16_reduce_leaves_fp32_gradients_close_to_the_average():
    """``reduce_dtype=bf16``: the bucket travels in bf16 (an fp32 one would match to 1e-6), the gradients come back
    in fp32 and equal the average to bf16's precision."""
    for mine, ref, _ in run_distributed(_grads_with_reducer, 2, 100.0, 2, torch.bfloat16):
        for a, b in zip(mine, ref):
            assert a.dtype == torch.float32
            torch.testing.assert_close(a, b, rtol=1e-2, atol=1e-3)
        assert any(not torch.allclose(a, b, rtol=1e-6, atol=1e-7) for a, b in zip(mine, ref))
        assert all(torch.equal(a, a.bfloat16().float()) for a in mine)  # values a bf16 sum can hold


def test_bucket_size_must_be_positive():
    from nemo_vfm.parallel.grad_reduce import GradReducer

    with pytest.raises(ValueError, match="bucket_mb must be > 0"):
        GradReducer([], None, bucket_mb=0)


def _train(rank, world, root, strategy_kw, accumulate):
    from nemo_vfm.data.synthetic import MockLatentDataModule
    from nemo_vfm.lightning.strategy import VFMParallelStrategy
    from nemo_vfm.models.moviegen.model import MovieGenConfig
    from nemo_vfm.train import ExperimentConfig, TrainerConfig, train

    cfg = MovieGenConfig(num_layers=2, hidden_size=32, num_heads=4, num_kv_heads=2, in_channels=4, context_dim=16,
                         patch_size=(1, 2, 2), max_grid=(4, 4, 4))
    data = MockLatentDataModule(latent_channels=4, num_frames=4, height=4, width=4, context_dim=16,
                                context_length=3, batch_size=2, num_samples=16)
    strategy = VFMParallelStrategy(param_dtype=None, **strategy_kw) if strategy_kw is not None else "auto"
    trainer = TrainerConfig(max_steps=2, devices=world, accelerator="cpu", precision="32-true", strategy=strategy,
                            log_every_n_steps=1, checkpoint_every_n_steps=50, enable_progress_bar=False,
                            accumulate_grad_batches=accumulate, gradient_clip_val=1.0)
    out = train(model=cfg, data=data, trainer=trainer, ema_decay=None,
                log=ExperimentConfig(name="acc", root=root, tensorboard=False))
    if rank:
        return out["loss"], None
    from nemo_vfm.inference.checkpoint import full_state_dict, read_checkpoint_info

    return out["loss"], full_state_dict(read_checkpoint_info(out["checkpoint"]), use_ema=False)


def _assert_same_run(a, b, rtol):
    assert a[0] == pytest.approx(b[0], rel=rtol)
    assert a[1].keys() == b[1].keys()
    for k in a[1]:
        torch.testing.assert_close(a[1][k], b[1][k], rtol=rtol, atol=1e-7, msg=k)


@pytest.mark.slow
def test_plain_data_parallel_overlapped_equals_one_reduce_after_backward(tmp_path):
    kw = dict(fsdp=False)
    overlapped = run_distributed(_train, 2, str(tmp_path / "on"), kw, 2)
    flat = run_distributed(_train, 2, str(tmp_path / "off"), {**kw, "overlap_grad_reduce": False}, 2)
    _assert_same_run(overlapped[0], flat[0], 1e-6)


@pytest.mark.slow
def test_tensor_parallel_with_accumulation_trains_like_one_process(tmp_path):
    """TP ranks share their samples, so TP2 + SP accumulating 2 micro-batches per step is one process's run:
    the TP-partial gradients are summed once per optimizer step, not once per micro-batch."""
    single = _train(0, 1, str(tmp_path / "single"), None, 2)
    tp = run_distributed(_train, 2, str(tmp_path / "tp"), dict(tensor_model_parallel_size=2, sequence_parallel=True,
                                                                fsdp=False), 2)
    _assert_same_run(tp[0], single, 1e-5)
