"""Fault injection for `vfm prepare`: kills (during shard write and during Energon indexing), torn manifest
lines, a full disk, and corrupt or zero-byte inputs of every kind it reads. Each case checks the message
and that nothing already done is lost or duplicated."""

import errno
import json
import logging
import os
import signal
import subprocess
import sys
import tarfile
import textwrap
import time
from pathlib import Path

import pytest
from conftest import TEXT, TOK, prepare_folder

from nemo_vfm.data.shard_writer import _tar_keys
from nemo_vfm.data.synthetic_inputs import write_folder, write_shards


def _keys(out: Path) -> list[str]:
    return [k for p in sorted(out.glob("*.tar")) for k in _tar_keys(p)]


def _load_all(out: Path) -> list[str]:
    """Every sample key Energon yields from the prepared dataset, once through (fails on a bad index)."""
    from megatron.energon import (
        Cooker,
        DefaultTaskEncoder,
        WorkerConfig,
        get_loader,
        get_val_dataset,
        stateless,
    )

    class Keys(DefaultTaskEncoder):
        cookers = [Cooker(stateless(lambda s: s["__key__"]))]

        def batch(self, samples):
            return samples

    wc = WorkerConfig(rank=0, world_size=1, num_workers=0)
    ds = get_val_dataset(out, split_part="train", worker_config=wc, batch_size=1, task_encoder=Keys())
    return sorted(k for b in get_loader(ds) for k in b)


@pytest.fixture
def raw(tmp_path):
    return write_folder(tmp_path / "raw", 10, seed=1)


def _child(code: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh Python (same PYTHONPATH) that ends itself with SIGKILL."""
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(code))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parent), env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)


# -- torn manifest line -------------------------------------------------------------------------------------------


def test_torn_manifest_line_is_repaired_without_duplicate_keys(tmp_path, raw):
    out = tmp_path / "out"
    prepare_folder(raw, out, samples_per_shard=3, index=False)
    manifest = out / ".prepare" / "rank0.jsonl"
    lines = manifest.read_text().splitlines(keepends=True)
    torn = lines[-2][: len(lines[-2]) // 2]  # a full disk / kill in the middle of the last append
    manifest.write_text("".join(lines[:-2]) + torn)  # the line after it never came either
    write_folder(tmp_path / "more", 4, seed=9)
    for p in (tmp_path / "more").iterdir():
        p.rename(raw / f"more_{p.name}")
    second = prepare_folder(raw, out, samples_per_shard=3)
    assert manifest.read_text().endswith("\n")
    assert all(json.loads(line) for line in manifest.read_text().splitlines())  # no merged row
    keys = _keys(out)
    assert len(keys) == len(set(keys)) == 14 and second.written == 4  # the torn shard re-registered, not redone
    third = prepare_folder(raw, out, samples_per_shard=3)
    assert third.written == 0 and third.skipped_done == 14
    assert _load_all(out) == sorted(keys)  # Energon: no DuplicateSampleKeyError


def test_duplicate_shards_from_an_older_version_are_named(tmp_path, raw):
    out = tmp_path / "out"
    prepare_folder(raw, out, samples_per_shard=4, index=False)
    manifest = out / ".prepare" / "rank0.jsonl"
    first = json.loads(manifest.read_text().splitlines()[0])
    (out / "shard-r0000-000009.tar").write_bytes((out / first["shard"]).read_bytes())  # what the old bug left
    with open(manifest, "a") as f:
        f.write(json.dumps({**first, "shard": "shard-r0000-000009.tar"}) + "\n")
    with pytest.raises(RuntimeError, match=r"4 sample keys are in two shards.*delete shard-r0000-000009\.tar"):
        prepare_folder(raw, out, samples_per_shard=4)
    (out / "shard-r0000-000009.tar").unlink()
    res = prepare_folder(raw, out, samples_per_shard=4)
    keys = _keys(out)
    assert res.written == 0 and len(keys) == len(set(keys)) == 10 and _load_all(out) == sorted(keys)
    (out / first["shard"]).unlink()  # a deleted shard: its samples are prepared again, under a new name
    res = prepare_folder(raw, out, samples_per_shard=4)
    keys = _keys(out)
    assert res.written == 4 and res.shards == ["shard-r0000-000010.tar"] and len(set(keys)) == len(keys) == 10


# -- kills ---------------------------------------------------------------------------------------------------------


def test_kill_during_shard_write_loses_only_that_shard(tmp_path, raw):
    out = tmp_path / "out"
    r = _child(f"""
        import os, signal, tarfile
        from conftest import prepare_folder
        calls = [0]
        orig = tarfile.TarFile.addfile
        def addfile(self, *a, **k):
            calls[0] += 1
            if calls[0] == 4 * 3 + 2:  # inside the 4th shard (3 samples x 4 parts per shard)
                os.kill(os.getpid(), signal.SIGKILL)
            return orig(self, *a, **k)
        tarfile.TarFile.addfile = addfile
        prepare_folder({str(raw)!r}, {str(out)!r}, samples_per_shard=1)
    """, tmp_path)
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
    assert len(list(out.glob("*.tar"))) == 3 and len(list(out.glob("*.partial"))) == 1
    before = _keys(out)
    res = prepare_folder(raw, out, samples_per_shard=1)
    assert not list(out.glob("*.partial")) and res.skipped_done == 3 and res.written == 7
    keys = _keys(out)
    assert keys[:3] == before and len(keys) == len(set(keys)) == 10
    assert _load_all(out) == sorted(keys)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in state


def test_kill_during_indexing_recovers_and_leaves_no_waiting_child(tmp_path, raw):
    out = tmp_path / "out"
    prepare_folder(raw, out, samples_per_shard=4, index=False)
    pids = tmp_path / "pids.json"
    r = _child(f"""
        import json, multiprocessing, os, signal
        from megatron.energon.flavors.webdataset.aggregator_pool import AggregatorPool
        from conftest import prepare_folder
        orig = AggregatorPool._aggregator_run
        def run(self):
            kids = [p.pid for p in multiprocessing.active_children()]
            open({str(pids)!r}, "w").write(json.dumps(kids))
            os.kill(os.getpid(), signal.SIGKILL)  # the workers are alive and waiting on their queues
        AggregatorPool._aggregator_run = run
        prepare_folder({str(raw)!r}, {str(out)!r}, samples_per_shard=4)
    """, tmp_path)
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
    kids = json.loads(pids.read_text())
    assert kids
    deadline = time.time() + 10
    while any(_alive(p) for p in kids) and time.time() < deadline:
        time.sleep(0.1)
    assert not any(_alive(p) for p in kids), "energon worker left waiting after its parent was killed"
    assert not (out / ".nv-meta").exists()  # never a half-written index in place
    res = prepare_folder(raw, out, samples_per_shard=4)
    assert res.indexed and res.written == 0
    assert not list(out.glob(".nv-index-tmp-*"))
    assert _load_all(out) == sorted(_keys(out))


def test_incomplete_index_from_an_older_run_is_rebuilt(tmp_path, raw):
    out = tmp_path / "out"
    prepare_folder(raw, out)
    for f in (out / ".nv-meta").iterdir():  # what a kill left before indexing was atomic: only index.sqlite
        if f.name != "index.sqlite":
            f.unlink() if f.is_file() else None
    res = prepare_folder(raw, out)
    assert res.indexed and (out / ".nv-meta" / "dataset.yaml").is_file()
    assert _load_all(out) == sorted(_keys(out))


# -- full disk -----------------------------------------------------------------------------------------------------


def test_disk_full_during_shard_write_keeps_finished_shards(tmp_path, raw, monkeypatch, capsys):
    from nemo_vfm.cli.main import main

    out = tmp_path / "out"
    orig, calls = tarfile.TarFile.addfile, [0]

    def addfile(self, *a, **k):
        calls[0] += 1
        if calls[0] > 16:  # the third shard (2 samples x 4 parts per shard)
            raise OSError(errno.ENOSPC, "No space left on device")
        return orig(self, *a, **k)

    monkeypatch.setattr(tarfile.TarFile, "addfile", addfile)
    args = ["prepare", f"input={raw}", f"output={out}", "samples_per_shard=2", "progress=false",
            f"tokenizer.spatial_compression={TOK['spatial_compression']}", f"text_encoder.dim={TEXT['dim']}",
            f"text_encoder.max_length={TEXT['max_length']}"]
    assert main(args) == 1
    err = capsys.readouterr().err
    assert "shard-r0000-000002.tar" in err and "disk is full" in err and "re-run" in err
    assert len(list(out.glob("*.tar"))) == 2 and not list(out.glob("*.partial"))
    assert not (out / ".nv-meta").exists() and len(_keys(out)) == 4
    monkeypatch.setattr(tarfile.TarFile, "addfile", orig)
    assert main(args) == 0
    keys = _keys(out)
    assert len(keys) == len(set(keys)) == 10 and _load_all(out) == sorted(keys)


def test_disk_full_on_manifest_append_names_it(tmp_path, raw, monkeypatch):
    import nemo_vfm.data.shard_writer as sw

    out = tmp_path / "out"
    prepare_folder(raw, out, samples_per_shard=4, index=False)
    (raw / "extra.txt").write_text("a new caption")
    (raw / "extra.png").write_bytes((next(raw.glob("*.png"))).read_bytes())

    orig, calls = sw.repair_jsonl, [0]

    def full(path):  # the first call (recovery at start) passes; the append after the new shard fails
        calls[0] += 1
        if calls[0] > 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        return orig(path)

    monkeypatch.setattr(sw, "repair_jsonl", full)
    with pytest.raises(OSError, match=r"rank0\.jsonl.*disk is full"):
        prepare_folder(raw, out, samples_per_shard=4)
    monkeypatch.undo()
    res = prepare_folder(raw, out, samples_per_shard=4)  # the shard written before the failed append is kept
    keys = _keys(out)
    assert len(keys) == len(set(keys)) == 11 and res.written == 0 and _load_all(out) == sorted(keys)


# -- corrupt and zero-byte inputs ----------------------------------------------------------------------------------


def test_corrupt_and_zero_byte_inputs_are_skipped_with_their_file_named(tmp_path, raw, caplog):
    png = next(raw.glob("*.png")).read_bytes()
    mp4 = next(raw.glob("*.mp4")).read_bytes()
    bad = {
        "zero.mp4": b"", "zero.png": b"", "text.mp4": b"not a video", "noise.png": os.urandom(256),
        "truncated.mp4": mp4[: len(mp4) // 3],
    }
    for name, data in bad.items():
        (raw / name).write_bytes(data)
        (raw / name).with_suffix(".txt").write_text(f"caption of {name}")
    (raw / "badjson.png").write_bytes(png)
    (raw / "badjson.json").write_text('{"caption": "unterminated')
    (raw / "zerojson.png").write_bytes(png)
    (raw / "zerojson.json").write_text("")
    (raw / "listjson.png").write_bytes(png)
    (raw / "listjson.json").write_text("[1, 2]")
    (raw / "zerotxt.png").write_bytes(png)
    (raw / "zerotxt.txt").write_text("")
    (raw / "latin1.png").write_bytes(png)
    (raw / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    out = tmp_path / "out"
    with caplog.at_level(logging.WARNING):
        res = prepare_folder(raw, out)
    reasons = {e["source"]: e["reason"] for e in res.errors}
    assert set(reasons) == set(bad) | {"badjson.png", "zerojson.png", "listjson.png", "zerotxt.png", "latin1.png"}
    assert "malformed caption sidecar badjson.json" in reasons["badjson.png"]
    assert "malformed caption sidecar zerojson.json" in reasons["zerojson.png"]
    assert "expected a json object" in reasons["listjson.png"]
    assert "no caption" in reasons["zerotxt.png"] and "latin1.txt is not utf-8" in reasons["latin1.png"]
    assert "badjson.json" in caplog.text  # warned while running, not only in the report
    assert res.written == 10 and res.indexed
    report = json.loads((out / ".prepare" / "report.json").read_text())
    assert report["samples"] == 10 and len(report["errors"]) == len(reasons)

    # unchanged failures are not retried; a fixed sidecar is added on rerun
    (raw / "badjson.json").write_text('{"caption": "now fixed"}')
    again = prepare_folder(raw, out)
    assert again.written == 1 and again.skipped_failed == len(reasons) - 1 and again.errors == []
    report = json.loads((out / ".prepare" / "report.json").read_text())
    assert "badjson.png" not in {e["source"] for e in report["errors"]}
    assert _load_all(out) == sorted(_keys(out)) and len(_keys(out)) == 11


def test_corrupt_and_zero_byte_shards(tmp_path):
    shards = write_shards(tmp_path / "shards", 6, per_shard=3, seed=2)
    good = sorted(shards.glob("*.tar"))
    (shards / "zz-zero.tar").write_bytes(b"")
    (shards / "zz-noise.tar").write_bytes(os.urandom(2048))
    data = good[0].read_bytes()
    (shards / "zz-trunc.tar").write_bytes(data[: len(data) // 2])
    with tarfile.open(shards / "zz-badjson.tar", "w") as tf:  # a sample whose json part is malformed
        import io

        with tarfile.open(good[0]) as src:
            for m in src:
                payload = src.extractfile(m).read()
                if m.name.endswith(".json"):
                    payload = b"{not json"
                info = tarfile.TarInfo(m.name)
                info.size = len(payload)
                tf.addfile(info, io.BytesIO(payload))
    out = tmp_path / "out"
    res = prepare_folder(shards, out)
    reasons = {e["source"]: e["reason"] for e in res.errors}
    assert any("unreadable shard zz-zero.tar" in r for r in reasons.values())
    assert any("unreadable shard zz-noise.tar" in r for r in reasons.values())
    assert any(s.startswith("zz-badjson.tar:") and "malformed json part" in r for s, r in reasons.items())
    assert res.written >= 6 and res.indexed
    keys = _keys(out)
    assert len(keys) == len(set(keys)) and _load_all(out) == sorted(keys)


# -- keys, output inside input, arguments -------------------------------------------------------------------------


def test_colliding_keys_are_disambiguated_deterministically(tmp_path, raw):
    png = next(raw.glob("*.png")).read_bytes()
    for name in ("my clip", "my_clip"):
        (raw / f"{name}.png").write_bytes(png)
        (raw / f"{name}.txt").write_text(f"the caption of {name}")
    out = tmp_path / "out"
    res = prepare_folder(raw, out)
    assert res.written == 12 and len(res.renamed) == 1
    source, key = res.renamed[0]
    assert source == "my_clip.png" and key.startswith("my_clip_png-")
    keys = _keys(out)
    assert "my_clip_png" in keys and key in keys and len(keys) == len(set(keys))
    again = prepare_folder(raw, out)
    assert again.written == 0 and again.renamed == res.renamed  # same keys on every run


def test_output_inside_input_is_not_read_as_input(tmp_path, raw):
    out = raw / "prepared"
    first = prepare_folder(raw, out)
    (out / "stray.png").write_bytes(next(raw.glob("*.png")).read_bytes())  # media inside the output folder
    (out / "stray.txt").write_text("should never be prepared")
    second = prepare_folder(raw, out)
    assert first.written == 10 and second.written == 0 and second.errors == []
    with pytest.raises(ValueError, match="is the input folder"):
        prepare_folder(raw, raw)


@pytest.mark.parametrize("arg,msg", [
    ("samples_per_shard=abc", "samples_per_shard must be an integer"), ("samples_per_shard=0", ">= 1"),
    ("max_frames=-2", "max_frames must be >= 1"), ("height=-32", "height and width must be given together"),
    ("index=maybe", "index must be true or false"), ("latent_dtype=int3", "latent_dtype must be one of"),
])
def test_cli_checks_arguments_before_work(tmp_path, raw, capsys, arg, msg):
    from nemo_vfm.cli.main import main

    out = tmp_path / "out"
    assert main(["prepare", f"input={raw}", f"output={out}", arg]) == 2
    assert msg in capsys.readouterr().err and not out.exists()


def test_cli_refuses_a_file_as_output(tmp_path, raw, capsys):
    from nemo_vfm.cli.main import main

    (tmp_path / "file").write_text("x")
    assert main(["prepare", f"input={raw}", f"output={tmp_path / 'file'}"]) == 2
    assert "is a file" in capsys.readouterr().err
