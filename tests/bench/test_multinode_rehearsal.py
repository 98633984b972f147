"""bench/multinode_rehearsal.py on the CPU: launchers/slurm/train.sbatch on 2 stand-in "nodes" (gloo), then the
checkpoint resumed by 2 processes of one node."""

import json

from bench import multinode_rehearsal as mr


def test_two_nodes_then_resume_on_one(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    out = tmp_path / "r.json"
    argv = ["--device", "cpu", "--factory", "quickstart", "--nodes", "2", "--per-node", "1", "--resume-nprocs", "2",
            "--steps", "4", "--every", "2", "--set", "model.num_layers=2", "--set", "model.hidden_size=64",
            "--set", "data.num_clips=16", "--keep", str(tmp_path / "run"), "--commit", "abc", "--out", str(out)]
    assert mr.main(argv) == 0
    d = json.loads(out.read_text())
    first, second = d["results"]["multinode"], d["results"]["resume"]
    assert "error" not in first and "error" not in second, (first.get("log_tail"), second.get("log_tail"))
    assert first["world_size"] == 2 and first["ranks_joined"] == 2
    assert "launchers/slurm/train.sbatch" in first["command"] and "trainer.num_nodes=2" in first["command"]
    assert "rendezvous 127.0.0.1:" in first["sbatch_output"][0]
    assert first["checkpoint"] == "step=00000004.ckpt" and first["checkpoint_gib"] > 0 and first["save_s"] >= 0
    assert second["resumed_from"] == "step=00000004.ckpt" and second["continued_at"] == 5 and second["last_step"] == 8 and second["world_size"] == 2
    assert d["commit"] == "abc" and d["device"] == "cpu"


def test_log_figures():
    text = ("Initializing distributed: GLOBAL_RANK: 0, MEMBER: 1/4\nInitializing distributed: GLOBAL_RANK: 3, MEMBER: 4/4\n"
            "checkpoint saved: step=00000020.ckpt, 7.5 GiB in 3.2 s (rank 0's view)\n"
            "resuming from /x/checkpoints/step=00000020.ckpt\n"
            "checkpoint loaded: step=00000020.ckpt in 1.5 s (rank 0's view)\n")
    assert mr.read_log_figures(text) == {"world_size": 4, "ranks_joined": 2, "checkpoint": "step=00000020.ckpt",
                                         "checkpoint_gib": 7.5, "save_s": 3.2, "resumed_from": "step=00000020.ckpt",
                                         "load_s": 1.5}
    assert mr.read_log_figures("nothing") == {}
