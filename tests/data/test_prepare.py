"""vfm prepare: corrupt inputs recorded and skipped, crash-resume without duplicates, rank split, CLI."""

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

from conftest import TEXT, TOK, prepare_folder

from nemo_vfm.data.shard_writer import _tar_keys


def _keys(out: Path) -> list[str]:
    return [k for p in sorted(out.glob("*.tar")) for k in _tar_keys(p)]


def test_prepared_dataset_is_indexed(prepared):
    assert (prepared / ".nv-meta" / "dataset.yaml").is_file()
    assert len(_keys(prepared)) == 20 and len(set(_keys(prepared))) == 20
    report = json.loads((prepared / ".prepare" / "report.json").read_text())
    assert report["samples"] == 20 and report["errors"] == []
    with tarfile.open(sorted(prepared.glob("*.tar"))[0]) as tf:
        names = tf.getnames()
    assert {n.split(".", 1)[1] for n in names} == {"latent.npy", "text_emb.npy", "text_mask.npy", "json"}


def test_corrupt_input_recorded_and_crash_resume(tmp_path, raw_dir):
    raw = tmp_path / "raw"
    raw.mkdir()
    for p in sorted(raw_dir.iterdir())[:24]:
        (raw / p.name).write_bytes(p.read_bytes())
    (raw / "broken.mp4").write_bytes(b"not a video")
    (raw / "broken.txt").write_text("a broken clip")
    (raw / "nocap.png").write_bytes((raw_dir / "clip_00003.png").read_bytes())
    out = tmp_path / "out"
    first = prepare_folder(raw, out, index=False)
    reasons = {e["source"]: e["reason"] for e in first.errors}
    assert "cannot decode" in reasons["broken.mp4"] and "no caption" in reasons["nocap.png"]
    all_keys = _keys(out)

    # simulate a crash: the last shard was mid-write (partial file, no manifest line) and one finished
    # shard was renamed but its manifest line never written
    manifest = out / ".prepare" / "rank0.jsonl"
    entries = [json.loads(line) for line in manifest.read_text().splitlines()]
    with_shard = [i for i, e in enumerate(entries) if e["shard"]]
    crashed, unrecorded = entries[with_shard[-1]], entries[with_shard[-2]]
    (out / crashed["shard"]).rename(out / (crashed["shard"] + ".partial"))
    keep = [json.dumps(e) for i, e in enumerate(entries) if i not in with_shard[-2:]]
    manifest.write_text("".join(line + "\n" for line in keep))
    second = prepare_folder(raw, out)
    assert not list(out.glob("*.partial"))
    assert sorted(_keys(out)) == sorted(all_keys) and len(set(_keys(out))) == len(all_keys)  # no duplicates
    assert second.written == len(crashed["keys"]) and second.indexed
    assert unrecorded["shard"] in {e["shard"] for e in map(json.loads, manifest.read_text().splitlines())}
    assert (out / ".nv-meta" / "dataset.yaml").is_file()
    third = prepare_folder(raw, out)
    assert third.written == 0 and third.skipped_done == 12 and third.skipped_failed == 2  # unchanged failures


def test_torchrun_splits_inputs_over_ranks(tmp_path, raw_dir):
    out = tmp_path / "out"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone",
           "-m", "nemo_vfm.cli.main", "prepare", f"input={raw_dir}", f"output={out}", "samples_per_shard=4",
           "progress=false", f"tokenizer.spatial_compression={TOK['spatial_compression']}",
           f"text_encoder.dim={TEXT['dim']}", f"text_encoder.max_length={TEXT['max_length']}"]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    by_rank = {rk: [k for p in sorted(out.glob(f"shard-r000{rk}-*.tar")) for k in _tar_keys(p)] for rk in (0, 1)}
    assert len(by_rank[0]) == len(by_rank[1]) == 10 and not set(by_rank[0]) & set(by_rank[1])
    assert (out / ".nv-meta" / "dataset.yaml").is_file()


def test_cli_rejects_bad_arguments(capsys):
    from nemo_vfm.cli.main import main

    assert main(["prepare", "input=/nonexistent", "output=/tmp/x"]) == 2
    assert main(["prepare", "output=/tmp/x"]) == 2
    assert "missing input" in capsys.readouterr().err
