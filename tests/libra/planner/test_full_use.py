"""Every GPU a plan counts is used: the training configuration uses all of the training pool (what
a faster configuration on fewer GPUs leaves goes to rollout), and the rollout layout all of the
rollout pool (GPUs fewer than any group's TP open a group of their own, or go to training where it
can use them at no loss). What neither pool could use would be reported as idle, in neither pool."""

import math

import pytest

from libra.planner.cost_model import CostModel
from libra.planner.planner import Planner
from libra.planner.profiles import MODELS, parse_cluster
from tests.libra.planner.builders import trace_workload


@pytest.mark.parametrize(("scale", "trainable"), [(0.25, 46), (0.5, 44), (1.0, 42)])
def test_no_plan_leaves_a_counted_gpu_idle(scale: float, trainable: int) -> None:
    workload = trace_workload("swe_gemini3_mini_A", scale=scale)
    planned = 0
    for model in ("qwen3-8b", "qwen3-14b", "qwen3-32b"):
        for nodes in (1, 2, 3, 4, 6, 8, 16, 32):
            for hardware in ("a800", "h100"):
                plan = Planner(CostModel(parse_cluster(f"{nodes}x8:{hardware}"), MODELS[model]), workload).plan()
                if plan.train is None or math.isinf(plan.t_iter_s):
                    continue
                planned += 1
                assert plan.train.config.gpus == plan.train_gpus, (model, nodes, hardware, plan.train.config)
                assert plan.rollout.gpus == plan.rollout_gpus, (model, nodes, hardware, plan.rollout.instance_counts)
                assert plan.train_gpus + plan.rollout_gpus + plan.hybrid_gpus == nodes * 8 and plan.idle_gpus == 0
    assert planned == trainable  # of the 48 clusters, those that can train the model at all


def test_the_split_that_counted_two_idle_training_gpus_now_rolls_out_on_them() -> None:
    """16x8 A800, Qwen3-14B, the SWE trace: the best training configuration on 56 GPUs was TP2 x DP27
    (54 GPUs, faster than any on all 56); the two left over roll out."""
    plan = Planner(CostModel(parse_cluster("16x8:a800"), MODELS["qwen3-14b"]), trace_workload("swe_gemini3_mini_A")).plan()
    assert (plan.train_gpus, plan.train.config.tp, plan.train.config.dp, plan.rollout_gpus) == (54, 2, 27, 74)
    assert plan.rollout.gpus == 74
