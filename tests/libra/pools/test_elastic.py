"""The elastic pool with real processes: gloo on CPU, a small MLP with AdamW, fixed seeds."""

from types import SimpleNamespace

import pytest
import torch

from libra.pools.pool import ElasticPool, events_table
from libra.pools.reference import ddp_run
from libra.pools.task import RegressionTask

TASK = RegressionTask(global_batch=48)
STEPS = 30


def run(task=TASK, steps=STEPS, **kwargs):
    kwargs.setdefault("group_timeout_s", 3.0)
    pool = ElasticPool(task, steps=steps, core_ranks=2, **kwargs).start()
    return pool, pool.wait(300)


@pytest.fixture(scope="module")
def core_only():
    return run(hybrids=0)[1]


def tensors(result):
    yield from result.model.items()
    for index, state in result.optimizer["state"].items():
        for name, value in state.items():
            yield f"{index}.{name}", value


def assert_bitwise(a, b):
    for (name, x), (_, y) in zip(tensors(a), tensors(b), strict=True):
        assert torch.equal(x, y), name


def assert_close(a, b, atol=1e-6):
    for (name, x), (_, y) in zip(tensors(a), tensors(b), strict=True):
        torch.testing.assert_close(x, y, rtol=0, atol=atol, msg=name)


def kinds(result, worker="hybrid-0", notes=("snapshot_loaded",)):
    """The worker's transitions, with the progress notes named in `notes` (replays depend on timing)."""
    return [e.event for e in result.events if e.worker_id == worker and (e.from_state != e.to_state or e.event in notes)]


def test_a_hybrid_that_stays_in_rollout_leaves_the_core_bitwise_unchanged(core_only):
    _, result = run(hybrids=1, min_step_s=0.02)
    assert kinds(result) == []
    assert {s["replicas"] for s in result.steps} == {2}
    assert_bitwise(result, core_only)


def test_after_a_join_every_step_equals_plain_ddp_over_the_same_replicas():
    _, result = run(hybrids=1, min_step_s=0.05, schedule={0: 1})
    assert kinds(result) == ["join_requested", "snapshot_loaded", "activated", "leave_requested", "released"]
    entering = next(s for s in result.steps if s["replicas"] == 3)
    if not any(e.event == "updates_replayed" for e in result.events):  # it entered caught up: with a shard
        assert entering["active"] == 3
    active = [s["active"] for s in result.steps]
    assert active[0] == 2 and active[-1] == 3 and active.count(3) >= STEPS // 2
    reference = ddp_run(TASK, 3, STEPS)  # three replicas from the start: the same update every step
    assert_close(result, SimpleNamespace(**reference))


def test_a_hybrid_that_enters_behind_contributes_zeros_for_its_entering_step():
    # enter_gap 0: never close enough, so it enters once it stops getting closer, in zero mode
    steps = 50  # several replay round trips before it enters
    _, result = run(steps=steps, hybrids=1, min_step_s=0.05, schedule={0: 1}, enter_gap=0)
    assert kinds(result)[:3] == ["join_requested", "snapshot_loaded", "activated"]
    shapes = {(s["replicas"], s["active"]) for s in result.steps}
    assert (3, 2) in shapes and (3, 3) in shapes  # a member step with zeros, then training steps
    reference = ddp_run(TASK, 3, steps)
    assert_close(result, SimpleNamespace(**reference))


@pytest.mark.parametrize("fault", ["die_fetching", "die_entering"])
def test_sigkill_mid_join_rolls_back_and_the_core_matches_the_no_hybrid_run(core_only, fault):
    _, result = run(hybrids=1, min_step_s=0.05, schedule={2: 1}, faults={"hybrid-0": fault})
    events = [e for e in result.events if e.worker_id == "hybrid-0"]
    assert events[0].event == "join_requested"
    died = [e for e in events if e.event == "died"]
    assert len(died) == 1 and died[0].from_state == "joining" and "SIGKILL" in died[0].detail
    assert "activated" not in kinds(result)
    if fault == "die_entering":  # it was in the step's group: that step was redone by the core alone
        assert sum(s["retried"] for s in result.steps) == 1
    assert_bitwise(result, core_only)


def test_sigkill_of_a_training_hybrid_redoes_the_step_without_it(core_only):
    pool = ElasticPool(TASK, steps=STEPS, core_ranks=2, hybrids=1, min_step_s=0.05, group_timeout_s=3.0).start()
    pool.request_join("hybrid-0")
    pool.wait_for(lambda events: any(e.event == "activated" for e in events))
    pool.wait_for(lambda events: pool.progress >= events[-1].step + 2)
    pool.kill("hybrid-0")
    result = pool.wait(300)
    # died while training; or, if its death was reported after the failed step's grace period,
    # rolled back first and then marked failed
    assert kinds(result)[-1] == "died"
    assert kinds(result)[-2:] in (["activated", "died"], ["rolled_back", "died"])
    retried = [s["step"] for s in result.steps if s["retried"]]
    assert len(retried) <= 1  # the step in flight when it died (none if it died between steps)
    assert all(s["active"] == 2 for s in result.steps if s["step"] >= (retried or [STEPS])[0])
    assert_close(result, core_only)  # no gradient lost or counted twice


def test_a_join_that_takes_too_long_is_cancelled(core_only):
    pool = ElasticPool(TASK, steps=STEPS, core_ranks=2, hybrids=1, min_step_s=0.05, join_timeout_s=0.5,
                       faults={"hybrid-0": "slow_fetch"}).start()
    pool.request_join("hybrid-0")
    result = pool.wait(300)
    assert kinds(result)[:2] == ["join_requested", "join_timed_out"]
    assert_bitwise(result, core_only)


def test_a_slow_join_catches_up_by_replaying_logged_updates():
    steps = 70
    _, result = run(steps=steps, hybrids=1, min_step_s=0.05, schedule={0: 1}, join_timeout_s=60,
                    faults={"hybrid-0": "slow_fetch"})
    assert kinds(result)[:3] == ["join_requested", "snapshot_loaded", "activated"]
    replays = [e for e in result.events if e.event == "updates_replayed"]
    assert replays  # the 2 s fetch left it far behind; it replayed logged updates before entering
    reference = ddp_run(TASK, 3, steps)
    assert_close(result, SimpleNamespace(**reference))


def test_twenty_join_leave_cycles_keep_the_parameters_on_the_reference():
    task = RegressionTask(global_batch=48, dtype="float64")
    steps = 24 * 8 + 4  # 24 chances for 20 cycles: on a loaded machine a join may miss its 4-step window
    schedule = {s: (1 if (s // 4) % 2 == 0 else 0) for s in range(0, steps, 4)}
    _, result = run(task, steps, hybrids=1, min_step_s=0.04, schedule=schedule)
    _, reference = run(task, steps, hybrids=0)
    assert kinds(result).count("activated") >= 20
    assert kinds(result).count("released") >= 20
    assert_close(result, reference, atol=1e-9)


def test_pool_events_fit_the_store_schema(tmp_path):
    from libra.config import StoreConfig
    from storage.catalog import Catalog
    from storage.ingest import writer_for

    _, result = run(hybrids=1, min_step_s=0.05, schedule={0: 1}, steps=10)
    writer_for(StoreConfig(root=str(tmp_path))).write_run("pool_events", "pool", events_table(result.events))
    rows = Catalog(tmp_path, "pool").query(
        "select worker_id, from_state, to_state, event from pool_events "
        "where from_state <> to_state or event = 'snapshot_loaded' order by time_s").to_pylist()
    assert [r["event"] for r in rows] == ["join_requested", "snapshot_loaded", "activated", "leave_requested", "released"]
    assert rows[2] == {"worker_id": "hybrid-0", "from_state": "joining", "to_state": "training", "event": "activated"}


def test_hybrids_as_ray_actors(core_only):
    ray = pytest.importorskip("ray")
    from libra.pools.providers import RayActors

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        pool = ElasticPool(TASK, steps=STEPS, core_ranks=2, hybrids=1, min_step_s=0.05, group_timeout_s=3.0,
                           provider=RayActors()).start(wait_for_hybrids_s=120)
        pool.request_join("hybrid-0")
        pool.wait_for(lambda events: any(e.event == "activated" for e in events))
        pool.request_leave("hybrid-0")
        result = pool.wait(300)
    finally:
        ray.shutdown()
    assert kinds(result) == ["join_requested", "snapshot_loaded", "activated", "leave_requested", "released"]
    assert_close(result, core_only)


def test_a_cuda_pool_needs_one_gpu_per_local_worker():
    import torch

    from libra.errors import LibraError

    if torch.cuda.is_available() and torch.cuda.device_count() >= 4:
        pytest.skip("this machine has a GPU for every worker")
    with pytest.raises(LibraError, match="one GPU per local worker process"):
        ElasticPool(TASK, steps=3, core_ranks=2, hybrids=2, device="cuda")
    with pytest.raises(LibraError, match="use 'cpu' \\(gloo\\) or 'cuda' \\(NCCL\\)"):
        ElasticPool(TASK, steps=3, device="tpu")


@pytest.mark.gpu
def test_on_gpus_with_nccl_a_join_keeps_the_update_of_the_core_only_run():
    import torch

    if not torch.cuda.is_available() or torch.cuda.device_count() < 3:
        pytest.skip("needs 3 GPUs: two core ranks and a hybrid, one GPU each")
    task = RegressionTask(global_batch=48, dtype="float64")
    _, result = run(task, hybrids=1, min_step_s=0.05, schedule={0: 1, 20: 0}, device="cuda")
    assert kinds(result)[:3] == ["join_requested", "snapshot_loaded", "activated"]
    _, reference = run(task, hybrids=0)  # on CPU with gloo
    assert_close(result, reference, atol=1e-9)


@pytest.mark.gpu
def test_on_one_gpu_a_core_rank_with_nccl_matches_the_gloo_run():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    task = RegressionTask(global_batch=48, dtype="float64")
    results = [ElasticPool(task, steps=STEPS, core_ranks=1, hybrids=0, device=device, group_timeout_s=3.0).start().wait(300)
               for device in ("cuda", "cpu")]
    assert [s["replicas"] for s in results[0].steps] == [1] * STEPS
    assert_close(*results, atol=1e-9)
