"""Builders for test inputs: small per-turn traces written as CSV files."""

from __future__ import annotations

import csv
from pathlib import Path

HEADER = [
    "source", "prompt_id", "sample_id", "turn_idx", "gen_tokens", "tool_name",
    "tool_payload_tokens", "tool_status", "prompt_tokens", "final_reward", "gen_tokens_method",
]


def trace_rows(prompt_id: str, sample_id: str, prompt_tokens: int, turns: list[tuple[int, str, int, str]],
               reward: float | None = 1.0, source: str = "test") -> list[dict[str, str]]:
    """Rows of one trajectory; `turns` is [(gen_tokens, tool_name, payload_tokens, status), ...]
    and the last entry should be (gen_tokens, "none", 0, "")."""
    rows = []
    for i, (gen, tool, payload, status) in enumerate(turns):
        rows.append({
            "source": source, "prompt_id": prompt_id, "sample_id": sample_id, "turn_idx": str(i),
            "gen_tokens": str(gen), "tool_name": tool, "tool_payload_tokens": str(payload),
            "tool_status": status, "prompt_tokens": str(prompt_tokens) if i == 0 else "",
            "final_reward": "" if reward is None else str(reward), "gen_tokens_method": "api_usage",
        })
    return rows


def write_trace(path: Path, rows: list[dict[str, str]], header: list[str] = HEADER) -> Path:
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=header, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    return path


def small_trace(path: Path) -> Path:
    """Three trajectories over two prompts:
    p1/a: prompt 10, turns (5, search 20 ok), (7, search 3000 error), (4 final) -> total 3046
    p1/b: prompt 10, turns (6 final)                                           -> total 16
    p2/a: prompt 20, turns (8, python 600 ok), (2 final), reward 0             -> total 630
    """
    rows = (
        trace_rows("p1", "a", 10, [(5, "search", 20, "ok"), (7, "search", 3000, "error"), (4, "none", 0, "")])
        + trace_rows("p1", "b", 10, [(6, "none", 0, "")])
        + trace_rows("p2", "a", 20, [(8, "python", 600, "ok"), (2, "none", 0, "")], reward=0.0)
    )
    return write_trace(path, rows)


def local_config(tmp_path: Path, extra: str = "") -> Path:
    """A config file that keeps a test's store, MLflow artifacts and Prefect home under `tmp_path`
    (plus `extra` YAML lines)."""
    config = tmp_path / "c.yaml"
    config.write_text(f"store: {{root: {tmp_path / 'store'}, fsync: false}}\n"
                      f"tracking: {{artifact_root: {tmp_path / 'art'}}}\n"
                      f"orchestration: {{prefect_home: {tmp_path / 'prefect'}}}\n" + extra)
    return config


def write_placed_run(root: Path, run: str, steps: int = 12, turns_per_step: int = 480, seed: int = 0) -> None:
    """A run shaped as a placed, routed training writes it (through the store's writer, one commit
    per step): routed turns and their trajectories (rewards 0/1), a steps row per step (the split
    moves from 2/2 to 1/3 workers with a hybrid at step 6), the plans behind it (one not applied),
    and pool events: a hybrid joining and leaving each step from 6 on, one join rolled back, an
    engine restart."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from storage.synthetic import synthetic_turns, trajectories_of
    from storage.writer import StoreWriter

    writer = StoreWriter(root, fsync=False)
    for step in range(steps):
        turns = synthetic_turns(run, step, turns_per_step, turns_per_trajectory=8, seed=seed, routed=2)
        trajectories = trajectories_of(turns)
        n = trajectories.num_rows
        rewards = pa.array([float(i % 4 < 1 + step // 4) for i in range(n)])  # 0.25, 0.5, 0.75 by thirds
        trajectories = trajectories.set_column(trajectories.schema.get_field_index("reward"), "reward", rewards)
        categories = pa.array([{f"s{step}-p0": "tank", f"s{step}-p1": "pages"}.get(p) for p in
                               trajectories.column("prompt_id").to_pylist()], pa.string())  # the rest: none
        trajectories = trajectories.set_column(trajectories.schema.get_field_index("category"), "category", categories)
        moved = step >= 6
        row = {"run": run, "step": step, "policy": "libra", "plan_id": "p1" if moved else "p0", "start_s": 20.0 * step,
               "rollout_s": 12.0 + step, "train_s": 6.0, "step_s": 14.0 + step / 2, "trajectories": n,
               "gen_tokens": pc.sum(trajectories.column("gen_tokens")).as_py(), "trained_tokens": 4000 + 10 * step,
               "reward_mean": pc.mean(rewards).as_py(), "reward_std": 0.47, "train_gpus": 1 if moved else 2,
               "rollout_gpus": 3 if moved else 2, "hybrid_gpus": 1 if moved else 0,
               "offpolicy_share": 1.0 if step else 0.0, "version_gap_mean": 1.0 + 0.25 * (step % 2) if step else 0.0,
               "version_gap_max": 1 + step % 2 if step else 0, "suspended": 4, "resumed": 4 if step else 0,
               "stale_dropped": 2 * (step % 3 == 2)}
        with writer.transaction(run, mode="replace" if step == 0 else "update", origin="train") as tx:
            tx.write_step("turns", step, turns)
            tx.write_step("trajectories", step, trajectories)
            tx.write_step("steps", step, pa.Table.from_pylist([row]))
            plans = {0: ("p0", True, "initial plan", 2, 2, 0), 3: ("p-3", False, "gain 2% below threshold 5%", 1, 3, 0),
                     6: ("p1", True, "pressure: rollout 1.6x training", 1, 3, 1)}
            if step in plans:
                pid, applied, reason, train, rollout, hybrid = plans[step]
                tx.write_step("plans", step, pa.Table.from_pylist([{
                    "run": run, "step": step, "plan_id": pid, "applied": applied, "reason": reason, "train_gpus": train,
                    "rollout_gpus": rollout, "hybrid_gpus": hybrid, "train_tp": 1, "train_pp": 1, "train_dp": train,
                    "t_iter_s": 14.0, "switch_cost_s": 3.5}]))
            t = 20.0 * step
            events = [("engine-0", "serving", "serving", "engines_restarted", "")] if step == 6 else []
            if moved:
                rolled = step == 9
                events += [("hybrid-0", "rollout", "joining", "join_requested", "left the rollout's tail"),
                           ("hybrid-0", "joining", "joining", "snapshot_fetched", "12 MB"),
                           ("hybrid-0", "joining", "rollout", "rolled_back", "snapshot stale")] if rolled else [
                           ("hybrid-0", "rollout", "joining", "join_requested", "left the rollout's tail"),
                           ("hybrid-0", "joining", "training", "activated", "snapshot fetched"),
                           ("hybrid-0", "training", "leaving", "leave_requested", "step done"),
                           ("hybrid-0", "leaving", "rollout", "released", "")]
            if events:
                tx.write_step("pool_events", step, pa.Table.from_pylist([
                    {"run": run, "step": step, "time_s": t + 8.0 + 1.5 * i, "worker_id": w, "gpus": 1, "from_state": a,
                     "to_state": b, "event": e, "detail": d} for i, (w, a, b, e, d) in enumerate(events)]))


def write_simulated_run(root: Path, run: str, steps: int = 12, systems: str = "libra,verl-colocated",
                        cluster: str = "2x8:a800") -> None:
    """A simulation's store rows (steps, plans, pool events of each simulated system), from the simulator itself."""
    from flows.simulate import simulation_request
    from libra.config import PlannerConfig, StoreConfig
    from libra.planner.planner import PlannerSettings
    from libra.sim.runner import draw, simulate_system
    from tasks.sim_records import record_store
    from tasks.sim_tasks import request_cost

    planner = PlannerConfig()
    request = simulation_request("search-r1", cluster, steps=steps, systems=systems, run=run)
    cost = request_cost(request, planner)
    drawn = draw(request.spec(), cost, request.steps, request.seed)
    runs = {p: simulate_system(p, drawn, PlannerSettings.of(planner), planner) for p in request.systems}
    record_store(runs, run, StoreConfig(root=str(root), fsync=False))
