"""Builders of small trajectories for scheduler tests."""

from libra.types import NO_TOOL, ToolStatus, Trajectory, Turn


def make_trajectory(prompt_id: str, sample_id: str, prompt_tokens: int,
                    turns: list[tuple[int, str, int, str]]) -> Trajectory:
    """`turns` = [(gen_tokens, tool, payload_tokens, status), ...]; the last is (gen, "none", 0, "")."""
    tid = f"{prompt_id}/{sample_id}"
    built = []
    context = prompt_tokens
    for i, (gen, tool, payload, status) in enumerate(turns):
        tool_status = ToolStatus.NONE if tool == NO_TOOL else ToolStatus(status)
        built.append(Turn(tid, prompt_id, sample_id, i, context, gen, tool, payload, tool_status))
        context += gen + payload
    return Trajectory(tid, prompt_id, sample_id, "test", prompt_tokens, tuple(built), None)
