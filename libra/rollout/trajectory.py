"""A trajectory while the agent loop runs it (`TrajectoryRun`): its tokens with the engine's
log-probs and the weights version of each, its turns (`TurnRecord`), an interrupted turn's tokens
(`PartialTurn`, partial rollouts), its reward and how it ended. `libra.rollout.agent` drives it;
`libra.rollout.suspend` keeps it across batches; `record()` is what the rest of Libra takes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from libra.rollout.envs import Task
from libra.types import ToolStatus, Trajectory, Turn


@dataclass(frozen=True)
class PartialTurn:
    """The tokens an interrupted turn generated before its batch closed, each with the engine's
    log-probability and the weights version that generated it."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    versions: tuple[int, ...]
    seconds: float  # generation time so far


@dataclass
class TurnRecord:
    turn_idx: int
    context_tokens: int
    gen_tokens: int
    tool_name: str  # "none" on the final turn
    tool_payload_tokens: int
    tool_status: str  # ok | error | timeout | none
    instance: int
    bucket: int
    migrated: bool
    gen_latency_s: float
    tool_latency_s: float
    finish: str  # stop | length
    model_version: int = -1  # the weights that generated its first token (-1: the trajectory's)


@dataclass
class TrajectoryRun:
    trajectory_id: str
    prompt_id: str
    sample_id: str
    task: Task
    prompt_tokens: int
    ids: list[int]  # prompt, then each turn's generated tokens and the tool output after them
    instance: int
    bucket: int
    workdir: Path
    episode: object = None
    mask: list[int] = field(default_factory=list)  # 1 on the tokens the policy generated
    logprobs: list[float] = field(default_factory=list)  # the engine's log p of each token (0.0 off the mask)
    model_version: int = 0  # the weights that generated it
    turns: list[TurnRecord] = field(default_factory=list)
    reward: float = 0.0
    answer: str | None = None
    done: bool = False
    migrated_tokens: int = 0
    started: float = 0.0
    finished: float = 0.0
    failure: str = ""  # why it failed (its environment or tool failed, or it ran past a limit); '' if it did not
    retried: bool = False  # its turn was lost with a failed engine once and ran again on another
    versions: list[int] = field(default_factory=list)  # the weights version of each token (-1 off the mask)
    partial: PartialTurn | None = None  # an interrupted turn's tokens so far (partial rollouts)
    suspended: bool = False  # interrupted when its batch closed; continued by a later rollout
    suspensions: int = 0  # times it was suspended
    new_tokens: int = 0  # tokens it generated in this rollout (a resumed one generated others before)

    @property
    def failed(self) -> bool:
        return bool(self.failure)

    @property
    def partial_ids(self) -> tuple[int, ...]:
        """The interrupted turn's tokens so far (none when no turn was interrupted)."""
        return self.partial.token_ids if self.partial is not None else ()

    @property
    def generated_tokens(self) -> int:
        return sum(t.gen_tokens for t in self.turns)

    def record(self) -> Trajectory:
        """The finished trajectory as every other part of Libra takes it (the store, the router's
        tree, the trainer's bookkeeping): `libra.types.Trajectory`; its `model_version` is its
        oldest token's, each turn's the version of the turn's first token."""
        turns = tuple(Turn(self.trajectory_id, self.prompt_id, self.sample_id, t.turn_idx, t.context_tokens, t.gen_tokens,
                           t.tool_name, t.tool_payload_tokens, ToolStatus(t.tool_status), str(t.instance), t.bucket,
                           t.migrated, t.gen_latency_s, t.tool_latency_s,
                           self.model_version if t.model_version < 0 else t.model_version) for t in self.turns)
        return Trajectory(self.trajectory_id, self.prompt_id, self.sample_id, self.task.env, self.prompt_tokens, turns,
                          self.reward, self.model_version, self.finished - self.started, self.category, self.outcome)

    @property
    def category(self) -> str | None:
        """Its task's kind within the environment (a math template), when the environment names one."""
        category = self.task.data.get("category")
        return None if category is None else str(category)

    @property
    def outcome(self) -> str:
        """How it ended: failed, unanswered (no answer in the expected form), solved (reward > 0) or wrong."""
        if self.failed:
            return "failed"
        if self.answer is None:
            return "unanswered"
        return "solved" if self.reward > 0 else "wrong"
