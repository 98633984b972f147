"""bench/plot_scaling_rows.py: bars read from scaling.py results (largest N, or the N asked for), a failed run drawn
as failed (never as a number), a malformed bar refused."""

import json

import pytest

from bench import plot_scaling_rows as psr


def _results(path, runs):
    path.write_text(json.dumps({"results": runs}))
    return path


def _run(n, step_s, tokens, mfu=0.3):
    return {"nprocs": n, "step_s": step_s, "tokens_per_s_per_gpu": tokens, "mfu": mfu}


def test_bars_pick_the_largest_n_or_the_one_named_and_keep_failures(tmp_path):
    ok = _results(tmp_path / "a.json", [_run(1, 0.2, 100.0), _run(2, 0.25, 80.0)])
    failed = _results(tmp_path / "b.json", [{"nprocs": 2, "error": "out of memory before its first step"}])
    bars = [psr.read_bar(f"G|ours={ok}"), psr.read_bar(f"G|one GPU={ok}@1"), psr.read_bar(f"H|moe={failed}")]
    assert bars[0] == {"group": "G", "label": "ours (N=2)", "tokens": 80.0, "mfu": 0.3, "step_ms": 250.0}
    assert bars[1]["tokens"] == 100.0 and bars[1]["label"] == "one GPU (N=1)"
    assert "tokens" not in bars[2] and bars[2]["error"].startswith("out of memory")
    out = psr.plot(bars, tmp_path / "p.png", "t")
    assert out.stat().st_size > 1000


def test_malformed_bars_are_refused(tmp_path):
    ok = _results(tmp_path / "a.json", [_run(2, 0.25, 80.0)])
    with pytest.raises(ValueError, match="GROUP|LABEL=PATH"):
        psr.read_bar(str(ok))
    with pytest.raises(ValueError, match="no run at N=4"):
        psr.read_bar(f"G|x={ok}@4")
