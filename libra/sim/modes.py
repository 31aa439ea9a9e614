"""How a simulated run feeds its rollouts: synchronous batches, partial rollouts, or the asynchronous
mode, as the live loop's `rollout.partial` and `trainer.pipeline: async` run them.

    sync     step k rolls out batch k whole; its rollout ends with its last trajectory
    partial  step k keeps `overprovision` x the batch's groups in flight (the suspended ones it
             continues plus new ones from the same stream of batches), closes the batch at the
             `needed`-th complete group and suspends the rest (`rollout.Progress`); the batch is
             the first `needed` groups to complete
    async    partial, and the rollout goes on until the update beside it is done (one-step-off
             whose rollout never waits); groups completed beyond the batch are carried whole to the
             next one

Versions follow the live loop (`libra.partial`): the batch closed in step k is trained by the
update that starts from version k (colocated: in step k; one-step-off: in step k + 1); step k
generates with version k colocated and max(0, k - 1) one-step-off. A group whose oldest token would
be more than `max_staleness` updates old when trained is dropped whole before the rollout, and
counted with the tokens it had generated (work lost). Every trained token's gap is its trainer's
version minus its own.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from libra.checks import Names, as_parameter
from libra.errors import LibraError
from libra.partial import carry_over, groups_to_start
from libra.sim.rollout import Close, Progress, RolloutResult
from libra.sim.workloads import SimTrajectory

MODES = ("sync", "partial", "async")


def check_mode(name: str, overprovision: float, max_staleness: int, names: Names = as_parameter) -> None:
    """A LibraError for a rollout mode no run can have, naming each setting as the caller spells it."""
    if name not in MODES:
        raise LibraError(f"{names('rollout_mode')} {name!r}: use one of {', '.join(MODES)}")
    if overprovision < 1:
        raise LibraError(f"{names('overprovision')} {overprovision}: it must be at least 1 (1: no groups beyond the batch)")
    if name != "sync" and max_staleness < 1:
        raise LibraError(f"{names('max_staleness')} {max_staleness}: a {name} rollout trains groups at least one "
                         "update old; give 1 or more, or use the sync mode for on-policy training")


@dataclass(frozen=True)
class RolloutMode:
    name: str = "sync"
    overprovision: float = 1.5  # groups in flight per group the batch needs (partial and async)
    max_staleness: int = 4  # updates a trained token may be behind its trainer (partial and async)

    def __post_init__(self) -> None:
        check_mode(self.name, self.overprovision, self.max_staleness)

    @property
    def partial(self) -> bool:
        return self.name != "sync"


def samples_per_group(batch: Sequence[SimTrajectory]) -> int:
    """Samples per prompt in a batch of whole groups (1 for an empty batch)."""
    return max(1, len(batch) // max(1, len({t.prompt_id for t in batch})))


def rollout_version(colocated: bool, step: int) -> int:
    """The weights version step `step` generates with."""
    return step if colocated else max(0, step - 1)


@dataclass
class Group:
    """A GRPO group in flight: its trajectories, where the unfinished ones stopped, and the tokens
    each generated under each version."""

    prompt_id: str  # the group's key (unique in the run)
    trajectories: tuple[SimTrajectory, ...]
    progress: dict[str, Progress] = field(default_factory=dict)  # unfinished trajectories that ran before
    versions: dict[int, int] = field(default_factory=dict)  # version -> generated tokens of the group
    done_ids: set[str] = field(default_factory=set)  # trajectories that have ended
    complete: bool = False

    @property
    def oldest_version(self) -> int:
        return min(self.versions, default=1 << 30)

    @property
    def generated(self) -> int:
        return sum(self.versions.values())


@dataclass(frozen=True)
class Launch:
    """What a step rolls out."""

    trajectories: tuple[SimTrajectory, ...]
    resume: dict[str, Progress]
    close: Close | None
    dropped_groups: int = 0
    dropped_tokens: int = 0  # generated tokens of the dropped groups (work lost)
    dropped_ids: tuple[str, ...] = ()


@dataclass(frozen=True)
class Landed:
    """What a step's rollout gives the trainer: the batch (whole groups) and how off-policy it is
    once trained from version `trained_at`."""

    batch: list[SimTrajectory]
    finished: list[SimTrajectory]  # trajectories that ended in this rollout (what routers learn from)
    offpolicy_share: float
    gap_mean: float
    gap_max: int
    suspended: int  # trajectories left unfinished
    resumed: int


def token_gaps(groups: Sequence[Group], trained_at: int) -> tuple[float, float, int]:
    """(share of generated tokens older than the trainer, mean gap, max gap) over `groups`."""
    tokens = sum(g.generated for g in groups)
    if not tokens:
        return 0.0, 0.0, 0
    old = sum(n for g in groups for v, n in g.versions.items() if v < trained_at)
    gap = sum((trained_at - v) * n for g in groups for v, n in g.versions.items())
    return old / tokens, gap / tokens, max(trained_at - v for g in groups for v in g.versions)


class Feed:
    """The stream of groups a run rolls out, in one mode: what each step launches, and what its
    rollout lands for training."""

    def __init__(self, batches: Sequence[Sequence[SimTrajectory]], mode: RolloutMode) -> None:
        self.mode = mode
        self.batches = batches
        self.fresh: deque[Group] = deque()
        for k, batch in enumerate(batches):
            groups: dict[str, list[SimTrajectory]] = {}
            for t in batch:
                groups.setdefault(t.prompt_id, []).append(t)
            self.fresh.extend(Group(f"{k}:{pid}", tuple(ts)) for pid, ts in groups.items())
        # groups a batch trains: the stream's mean per batch (a trace replay's batches differ in size),
        # so that the run starts as many groups as it trains, plus what the over-provision holds
        self.needed = max(1, round(sum(len({t.prompt_id for t in b}) for b in batches) / len(batches))) if batches else 0
        self.carried: list[Group] = []  # suspended or complete, not yet trained
        self.launched: dict[str, Group] = {}
        self.version = 0

    def launch(self, step: int, colocated: bool) -> Launch:
        """Step `step`'s rollout: batch `step` (sync), or the carried groups fresh enough to be trained
        by version `step` plus new ones (partial, async)."""
        self.version = rollout_version(colocated, step)
        if not self.mode.partial:
            batch = self.batches[step]
            group = Group(f"{step}", tuple(batch))
            self.launched = {t.trajectory_id: group for t in batch}
            return Launch(tuple(batch), {}, None)
        kept = carry_over(self.carried, step, self.mode.max_staleness)
        dropped = kept.dropped
        self.carried = list(kept.resumed)
        for _ in range(groups_to_start(self.needed, self.mode.overprovision, len(self.carried))):
            if self.fresh:
                self.carried.append(self.fresh.popleft())
        running = [g for g in self.carried if not g.complete]
        trajectories = tuple(t for g in running for t in g.trajectories if t.trajectory_id not in g.done_ids)
        self.launched = {t.trajectory_id: g for g in running for t in g.trajectories}
        complete = sum(g.complete for g in self.carried)
        close = Close({t.trajectory_id: g.prompt_id for g in running for t in g.trajectories},
                      self.needed - complete)
        resume = {tid: p for g in running for tid, p in g.progress.items()}
        return Launch(trajectories, resume, close, len(dropped), sum(g.generated for g in dropped),
                      tuple(t.trajectory_id for g in dropped for t in g.trajectories))

    def land(self, step: int, result: RolloutResult, trajectories: Sequence[SimTrajectory]) -> Landed:
        """The batch step `step`'s rollout closes, trained from version `step`."""
        for tid, tokens in result.generated.items():
            group = self.launched[tid]
            group.versions[self.version] = group.versions.get(self.version, 0) + tokens
        finished = [t for t in trajectories if t.trajectory_id in result.finish_s]
        if not self.mode.partial:
            group = next(iter(self.launched.values()), None)
            groups = [group] if group is not None else []
            return Landed(list(trajectories), finished, *token_gaps(groups, step), 0, 0)
        for t in finished:
            group = self.launched[t.trajectory_id]
            group.progress.pop(t.trajectory_id, None)
            group.done_ids.add(t.trajectory_id)
        for tid, progress in result.suspended.items():
            self.launched[tid].progress[tid] = progress
        order = {key: i for i, key in enumerate(result.completed_groups)}
        for g in self.carried:
            if g.prompt_id in order:
                g.complete = True
        ready = sorted((g for g in self.carried if g.complete),
                       key=lambda g: order.get(g.prompt_id, -1))  # carried complete groups first, then by completion
        trained = ready[:self.needed]
        taken = {g.prompt_id for g in trained}
        self.carried = [g for g in self.carried if g.prompt_id not in taken]
        return Landed([t for g in trained for t in g.trajectories], finished, *token_gaps(trained, step),
                      len(result.suspended), result.resumed)

    def in_flight_tokens(self) -> int:
        """Tokens generated by the groups still carried (never trained if the run ends here)."""
        return sum(g.generated for g in self.carried)
