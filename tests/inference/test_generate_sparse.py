"""``vfm generate --attention sta`` on a tiny random Wan pipeline folder: the network is built with sliding tile
attention (a window smaller than the grid changes the video, one covering it does not), and bad combinations are
refused with the fix named."""

import dataclasses

import pytest

from nemo_vfm.cli.main import main
from nemo_vfm.io.video import read_video

pytest.importorskip("diffusers")
pytest.importorskip("transformers")

SIZE = [
    "--frames",
    "5",
    "--height",
    "32",
    "--width",
    "32",
    "--device",
    "cpu",
    "--steps",
    "2",
]  # 2 x 2 x 2 grid


@pytest.fixture(scope="module")
def t2v(tmp_path_factory):
    from test_wan_generate import _pipeline

    return _pipeline(tmp_path_factory.mktemp("wan_t2v_sparse"), False)


def _generate(folder, out, *extra):
    return main(
        [
            "generate",
            "--ckpt",
            str(folder),
            "--prompt",
            "a red circle moving left",
            "--out",
            str(out),
            *SIZE,
            *extra,
        ]
    )


def test_generate_runs_a_wan_folder_with_sliding_tile_attention(t2v, tmp_path, capsys):
    assert _generate(t2v, tmp_path / "dense") == 0, capsys.readouterr().err
    assert (
        _generate(
            t2v,
            tmp_path / "sta",
            "--attention",
            "sta",
            "--attention-tile",
            "1x1x1",
            "--attention-window",
            "1x1x1",
        )
        == 0
    ), capsys.readouterr().err
    assert "sta attention" in capsys.readouterr().out
    assert (
        _generate(
            t2v,
            tmp_path / "covering",
            "--attention",
            "sta",
            "--attention-tile",
            "1x1x1",
            "--attention-window",
            "3x3x3",
        )
        == 0
    )
    dense, sta, covering = (
        read_video(tmp_path / d / "batch000.mp4")[0].astype(float) for d in ("dense", "sta", "covering")
    )
    assert dense.shape == sta.shape and dense.shape[0] == 5
    assert abs(sta - dense).mean() > 1.0  # each token attends to itself only: another video
    assert abs(covering - dense).mean() < 0.5  # the window covers the grid: dense attention


def test_attention_arguments_are_applied_to_the_model_config(t2v):
    from nemo_vfm.cli.generate import apply_attention_args
    from nemo_vfm.inference.checkpoint import read_checkpoint_info

    info = read_checkpoint_info(t2v)
    args = dataclasses.make_dataclass("A", ["attention", "attention_window", "attention_tile"])
    apply_attention_args(args("sta", "5x3x3", None), info)
    cfg = info.model_config
    assert (cfg.attention, cfg.attention_window, cfg.attention_tile) == ("sta", (5, 3, 3), (4, 8, 4))
    for bad, match in (
        (args("vsa", None, None), "VSA's learned gates exist only in a VSA-trained network"),
        (args("dense", "3x3x3", None), "--attention-window is the window of --attention sta"),
        (args("sta", "3x3", None), "three positive integers as TxHxW"),
        (args("sta", "2x3x3", None), "must be odd"),
    ):
        with pytest.raises(ValueError, match=match):
            apply_attention_args(bad, read_checkpoint_info(t2v))


def test_ring_context_parallel_is_refused_before_loading(t2v):
    from nemo_vfm.inference.checkpoint import read_checkpoint_info
    from nemo_vfm.inference.distributed import InferenceLayout, check_model_layout

    info = read_checkpoint_info(t2v)
    cfg = dataclasses.replace(info.model_config, attention="sta")
    with pytest.raises(ValueError, match="ring context parallelism"):
        check_model_layout(cfg, InferenceLayout(cp=2, cp_kind="ring"), (2, 4, 4))
    check_model_layout(cfg, InferenceLayout(cp=2, cp_kind="a2a"), (2, 4, 4))
