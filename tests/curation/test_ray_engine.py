"""The real Ray engine, end to end (Ray starts once for this module and is shut down after it)."""

from __future__ import annotations

import pytest

from nemo_vfm.curation.backends import RayBackend
from nemo_vfm.curation.engine import Engine
from nemo_vfm.curation.pipeline import curate
from nemo_vfm.curation.stage import SleepStage
from nemo_vfm.curation.task import ClipTask

from .conftest import small_config

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def ray_cluster():
    # more logical CPUs than cores: sleeping actors do not use CPU, and the pipeline run below needs 8 slots
    ray.init(num_cpus=12, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_ray_curation_matches_local_engine(ray_cluster, raw_videos, tmp_path):
    folder, truth = raw_videos
    on_ray = curate(folder, tmp_path / "ray", small_config(engine="ray"))
    assert on_ray.report.engine == "ray" and ray.is_initialized()  # reused the running instance, left it up
    local = curate(folder, tmp_path / "local", small_config(engine="local"))
    assert on_ray.counts == local.counts and on_ray.counts["kept"] > 0
    assert [p.read_bytes() for p in on_ray.shards] == [p.read_bytes() for p in local.shards]
    assert {s.name for s in on_ray.report.stages} == {"probe", "split", "transcode", "filter", "caption", "write"}


@pytest.mark.timing
def test_ray_balancer_gives_slow_stage_four_times_the_workers(ray_cluster):
    # 6 slots keep actor start-ups few on 2 cores: even 2/2/2 at first, balanced 1/4/1
    stages = [SleepStage("a", 0.02), SleepStage("slow", 0.08), SleepStage("c", 0.02)]
    engine = Engine(stages, RayBackend(), budget=6, rebalance_interval_s=1.0)
    done = []
    report = engine.run((ClipTask(source="x", rel=str(i)) for i in range(300)), done.append, lambda rel: None)
    assert len(done) == 300
    assert [s.workers for s in report.stages] == [1, 4, 1]
    # once re-balanced and every actor is up (Ray actor start-up on 2 busy cores takes seconds)
    assert report.steady_inputs_per_s is not None, report
    assert report.steady_inputs_per_s > 0.8 * report.ideal_inputs_per_s, report


class _DieOnSeven(SleepStage):
    """Kills its own worker process on item "7" (a segfaulting decoder, say)."""

    def process(self, task):
        if task.rel == "7":
            import os

            os._exit(1)
        return super().process(task)


def test_crashed_actor_gives_an_error_row_and_the_run_goes_on(ray_cluster):
    import sys

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import the tests
    engine = Engine([_DieOnSeven("fragile", 0.01)], RayBackend(), budget=2, balance=False)
    finished = {}
    engine.run((ClipTask(source="x", rel=str(i)) for i in range(30)), lambda t: finished.update({t.rel: t}),
               lambda rel: None)
    assert len(finished) == 30
    assert finished["7"].status == "error" and "worker crashed" in finished["7"].reason
    assert sum(t.status == "ok" for t in finished.values()) >= 27  # an item queued behind "7" may fail with it
