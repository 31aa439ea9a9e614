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
