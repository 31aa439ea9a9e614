"""A flow's parameters are checked by one function for the command line and for a deployment run;
each names a wrong parameter as its caller spells it."""

import pytest

from flows.cluster_plan import plan_request
from flows.pool import pool_request
from flows.rollout import rollout_request
from flows.simulate import simulation_request
from libra.checks import as_flag
from libra.errors import LibraError


@pytest.mark.parametrize("call, parameter, flag", [
    (lambda names: simulation_request("search-r1", steps=0, names=names), "steps must be >= 1, got 0",
     "--steps must be >= 1, got 0"),
    (lambda names: simulation_request("search-r1", group_size=10**6, names=names), "group_size must be <= 4,096",
     "--group-size must be <= 4,096"),
    (lambda names: rollout_request("math", prompts=-1, names=names), "prompts must be >= 1", "--prompts must be >= 1"),
    (lambda names: pool_request(pace=float("nan"), names=names), "pace must be a finite number",
     "--pace must be a finite number"),
    (lambda names: pool_request(kill=["hybrid-9@3"], names=names), "kill 'hybrid-9@3': expected HYBRID@STEP",
     "--kill 'hybrid-9@3': expected HYBRID@STEP"),
    (lambda names: plan_request("6x8:a800", "qwen3-14b", trace="t.csv", calibrate=True, names=names),
     "calibrate needs run", "--calibrate needs --run"),
])
def test_a_wrong_parameter_is_named_as_its_caller_spells_it(call, parameter, flag) -> None:
    with pytest.raises(LibraError) as deployed:
        call(lambda name: name)
    assert str(deployed.value).startswith(parameter)
    with pytest.raises(LibraError) as typed:
        call(as_flag)
    assert str(typed.value).startswith(flag)


def test_a_request_fills_in_what_it_leaves_open() -> None:
    request = simulation_request("search-r1", systems="libra, oracle,libra", seed=3)
    assert request.systems == ("libra", "oracle") and request.run == "sim-search-r1-3"
    pool = pool_request(steps=5, schedule="1:all", kill=["hybrid-0@2"])
    assert (pool.core, pool.hybrids, pool.schedule, pool.kills) == (2, 2, ((1, 2),), (("hybrid-0", 2),))
