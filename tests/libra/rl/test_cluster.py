"""A machine's workers and where a plan puts the stages on them (pure)."""

import pytest

from libra.errors import LibraError
from libra.planner.planner import Plan
from libra.planner.rollout_search import InstanceGroup, RolloutLayout
from libra.rl.cluster import LocalCluster, Placement, initial_placement, placement_of


def plan(train: int, rollout: int, groups: list[tuple[int, int]], mode: str = "one_step_off", hybrid: int = 0) -> Plan:
    layout = RolloutLayout(tuple(InstanceGroup(tp, count, 0, 0, 100, 1.0) for tp, count in groups), 1.0)
    return Plan(None, train, layout, rollout, hybrid, 0.0, 1.0, 1.0, 0.0, 1.0, mode)


def test_workers_are_whole_groups_of_cores_and_a_remainder_is_left_out():
    cluster = LocalCluster.of_cores((7, 3, 5, 4, 6), cores_per_worker=2, memory_bytes=8e9)
    assert cluster.workers == ((3, 4), (5, 6))
    assert cluster.size == 2 and cluster.memory_bytes == 4e9
    assert cluster.units((1, 0)) == (5, 6, 3, 4)
    with pytest.raises(LibraError, match="1 core\\(s\\) make no worker of 2 cores"):
        LocalCluster.of_cores((0,), 2)
    with pytest.raises(LibraError, match="overlap"):
        LocalCluster(((0, 1), (1, 2)))


def test_the_planner_sees_one_node_of_one_device_per_worker():
    cluster = LocalCluster.of_cores(tuple(range(6)), cores_per_worker=2, memory_bytes=12e9)
    planned = cluster.planner_cluster()
    assert (planned.nodes, planned.gpus_per_node) == (1, 3)
    assert planned.hardware.peak_flops == 100e9 and planned.hardware.memory_bytes == 4e9


def test_static_and_libra_start_with_the_larger_half_rolling_out_colocated_with_every_worker():
    cluster = LocalCluster.of_cores(tuple(range(5)))
    split = initial_placement("libra", cluster)
    assert split == Placement(((0, 1, 2),), (3, 4), False) == initial_placement("static", cluster)
    assert split.pipeline == "one_step_off" and split.describe() == "split: rollout 3 (1x3) | train 2"
    together = initial_placement("colocated", cluster)
    assert together == Placement(((0, 1, 2, 3, 4),), (0, 1, 2, 3, 4), True) and together.pipeline == "sync"
    assert initial_placement("libra", LocalCluster(((0,),))).colocated  # one worker can only take turns
    with pytest.raises(LibraError, match="unknown placement strategy 'fast'"):
        initial_placement("fast", cluster)


def test_a_split_placement_gives_every_worker_to_one_stage():
    with pytest.raises(LibraError, match="one stage"):
        Placement(((0, 1),), (1, 2), False)
    with pytest.raises(LibraError, match="engines share workers"):
        Placement(((0, 1), (1,)), (2,), False)


def test_a_plan_places_its_instances_smallest_first_then_the_trainer_on_the_rest():
    cluster = LocalCluster.of_cores(tuple(range(8)))
    placed = placement_of(plan(3, 5, [(2, 2), (1, 1)]), cluster, "plan-4")
    assert placed.engines == ((0,), (1, 2), (3, 4)) and placed.train == (5, 6, 7)
    assert placed.plan_id == "plan-4" and placed.describe() == "split: rollout 5 (1x1, 2x2) | train 3"
    colocated = placement_of(plan(8, 8, [(4, 2)], mode="colocated"), cluster, "plan-9")
    assert colocated.engines == ((0, 1, 2, 3), (4, 5, 6, 7)) and colocated.train == tuple(range(8))
    assert colocated.colocated


def test_a_plans_training_configuration_is_its_placements_layout_on_the_trainers_workers():
    from dataclasses import replace

    from libra.planner.cost_model import TrainConfig, TrainEstimate
    from libra.trainer.layout import Layout

    cluster = LocalCluster.of_cores(tuple(range(8)))
    estimate = TrainEstimate(TrainConfig(2, 2, 1, 1, 4), 1.0, 1.0, 1.0, 0.0)
    placed = placement_of(replace(plan(4, 4, [(2, 2)]), train=estimate), cluster, "plan-2")
    assert placed.train == (4, 5, 6, 7) and placed.layout == Layout(tp=2, pp=2, dp=1)
    assert placement_of(plan(4, 4, [(2, 2)]), cluster, "plan-2").layout is None  # a plan without a training estimate
    with pytest.raises(LibraError, match="a training layout of 4 ranks \\(tp=1 pp=1 dp=4\\) on 2 training workers"):
        Placement(((0, 1),), (2, 3), False, layout=Layout(dp=4))


def test_a_plans_hybrids_each_run_an_engine_of_their_own_next_to_the_trainers_workers():
    cluster = LocalCluster.of_cores(tuple(range(6)))
    placed = placement_of(plan(2, 2, [(1, 2)], hybrid=2), cluster, "plan-3")
    assert placed.engines == ((0,), (1,), (2,), (3,)) and placed.train == (4, 5)
    assert placed.hybrids == (3, 2)  # hybrid 0 is the worker before the trainer's first
    assert placed.describe() == "split: rollout 4 (4x1) | train 2 + 2 hybrid"


def test_hybrids_start_on_the_rollout_workers_nearest_the_trainer_each_with_its_own_engine():
    five = LocalCluster.of_cores(tuple(range(5)))
    assert initial_placement("libra", five, hybrids=1) == Placement(((0, 1), (2,)), (3, 4), False, hybrids=(2,))
    assert initial_placement("static", five, hybrids=3) == Placement(((0,), (1,), (2,)), (3, 4), False,
                                                                     hybrids=(2, 1, 0))
    two = LocalCluster.of_cores((0, 1))
    assert initial_placement("static", two, hybrids=1) == Placement(((0,),), (1,), False, hybrids=(0,))
    with pytest.raises(LibraError, match=r"4 hybrid worker\(s\) but 3 rollout worker\(s\) on 5 workers"):
        initial_placement("libra", five, hybrids=4)
    with pytest.raises(LibraError, match="need a split placement"):
        initial_placement("colocated", five, hybrids=1)
    with pytest.raises(LibraError, match="engine of their own"):
        Placement(((0, 1),), (2,), False, hybrids=(1,))


def test_plans_the_machine_cannot_place_are_refused_with_the_reason():
    cluster = LocalCluster.of_cores(tuple(range(4)))
    with pytest.raises(LibraError, match="for 6 workers; this machine has 4"):
        placement_of(plan(2, 4, [(1, 4)]), cluster, "p")
    with pytest.raises(LibraError, match="need 4 workers, its rollout pool has 2"):
        placement_of(plan(2, 2, [(2, 2)]), cluster, "p")


# -- a cluster of hosts ------------------------------------------------------------------------------

from libra.rl.cluster import Host, cluster_of_hosts, spread_over_hosts  # noqa: E402


def two_hosts(per_host: int = 2):
    return cluster_of_hosts((Host("10.0.0.3", per_host), Host("10.0.0.2", per_host), Host("10.0.0.1", 0)))


def test_a_clusters_workers_are_its_hosts_cpus_in_address_order_and_a_head_without_cpus_has_none():
    cluster = cluster_of_hosts((Host("10.0.0.10", 5, memory_bytes=8e9), Host("10.0.0.9", 2, memory_bytes=8e9),
                                Host("10.0.0.1", 0)), cores_per_worker=2)
    assert cluster.workers == ((0, 1), (0, 1), (2, 3))  # cores of each host; 10.0.0.9 sorts before 10.0.0.10
    assert cluster.hosts == ("10.0.0.9", "10.0.0.10", "10.0.0.10")
    assert cluster.host_names == ("10.0.0.9", "10.0.0.10") and cluster.per_host == 1
    assert cluster.memory_bytes == 4e9  # the least a worker has
    assert cluster.planner_cluster().nodes == 1  # hosts of 1 and 2 workers: not alike, one node
    alike = two_hosts()
    planned = alike.planner_cluster()
    assert (planned.nodes, planned.gpus_per_node, planned.hardware.gpus_per_node) == (2, 2, 2)
    gpus = cluster_of_hosts((Host("10.0.0.2", 8, gpus=2),), device="cuda")
    assert gpus.workers == ((0,), (1,)) and gpus.device == "cuda"
    with pytest.raises(LibraError, match="offer no worker of 4 CPU"):
        cluster_of_hosts((Host("10.0.0.2", 3),), cores_per_worker=4)
    with pytest.raises(LibraError, match="2 hosts named for 1 workers"):
        LocalCluster(((0,),), hosts=("a", "b"))
    LocalCluster(((0,), (0,)), hosts=("a", "b"))  # core 0 of two hosts: no overlap


def test_on_hosts_engines_stay_on_one_host_and_the_trainers_ranks_spread():
    cluster = two_hosts()  # workers 0, 1 on 10.0.0.2; 2, 3 on 10.0.0.3
    split = initial_placement("static", cluster)
    assert split == Placement(((0,), (2,)), (1, 3), False)  # an engine and a rank on each host
    assert initial_placement("colocated", cluster) == Placement(((0,), (2,), (1,), (3,)), (0, 1, 2, 3), True)
    wide = placement_of(plan(2, 2, [(2, 1)]), cluster, "p")
    assert wide.engines == ((0, 1),) and wide.train == (2, 3)  # a TP-2 engine fills a host: the ranks take the other
    mixed = placement_of(plan(3, 3, [(1, 1), (2, 1)]), two_hosts(3), "p")  # 3 workers a host
    assert mixed.engines == ((3,), (0, 1)) and mixed.train == (2, 4, 5)  # the TP-2 engine placed first
    with pytest.raises(LibraError, match="an engine of 4 workers fits on no host"):
        placement_of(plan(0, 4, [(4, 1)], mode="colocated"), cluster, "p")
    assert spread_over_hosts(split, LocalCluster.of_cores((0, 1, 2, 3))) == split  # one machine: as it is


def test_on_hosts_a_hybrids_engine_moves_with_it():
    cluster = two_hosts(3)
    placed = initial_placement("static", cluster, hybrids=1)
    assert len(placed.engines) == 3 and len(placed.train) == 3 and len(placed.hybrids) == 1
    assert (placed.hybrids[0],) in placed.engines
    assert {cluster.host_of(w) for w in placed.train} == set(cluster.host_names)
