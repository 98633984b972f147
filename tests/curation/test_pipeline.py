"""End-to-end curation on the in-process engine: ledger rows, planted filters, broken files,
kill-and-resume reproducibility, and shards that load with Megatron-Energon."""

from __future__ import annotations

import json
import tarfile

import pytest

from nemo_vfm.curation.pipeline import curate

from .conftest import small_config


def _rows(out):
    return [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]


def _shard_bytes(result):
    return {p.name: p.read_bytes() for p in result.shards}


@pytest.fixture(scope="module")
def full_run(raw_videos, tmp_path_factory):
    folder, truth = raw_videos
    out = tmp_path_factory.mktemp("curated")
    return curate(folder, out, small_config()), out


def test_every_input_and_clip_has_a_row(full_run, raw_videos):
    result, out = full_run
    folder, truth = raw_videos
    rows = _rows(out)
    inputs = {r["input"]: r for r in rows if r["kind"] == "input"}
    assert set(inputs) == {v["path"] for v in truth["videos"]} | set(truth["bad_files"])
    for bad in truth["bad_files"]:  # corrupt, zero-byte, non-video: an error row, the run went on
        assert inputs[bad]["status"] == "error" and inputs[bad]["message"].startswith("probe:")
    clips = [r for r in rows if r["kind"] == "clip"]
    for v in truth["videos"]:
        assert inputs[v["path"]]["status"] == "done"
        assert sum(c["input"] == v["path"] for c in clips) == len(v["scenes"])
    assert result.counts["inputs_error"] == len(truth["bad_files"])
    assert all(c["status"] in ("kept", "filtered") for c in clips)


def test_planted_static_and_black_clips_are_filtered(full_run, raw_videos):
    _, out = full_run
    _, truth = raw_videos
    clips = {(c["input"], c["clip_index"]): c for c in _rows(out) if c["kind"] == "clip"}
    for v in truth["videos"]:
        for k, scene in enumerate(v["scenes"]):
            row = clips[(v["path"], k)]
            if scene["kind"] == "static":
                assert row["status"] == "filtered" and row["reason"].startswith("static"), row
            elif scene["kind"] == "black":
                assert row["status"] == "filtered" and row["reason"].startswith("black"), row
            else:
                assert row["status"] == "kept", row
                assert row["caption"] == scene["caption"]  # from the sidecar, by time overlap


def test_shards_are_webdataset_and_load_with_energon(full_run):
    result, out = full_run
    from megatron.energon import (
        Cooker,
        DefaultTaskEncoder,
        WorkerConfig,
        get_loader,
        get_train_dataset,
        stateless,
    )

    kept = [r for r in _rows(out) if r["kind"] == "clip" and r["status"] == "kept"]
    names = []
    for shard in result.shards:
        with tarfile.open(shard) as tar:
            names += tar.getnames()
    assert names == [f"{r['clip_id']}.{ext}" for r in kept for ext in ("mp4", "json")]
    assert (result.shards_dir / ".nv-meta" / "dataset.yaml").is_file()

    @stateless
    def cook(raw):
        return {"key": raw["__key__"], "frames": raw["mp4"].get_frames().video_clips[0], "meta": raw["json"]}

    class Encoder(DefaultTaskEncoder):
        cookers = [Cooker(cook)]

        def batch(self, samples):
            return samples

    ds = get_train_dataset(str(result.shards_dir), worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0),
                           batch_size=1, shuffle_buffer_size=None, max_samples_per_sequence=None,
                           task_encoder=Encoder(), repeat=False)
    seen = {}
    for (sample,) in get_loader(ds):
        seen[sample["meta"]["clip_id"]] = sample
    assert set(seen) == {r["clip_id"] for r in kept}
    for r in kept:
        s = seen[r["clip_id"]]
        assert tuple(s["frames"].shape) == (r["out"]["num_frames"], 3, r["out"]["height"], r["out"]["width"])
        assert s["meta"]["caption"] == r["caption"] and s["frames"].dtype.is_floating_point is False


def test_killed_run_resumes_to_identical_shards_without_duplicates(full_run, raw_videos, tmp_path):
    result, _ = full_run
    folder, truth = raw_videos
    done = []

    def crash_after_three(rel, row):
        done.append(rel)
        if len(done) == 3:
            raise RuntimeError("simulated crash")

    with pytest.raises(RuntimeError, match="simulated crash"):
        curate(folder, tmp_path, small_config(), on_input_done=crash_after_three)
    assert not list((tmp_path / "shards").glob("*.tar"))
    starts = []
    resumed = curate(folder, tmp_path, small_config(), on_start=lambda total, finished: starts.append((total, finished)))
    assert starts == [(len(truth["videos"]) + len(truth["bad_files"]), 3)]
    assert resumed.skipped == 3
    assert _shard_bytes(resumed) == _shard_bytes(result)  # same shards as the uninterrupted run
    clip_ids = [r["clip_id"] for r in _rows(tmp_path) if r["kind"] == "clip"]
    assert len(clip_ids) == len(set(clip_ids))
    again = curate(folder, tmp_path, small_config())  # nothing left to do: skips everything, same shards
    assert again.report is None and _shard_bytes(again) == _shard_bytes(result)


def test_missing_input_fails_before_any_work(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        curate(tmp_path / "nope", tmp_path / "out", small_config())
    assert not (tmp_path / "out").exists()
