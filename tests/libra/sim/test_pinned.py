"""The simulator's step times pinned, per rollout mode: work that only makes the simulator faster
must leave every figure where it was. A change of behaviour moves them; the pins are then updated
with the reason in the same commit. (Compared to 1e-12 relative: another libm may round a last
bit differently, while any changed decision moves a step by far more.)"""

import pytest

from libra.planner.cost_model import CostModel
from libra.planner.profiles import MODELS, parse_cluster
from libra.sim.modes import RolloutMode
from libra.sim.runner import simulate
from libra.sim.workloads import workload_spec

SYNC = {
    "libra": [12.86855764600496, 18.828929580357176, 14.742744676453066, 23.10171499461509, 19.14981861004389],
    "static-uniform": [13.11550077468436, 19.11495747766187, 14.308413519810898, 23.43672669116062, 19.619588048460592],
}
PARTIAL = {  # the async mode's too: the rollout is the longer stage at every step, so nothing is held
    # Libra's plan for the close of a steady step (the carried groups complete first), not the first
    "libra": [10.306671677347218, 9.865759083188333, 10.427880862852266, 10.690035831697761, 10.651421128119942],
    "static-uniform": [10.50241837867893, 9.951044849425882, 10.600311872624516, 10.851284064748791, 10.873737514738412],
}


@pytest.mark.parametrize(("mode", "expected"), [("sync", SYNC), ("partial", PARTIAL), ("async", PARTIAL)])
def test_step_times_are_pinned(mode: str, expected: dict[str, list[float]]) -> None:
    cost = CostModel(parse_cluster("6x8:a800"), MODELS["qwen3-14b"])
    runs = simulate(workload_spec("search-r1", prompts_per_step=8), cost, 5, list(expected), seed=3,
                    mode=RolloutMode(mode))
    for name, times in expected.items():
        assert [s.step_s for s in runs[name].steps] == pytest.approx(times, rel=1e-12, abs=0.0), name
    assert [s.plan_reason for s in runs["libra"].steps] == ["initial", "", "", "", ""]
