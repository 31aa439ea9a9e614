"""One RL iteration as a Prefect flow: rollout -> reward -> update -> sync -> (evaluate) ->
checkpoint -> record.

With the one-step-off pipeline the rollout and reward of the next iteration run beside this
iteration's update (from the weights this iteration started from), so the next batch is 1 update
stale when it is trained on; the weights are synced into the engines once both are done. An
iteration whose batch is not rolled out yet (the first one, or every one when synchronous) rolls
it out first. The asynchronous pipeline is one-step-off whose rollout goes on generating until this
iteration's update is done (partial rollouts carry what is unfinished to the next batch).
"""

from __future__ import annotations

from typing import Any

from prefect import flow

from libra.clock import Stopwatch
from libra.rl.schedule import evaluate_after, rolled_ahead
from tasks.run_context import RunContext
from tasks.train_tasks import (
    checkpoint_task,
    evaluate_task,
    record_task,
    reward_tasks,
    rollout_task,
    sync_task,
    update_task,
)


@flow(name="rl-iteration", log_prints=False)
def rl_iteration_flow(context: RunContext, step: int, steps: int, env: str, pipeline: str, eval_every: int, rolled_out: bool,
                      mlflow_run_id: str) -> dict[str, Any]:
    clock = context.session.clock  # every stage's time on the session's clock, the rollout's and update's included
    iteration = Stopwatch(clock)
    reward = reward_tasks[env]
    seconds = {"rollout": 0.0, "reward": 0.0}
    if not rolled_out:
        seconds["rollout"] = rollout_task(context, step)
        watch = Stopwatch(clock)
        reward(context, step)
        seconds["reward"] = watch.seconds()
    ahead = rolled_ahead(pipeline, step, steps)
    if ahead is not None:
        rolling = rollout_task.submit(context, ahead, step if pipeline == "async" else None)
        scored = reward.submit(context, ahead, wait_for=[rolling])
    update = update_task(context, step)
    seconds["train"] = update.stats.seconds
    if ahead is not None:
        seconds["ahead_rollout"] = rolling.result()
        scored.result()
    seconds["overlap_wait"] = iteration.seconds() - seconds["rollout"] - seconds["reward"] - seconds["train"]
    seconds["sync"] = sync_task(context)
    heldout = None
    if evaluate_after(step + 1, steps, eval_every):
        watch = Stopwatch(clock)
        heldout = evaluate_task(context)
        seconds["evaluate"] = watch.seconds()
    seconds["iteration"] = iteration.seconds()
    checkpoint = checkpoint_task(context, step, update, seconds, heldout, mlflow_run_id)
    record_task(context, mlflow_run_id)
    return {"step": step, "checkpoint": checkpoint, "heldout": heldout}
