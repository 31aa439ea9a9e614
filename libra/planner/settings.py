"""From the validated `PlannerConfig` to the planner's own settings records (one place)."""

from __future__ import annotations

from libra.config import PlannerConfig
from libra.planner.cost_model import CostModel, RolloutSettings, TrainingSettings
from libra.planner.planner import PlannerSettings
from libra.planner.profiles import Cluster, ModelProfile
from libra.planner.trigger import TriggerSettings


def planner_settings(config: PlannerConfig) -> PlannerSettings:
    return PlannerSettings(
        mode=config.mode,
        max_hybrid_fraction=config.max_hybrid_fraction,
        hybrid_shares=config.hybrid_shares,
        hybrid_switch_s=config.hybrid_switch_s,
        granularity=config.granularity or None,
    )


def trigger_settings(config: PlannerConfig) -> TriggerSettings:
    return TriggerSettings(
        period_steps=config.period_steps,
        warmup_steps=config.warmup_steps,
        pressure_ratio=config.pressure_ratio,
        min_relative_gain=config.min_relative_gain,
        switch_base_s=config.switch_base_s,
        engine_start_s=config.engine_start_s,
    )


def cost_model(cluster: Cluster, model: ModelProfile, config: PlannerConfig) -> CostModel:
    return CostModel(
        cluster,
        model,
        training=TrainingSettings(zero_stage=config.zero_stage, recompute=config.recompute,
                                  logprob_passes=config.logprob_passes),
        rollout=RolloutSettings(memory_utilization=config.memory_utilization, max_batch=config.max_batch,
                                max_context_tokens=config.max_context_tokens),
    )
