"""nemo_vfm.lightning.profiler: exposed vs overlapped communication from hand-built kernel timelines."""

import gzip
import json

import pytest

from nemo_vfm.lightning.profiler import (
    StepProfiler,
    format_summary,
    host_syncs,
    kernels_from_trace,
    merge,
    overlap_summary,
)
from nemo_vfm.train import TrainerConfig

GEMM, AG, RS = "sm90_xmma_gemm_bf16", "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgs)", "ncclDevKernel_ReduceScatter"


def test_merge_joins_overlapping_and_touching_intervals():
    assert merge([(5, 6), (0, 2), (1, 3), (3, 4), (7, 7)]) == [(0, 4), (5, 6)]


def test_hidden_partial_and_lone_collectives():
    # us: compute 0-100 (a second stream 40-60) and 150-200; all-gather 20-60 hidden; reduce-scatter 90-160: 10 us
    # under the first GEMM, 50 alone, 10 under the second; a last all-gather 210-230 alone; nothing runs 200-210
    kernels = [(GEMM, 0, 100), (GEMM, 40, 60), (GEMM, 150, 200), (AG, 20, 60), (RS, 90, 160), (AG, 210, 230)]
    s = overlap_summary(kernels)
    assert s["window_ms"] == pytest.approx(0.230)
    assert s["compute_ms"] == pytest.approx(0.150)
    assert s["comm_ms"] == pytest.approx(0.130)
    assert s["comm_exposed_ms"] == pytest.approx(0.070)
    assert s["comm_overlapped_ms"] == pytest.approx(0.060)
    assert s["idle_ms"] == pytest.approx(0.010)
    rows = {r["name"]: r for r in s["per_kernel"]}
    assert rows[RS] == {"name": RS, "ms": pytest.approx(0.070), "exposed_ms": pytest.approx(0.050), "calls": 1}
    assert rows[AG[:100]]["exposed_ms"] == pytest.approx(0.020) and rows[AG[:100]]["calls"] == 2
    assert s["per_kernel"][0]["name"] == RS  # most exposed first


def test_per_step_figures_and_empty_trace():
    s = overlap_summary([(GEMM, 0, 100), (AG, 100, 200)], steps=2)
    assert (s["compute_ms"], s["comm_exposed_ms"], s["window_ms"]) == (0.05, 0.05, 0.1)
    with pytest.raises(ValueError, match="no GPU kernels"):
        overlap_summary([])


def _ev(cat, name, ts, dur, tid=1):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 7, "tid": tid}


def test_host_waits_are_counted_per_step_and_charged_to_the_outermost_op():
    # main thread: aten::item (0-50) holds _local_scalar_dense and its stream sync (10-40, 30 us); aten::to (100-
    # 200) holds a copy and a sync (120-180); a sync outside any op (300-306); the autograd thread syncs inside its
    # evaluate_function (2 calls, 10 us each); a launch and a non-sync runtime call count for nothing
    events = [_ev("cpu_op", "aten::item", 0, 50), _ev("cpu_op", "aten::_local_scalar_dense", 5, 40),
              _ev("cuda_runtime", "cudaStreamSynchronize", 10, 30),
              _ev("cpu_op", "aten::to", 100, 100), _ev("cpu_op", "aten::copy_", 110, 80),
              _ev("cuda_runtime", "cudaMemcpyAsync", 115, 4), _ev("cuda_runtime", "cudaStreamSynchronize", 120, 60),
              _ev("cuda_runtime", "cudaDeviceSynchronize", 300, 6),
              _ev("cpu_op", "autograd::engine::evaluate_function: MulBackward0", 0, 500, tid=2),
              _ev("cuda_runtime", "cudaEventSynchronize", 100, 10, tid=2),
              _ev("cuda_runtime", "cudaEventSynchronize", 400, 10, tid=2),
              _ev("cuda_runtime", "cudaLaunchKernel", 20, 5, tid=2), _ev("kernel", "gemm", 0, 10)]
    s = host_syncs(events, steps=2)
    assert s["calls"] == 2 and s["blocked_ms"] == pytest.approx(0.058)  # (30 + 60 + 6 + 20) us over 2 steps
    assert s["by_op"] == [{"op": "aten::to", "calls": 0, "blocked_ms": 0.03},
                          {"op": "aten::item", "calls": 0, "blocked_ms": 0.015},
                          {"op": "autograd::engine::evaluate_function: MulBackward0", "calls": 1, "blocked_ms": 0.01},
                          {"op": "(no ATen op)", "calls": 0, "blocked_ms": 0.003}]
    assert host_syncs([_ev("kernel", "gemm", 0, 10)]) == {"calls": 0, "blocked_ms": 0.0, "by_op": []}
    text = format_summary(overlap_summary([(GEMM, 0, 100)]), host_syncs(events))
    assert "host waited for the GPU 5 times per step (0.1 ms); aten::to x1; aten::item x1" in text


def test_reads_gpu_events_of_one_device_from_a_gzipped_chrome_trace(tmp_path):
    trace = {"traceEvents": [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 500},  # host side: ignored
        {"ph": "X", "cat": "kernel", "name": GEMM, "ts": 10, "dur": 100, "args": {"device": 0, "stream": 7}},
        {"ph": "X", "cat": "kernel", "name": AG, "ts": 60, "dur": 100, "args": {"device": 0, "stream": 21}},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD", "ts": 160, "dur": 10, "args": {"device": 0}},
        {"ph": "X", "cat": "kernel", "name": GEMM, "ts": 0, "dur": 999, "args": {"device": 1}},
    ]}
    path = tmp_path / "trace.json.gz"
    path.write_bytes(gzip.compress(json.dumps(trace).encode()))
    assert kernels_from_trace(path, device=0) == [(GEMM, 10.0, 110.0), (AG, 60.0, 160.0),
                                                  ("Memcpy HtoD", 160.0, 170.0)]
    assert len(kernels_from_trace(path)) == 4


def test_profile_steps_are_validated():
    for bad in ((3, 3), (-1, 2), (1, 2, 3)):
        with pytest.raises(ValueError, match="profile_steps"):
            TrainerConfig(profile_steps=bad)
    with pytest.raises(ValueError, match="profile_steps"):
        StepProfiler(4, 2, "x")


def test_a_resumed_run_past_the_window_says_nothing_is_profiled(tmp_path):
    from types import SimpleNamespace

    cb = StepProfiler(2, 4, tmp_path)
    with pytest.warns(UserWarning, match="starts at step 10, past A=2, so nothing is profiled"):
        cb.on_train_start(SimpleNamespace(global_step=10), None)
    cb.on_train_batch_start(SimpleNamespace(global_step=10), None, None, 0)
    assert cb.prof is None and not list(tmp_path.iterdir())


def test_kernels_of_one_template_keep_their_own_rows():
    """torch's multi-tensor kernels share 100 characters of name (fused AdamW, the EMA's lerp, casts); the label
    drops the C++ namespaces first, so each keeps a row of its own in a summary."""
    from nemo_vfm.lightning.profiler import kernel_label

    head = "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::"
    adam = head + "FusedOptimizerTensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor<float"
    lerp = head + "TensorListMetadata<2>, at::native::(anonymous namespace)::TernaryOpScalarFunctor<float, 2, 2, 0>"
    assert adam[:100] == lerp[:100]
    assert "FusedAdamMathFunctor" in kernel_label(adam) and "TernaryOpScalarFunctor" in kernel_label(lerp)
    assert kernel_label(GEMM) == GEMM and len(kernel_label("x" * 500)) == 160
    from nemo_vfm.lightning.profiler import top_kernels

    rows = top_kernels([(adam, 0, 10_000), (lerp, 10_000, 13_000), (adam, 20_000, 30_000)], steps=2)
    assert [(r["ms"], r["calls"]) for r in rows] == [(10.0, 1), (1.5, 0)]
    assert rows[0]["name"] == kernel_label(adam) and rows[1]["name"] == kernel_label(lerp)
