"""Fault injection for `vfm curate`: a kill in the middle of a ledger write, torn ledger lines, a full disk,
an interrupted Energon index, corrupt and zero-byte inputs (videos and caption sidecars), an output folder
inside the input, near-duplicate clips and bad arguments. Each case checks the message and that nothing
already done is lost or duplicated."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from nemo_vfm.curation.pipeline import curate
from nemo_vfm.curation.synthetic import render_box_clip, write_container
from nemo_vfm.data.synthetic_video import ShapeClipSpec, render_shape_clip

from .conftest import small_config

FPS = 24.0


def _words(text: str) -> str:
    """The CLI's message with rich's line wrapping undone (it wraps at spaces, where depends on path lengths)."""
    return " ".join(text.split())


def _scene(kind: str, n: int = 24, seed: int = 0) -> np.ndarray:
    if kind == "box":
        return render_box_clip(n, 96, 128, size=16 + 8 * (seed % 3), speed=2.0 + seed % 3, seed=seed)
    shape, bg, motion = {"a": ("circle", "gray", "right"), "b": ("triangle", "gray", "down"),
                         "c": ("square", "gray", "left")}[kind]
    return render_shape_clip(ShapeClipSpec(num_frames=n, height=96, width=128, speed=0.04, size=0.4),
                             shape, "yellow", bg, motion, (0.3 + 0.1 * seed, 0.5))


def _video(path: Path, scenes: list[str], seed: int = 0) -> Path:
    write_container(path, np.concatenate([_scene(k, seed=seed) for k in scenes]), FPS, path.suffix[1:])
    return path


def _raw(folder: Path, n: int = 3) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for v in range(n):
        _video(folder / f"v{v}.mp4", ["a", "box"] if v % 2 == 0 else ["b", "box"], seed=v)
    return folder


def _rows(out: Path, kind: str | None = None) -> list[dict]:
    rows = [json.loads(x) for x in (out / "manifest.jsonl").read_text().splitlines()]
    return [r for r in rows if kind is None or r["kind"] == kind]


def _shards(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((out / "shards").glob("*.tar"))}


def _cfg(**kw):
    return small_config(energon_prepare=False, **kw)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted run over three two-scene videos: (raw folder, output, kept clip count)."""
    base = tmp_path_factory.mktemp("ref")
    raw = _raw(base / "raw")
    res = curate(raw, base / "out", _cfg())
    return raw, base / "out", res.counts["kept"]


def test_reference_keeps_every_scene(reference):
    _, out, kept = reference
    assert kept == 6 and all(c["status"] == "kept" for c in _rows(out, "clip"))


# -- torn ledger lines and kills --------------------------------------------------------------------------------


def test_torn_ledger_line_keeps_the_clip_count_across_reruns(reference, tmp_path):
    raw, ref_out, kept = reference
    out = tmp_path / "out"
    shutil.copytree(ref_out, out)
    ledger = out / "ledger.jsonl"
    lines = ledger.read_text().splitlines(keepends=True)
    ledger.write_text("".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2])  # the last input row, torn
    again = curate(raw, out, _cfg())
    assert again.skipped == 2 and again.counts["kept"] == kept
    assert all(json.loads(x) for x in ledger.read_text().splitlines())  # no row merged into the fragment
    third = curate(raw, out, _cfg())
    assert third.report is None and third.counts["kept"] == kept
    assert _shards(out) == _shards(ref_out)


def test_kill_in_the_middle_of_a_ledger_write_resumes_to_the_same_shards(reference, tmp_path):
    raw, ref_out, kept = reference
    out = tmp_path / "out"
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(f"""
        import json, os, signal
        from nemo_vfm.curation import ledger as L
        from nemo_vfm.curation.pipeline import curate
        from tests.curation.conftest import small_config
        calls, orig = [0], L.Ledger.append
        def append(self, row, sync=False):
            calls[0] += 1
            if calls[0] == 5:  # a clip row of the second input, half written, then the process dies
                with open(self.path, "a") as f:
                    line = json.dumps({{**row, "attempt": self.attempt}}, sort_keys=True)
                    f.write(line[: len(line) // 2])
                os.kill(os.getpid(), signal.SIGKILL)
            return orig(self, row, sync)
        L.Ledger.append = append
        curate({str(raw)!r}, {str(out)!r}, small_config(energon_prepare=False))
    """))
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(root),
                                                                                os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=180)
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
    assert not (out / "ledger.jsonl").read_text().endswith("\n")  # the torn line is there
    resumed = curate(raw, out, _cfg())
    assert resumed.skipped == 1 and resumed.counts["kept"] == kept
    assert _shards(out) == _shards(ref_out)
    ids = [r["clip_id"] for r in _rows(out, "clip")]
    assert len(ids) == len(set(ids)) == 6
    assert all(json.loads(x) for x in (out / "ledger.jsonl").read_text().splitlines())  # nothing glued on
    again = curate(raw, out, _cfg())  # what the next run reads back from the file
    assert again.report is None and again.counts["kept"] == kept and _shards(out) == _shards(ref_out)


def test_interrupted_index_is_rebuilt(reference, tmp_path):
    raw, ref_out, _ = reference
    out = tmp_path / "out"
    shutil.copytree(ref_out, out)
    res = curate(raw, out, small_config())  # index it
    meta = res.shards_dir / ".nv-meta"
    for f in meta.iterdir():  # what a kill left before indexing was atomic: only index.sqlite
        if f.name != "index.sqlite":
            f.unlink()
    again = curate(raw, out, small_config())
    assert (meta / "dataset.yaml").is_file() and again.counts["kept"] == res.counts["kept"]
    assert not list(res.shards_dir.glob(".nv-index-tmp-*"))


# -- full disk ---------------------------------------------------------------------------------------------------


def test_disk_full_while_staging_a_clip_stops_and_resumes(reference, tmp_path, monkeypatch, capsys):
    from nemo_vfm.cli.main import main

    raw, ref_out, kept = reference
    out = tmp_path / "out"
    orig, calls = Path.write_bytes, [0]

    def write_bytes(self, data):
        # count the staged clips (their mp4 temporaries), not every staged file: which file comes sixth depends on
        # how the writer workers interleave, so "the disk fills while staging a clip" is pinned to a clip's mp4
        if ".staging" in str(self) and ".mp4.tmp" in self.name:
            calls[0] += 1
            if calls[0] > 2:  # two inputs' clips staged, then the disk is full
                raise OSError(errno.ENOSPC, "No space left on device")
        return orig(self, data)

    monkeypatch.setattr(Path, "write_bytes", write_bytes)
    args = ["curate", str(raw), str(out), "--no-preview", "engine=local", "height=48", "min_clip_s=0.5",
            "num_workers=8", "shard_size=4", "energon_prepare=false", "rebalance_interval_s=0.5"]
    assert main(args) == 1
    err = _words(capsys.readouterr().err)
    assert "disk is full" in err and ".staging" in err and ".mp4" in err, err
    assert not list((out / ".staging").rglob("*.tmp*"))  # no temporary left behind
    ledger_before = (out / "ledger.jsonl").read_text()
    done_before = [json.loads(x) for x in ledger_before.splitlines() if '"kind": "input"' in x]
    assert 1 <= len(done_before) < 3 and all(r["status"] == "done" for r in done_before)
    monkeypatch.setattr(Path, "write_bytes", orig)
    assert main(args) == 0
    assert (out / "ledger.jsonl").read_text().startswith(ledger_before)  # earlier rows kept as they were
    assert _shards(out) == _shards(ref_out)
    assert sum(r["status"] == "kept" for r in _rows(out, "clip")) == kept


# -- corrupt and zero-byte inputs --------------------------------------------------------------------------------


def test_corrupt_and_zero_byte_inputs(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    good = _video(raw / "good.mp4", ["a", "box"])
    data = good.read_bytes()
    (raw / "zero.mp4").write_bytes(b"")
    (raw / "text.mp4").write_text("not a video\n")
    (raw / "noise.mkv").write_bytes(os.urandom(4096))
    (raw / "truncated.mp4").write_bytes(data[: len(data) // 3])
    shutil.copy(good, raw / "badjson.mp4")
    (raw / "badjson.json").write_text('{"caption": "unterminated')
    shutil.copy(good, raw / "zerojson.mp4")
    (raw / "zerojson.json").write_text("")
    shutil.copy(good, raw / "latin1.mp4")
    (raw / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    res = curate(raw, tmp_path / "out", _cfg(dedup_threshold=None))
    inputs = {r["input"]: r for r in _rows(tmp_path / "out", "input")}
    for name in ("zero.mp4", "text.mp4", "noise.mkv", "truncated.mp4"):
        assert inputs[name]["status"] == "error" and inputs[name]["message"].startswith("probe:"), inputs[name]
    clips = _rows(tmp_path / "out", "clip")
    for name, msg in (("badjson.mp4", "malformed caption sidecar badjson.json"),
                      ("zerojson.mp4", "malformed caption sidecar zerojson.json"),
                      ("latin1.mp4", "latin1.txt is not utf-8")):
        mine = [c for c in clips if c["input"] == name]
        assert mine and all(c["status"] == "error" and msg in c["reason"] for c in mine), mine
    assert [c["status"] for c in clips if c["input"] == "good.mp4"] == ["kept", "kept"]
    assert res.counts["kept"] == 2 and res.counts["inputs_error"] == 4


# -- output inside input, dedup, arguments ----------------------------------------------------------------------


def test_output_inside_input_is_not_recurated(reference, tmp_path):
    raw = tmp_path / "raw"
    shutil.copytree(reference[0], raw)
    first = curate(raw, raw / "curated", _cfg())
    second = curate(raw, raw / "curated", _cfg())
    assert first.inputs == second.inputs == 3 and second.report is None
    assert second.counts["kept"] == first.counts["kept"] == 6
    with pytest.raises(ValueError, match="is the input folder"):
        curate(raw, raw, _cfg())


def test_near_duplicates_removed_within_and_across_videos(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    a = _video(raw / "a.mp4", ["a", "box", "a"])  # its third scene repeats the first
    shutil.copy(a, raw / "copy_of_a.mp4")  # the same video under another name
    _video(raw / "other.mp4", ["c", "box"], seed=4)
    res = curate(raw, tmp_path / "out", _cfg(embed="frames"))
    clips = {c["clip_id"]: c for c in _rows(tmp_path / "out", "clip")}
    by_input = {}
    for c in clips.values():
        by_input.setdefault(c["input"], []).append(c)
    a_clips = sorted(by_input["a.mp4"], key=lambda c: c["clip_index"])
    assert [c["status"] for c in a_clips] == ["kept", "kept", "filtered"]
    assert a_clips[2]["reason"].startswith("near_duplicate") and a_clips[0]["clip_id"] in a_clips[2]["reason"]
    assert all(c["status"] == "filtered" and c["reason"].startswith("near_duplicate") for c in by_input["copy_of_a.mp4"])
    assert [c["status"] for c in by_input["other.mp4"]] == ["kept", "kept"]
    inputs = {r["input"]: r for r in _rows(tmp_path / "out", "input")}
    assert (inputs["a.mp4"]["kept"], inputs["a.mp4"]["filtered"]) == (2, 1) and inputs["copy_of_a.mp4"]["kept"] == 0
    assert res.counts["kept"] == 4 and all(c["scores"]["dedup_similarity"] >= 0.95 for c in clips.values()
                                           if c["status"] == "filtered")
    ledger = [json.loads(x) for x in (tmp_path / "out" / "ledger.jsonl").read_text().splitlines()]
    dedup = [r for r in ledger if r["kind"] == "dedup"]
    assert len(dedup) == 1 + len(by_input["copy_of_a.mp4"]) and all(r["similarity"] >= 0.95 for r in dedup)
    import tarfile

    in_shards = [m.split(".")[0] for p in res.shards for m in tarfile.open(p).getnames() if m.endswith(".json")]
    assert sorted(in_shards) == sorted(c for c, r in clips.items() if r["status"] == "kept")
    again = curate(raw, tmp_path / "out", _cfg(embed="frames"))  # a rerun records no new decision
    assert again.counts == res.counts
    ledger2 = [json.loads(x) for x in (tmp_path / "out" / "ledger.jsonl").read_text().splitlines()]
    assert len(ledger2) == len(ledger)


@pytest.mark.parametrize("extra,msg", [
    (["height=abc"], "height must be an integer"), (["min_motion=2"], "min_motion must be in [0, 1]"),
    (["dedup_threshold=0"], "dedup_threshold must be in (0, 1]"), (["fps=-1"], "fps must be > 0"),
])
def test_cli_checks_numbers_before_work(tmp_path, capsys, extra, msg):
    from nemo_vfm.cli.main import main

    raw = tmp_path / "raw"
    raw.mkdir()
    assert main(["curate", str(raw), str(tmp_path / "out"), *extra]) == 2
    assert msg in _words(capsys.readouterr().err) and not (tmp_path / "out").exists()


def test_cli_checks_paths_before_work(tmp_path, capsys):
    from nemo_vfm.cli.main import main

    assert main(["curate", str(tmp_path / "missing"), str(tmp_path / "out")]) == 2
    assert "does not exist" in _words(capsys.readouterr().err) and not (tmp_path / "out").exists()
    (tmp_path / "file").write_text("x")
    (tmp_path / "raw").mkdir()
    assert main(["curate", str(tmp_path / "raw"), str(tmp_path / "file")]) == 2
    assert "is a file" in _words(capsys.readouterr().err)
    assert main(["curate", str(tmp_path / "raw"), str(tmp_path / "raw"), "--synthetic", "1"]) == 2
    assert "is the input folder" in _words(capsys.readouterr().err)
    assert not list((tmp_path / "raw").iterdir())  # --synthetic wrote nothing
