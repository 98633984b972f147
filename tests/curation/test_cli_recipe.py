"""``vfm curate`` and the ``curate_videos`` NeMo-Run recipe; the shards feed ``vfm prepare``."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from nemo_vfm.cli.main import main

REPO = Path(__file__).resolve().parents[2]


def test_cli_curates_with_overrides_and_resumes(raw_videos, tmp_path, capsys):
    folder, truth = raw_videos
    args = ["curate", str(folder), str(tmp_path), "engine=local", "height=48", "min_clip_s=0.5", "num_workers=8"]
    assert main(args) == 0
    out = capsys.readouterr()
    assert "bottleneck" in out.out and "transcode" in out.out and "shard(s)" in out.out
    assert "curate" in out.err  # the progress bar
    assert json.loads((tmp_path / "config.json").read_text())["height"] == 48
    assert (tmp_path / "preview.gif").stat().st_size > 0
    assert main(args) == 0
    assert "already finished" in capsys.readouterr().err


def test_cli_rejects_bad_overrides_and_missing_input(tmp_path, capsys):
    assert main(["curate", str(tmp_path), str(tmp_path / "o"), "heigth=48"]) == 2
    assert "heigth" in capsys.readouterr().err
    assert main(["curate", str(tmp_path), str(tmp_path / "o"), "aspect=squash"]) == 2
    assert "aspect" in capsys.readouterr().err
    assert main(["curate", str(tmp_path / "missing"), str(tmp_path / "o"), "engine=local"]) == 2
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.mp4").write_bytes(b"")
    assert main(["curate", str(tmp_path / "in"), str(tmp_path / "o"), "engine=local", "num_workers=3"]) == 2
    assert "num_workers" in capsys.readouterr().err


def test_recipe_builds_and_runs(raw_videos, tmp_path):
    fdl = pytest.importorskip("fiddle")
    spec = importlib.util.spec_from_file_location("nemo_vfm_recipes_curation", REPO / "recipes" / "curation.py")
    recipes = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipes)
    folder, _ = raw_videos
    recipe = recipes.curate_videos_local(input_path=str(folder), output_path=str(tmp_path))
    recipe.config.height, recipe.config.min_clip_s, recipe.config.num_workers = 48, 0.5, 8
    assert recipes.curate_videos().config.engine == "ray"
    result = fdl.build(recipe)()
    assert result.counts["kept"] > 0 and (tmp_path / "shards" / ".nv-meta" / "dataset.yaml").is_file()


def test_shards_feed_vfm_prepare(raw_videos, tmp_path):
    from nemo_vfm.curation.pipeline import curate

    from .conftest import small_config

    prepare = pytest.importorskip("nemo_vfm.data.prepare")
    folder, _ = raw_videos
    curated = curate(folder, tmp_path / "curated", small_config())
    res = prepare.prepare(prepare.PrepareConfig(input=str(curated.shards_dir), output=str(tmp_path / "prepared"),
                                                max_frames=8, progress=False, text_encoder_kwargs={"dim": 16}))
    assert res.errors == [] and res.written == curated.counts["kept"]
