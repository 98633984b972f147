"""Under context parallelism, a checkpointed block compiles with its checkpoint inside the graph: the token split
hooks run on the checkpoint wrapper, outside the recomputed region, so Dynamo meets no side effect there (before,
block 0's hook set ``TokenParallel.views`` inside the region, Dynamo gave up on the checkpoint and ran it eager
around separately compiled pieces). gloo, 2 processes, Dynamo's graphs counted by a recording backend."""

from gloo_launcher import run_distributed

from bench import equivalence as E


def _worker(rank, world, knobs):
    import torch
    from torch._dynamo.utils import counters

    from nemo_vfm.parallel import parallelize as P
    from nemo_vfm.parallel.dims import ParallelDims

    graphs = []

    def record(gm, example_inputs):  # what Dynamo captured: the functions each graph calls
        graphs.append(sorted({str(n.target) for n in gm.graph.nodes if n.op == "call_function"}))
        return gm.forward

    def compile_blocks(blocks, **_):
        for b in blocks:
            b.compile(backend=record)

    P.compile_blocks = compile_blocks
    torch._dynamo.reset()
    counters.clear()
    cfg = E.tiny_config()
    problem = E.make_problem(cfg)
    run = E.run_layout(cfg, problem, ParallelDims(world_size=world, cp=2, cp_kind="a2a"), compile=True, **knobs)
    breaks = [k.splitlines()[0] for k in counters["graph_break"]]
    return {"graphs": graphs, "breaks": breaks, "run": run}


def test_a_checkpointed_block_under_cp_compiles_with_its_checkpoint_in_the_graph():
    cfg = E.tiny_config()
    reference = E.run_reference(cfg, E.make_problem(cfg))
    out = run_distributed(_worker, 2, {"activation_checkpointing": "save_attention"})
    assert not out[0]["breaks"], out[0]["breaks"]
    assert any("tag_activation_checkpoint" in str(g) for g in out[0]["graphs"]), out[0]["graphs"]
    errs = E.compare(reference, E.merge_ranks([r["run"] for r in out]))
    assert errs["loss"] < 1e-5 and errs["grads"] < 1e-4 and errs["params"] < 1e-5, errs
