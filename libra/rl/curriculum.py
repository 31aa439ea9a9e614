"""The training tasks' curriculum (`trainer.curriculum`): more of an iteration's prompts from the
task categories whose groups carry a gradient.

A GRPO group whose samples' rewards are all equal (every sample solved, or none) has advantage 0 on
every token: it costs its rollout and teaches nothing. How often that happens differs by category
(the math templates: the policy solves some nearly always or nearly never, others half the time),
so drawing categories uniformly spends most of a step on groups without gradient. A category's
*informative rate* is the share of its groups whose rewards differed, estimated as

    (informative + 1) / (groups + 2)

over counts that decay by `decay` each iteration (recent iterations count most: the policy moves).
The prior (one informative group in two) makes a category not seen for a while worth trying again,
and keeps every category's share above zero: one that has never informed in n recent groups is
still drawn at 1 / (n + 1) of the rate of a certain one, so a category the policy starts to
learn is found again. An iteration's prompts are drawn category by category in proportion to the
rates, from the iteration's own stream of fresh tasks (`schedule.training_tasks`), so the tasks are
a function of the run's seed, the step and the counts alone, and a resumed run draws the same.

The counts are kept in the run's checkpoint (`CheckpointState.summary["curriculum"]`) and advanced
with each iteration's record (`records.advanced`); an iteration's rollout draws from the counts of
the iterations checkpointed before it starts.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from libra.rollout.envs import Task

Counts = Mapping[str, Sequence[float]]  # category -> [groups, informative groups], decayed
POOL = 8  # fresh tasks an iteration's draw chooses from, per prompt it needs


def remembered(counts: Counts, step: Sequence[tuple[str, int, int]], decay: float) -> dict[str, list[float]]:
    """The counts after an iteration whose groups were `step` ((category, groups, informative
    groups) each): the earlier counts times `decay`, plus the iteration's."""
    out = {category: [groups * decay, informative * decay] for category, (groups, informative) in counts.items()}
    for category, groups, informative in step:
        held = out.setdefault(category, [0.0, 0.0])
        held[0] += groups
        held[1] += informative
    return out


def informative_rate(counts: Counts, category: str) -> float:
    """(informative + 1) / (groups + 2): the estimated share of `category`'s groups that carry a gradient."""
    groups, informative = counts.get(category, (0.0, 0.0))
    return (informative + 1.0) / (groups + 2.0)


def curriculum_tasks(candidates: Sequence[Task], count: int, counts: Counts, rng: random.Random) -> list[Task]:
    """`count` of `candidates` (tasks whose `data["category"]` is set, in the iteration's order):
    each prompt's category drawn in proportion to its informative rate among the categories with
    candidates left, then that category's next candidate."""
    by_category: dict[str, list[Task]] = {}
    for task in candidates:
        by_category.setdefault(str(task.data["category"]), []).append(task)
    if count > len(candidates):
        raise ValueError(f"{count} tasks wanted from {len(candidates)} candidates")
    left = {category: list(reversed(tasks)) for category, tasks in by_category.items()}  # next one at the end
    chosen = []
    for _ in range(count):
        open_ = [category for category in by_category if left[category]]  # first-seen order: deterministic
        category = rng.choices(open_, weights=[informative_rate(counts, c) for c in open_])[0]
        chosen.append(left[category].pop())
    return chosen
