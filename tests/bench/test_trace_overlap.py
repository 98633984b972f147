"""bench/trace_overlap.py: the summary of a chrome trace on the command line."""

import json

from bench.trace_overlap import main


def test_prints_the_split_and_the_most_exposed_kernels(tmp_path, capsys):
    ag = "ncclDevKernel_AllGather_RING_LL"
    trace = [{"ph": "X", "cat": "kernel", "name": "gemm", "ts": 0, "dur": 100, "args": {"device": 0}},
             {"ph": "X", "cat": "kernel", "name": ag, "ts": 50, "dur": 100, "args": {"device": 0}},
             {"ph": "X", "cat": "cpu_op", "name": "aten::item", "ts": 0, "dur": 200, "pid": 1, "tid": 1},
             {"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamSynchronize", "ts": 10, "dur": 150, "pid": 1,
              "tid": 1}]
    (tmp_path / "t.json").write_text(json.dumps(trace))
    assert main([str(tmp_path / "t.json"), "--steps", "1"]) == 0
    out = capsys.readouterr().out
    assert "GPU window 0.1 ms = compute 0.1 + communication exposed 0.1 + idle 0.0" in out
    assert "0.05 ms exposed of     0.10 x1     " + ag in out
    assert "host waited for the GPU 1 times per step (0.1 ms); aten::item x1" in out
