"""Renamed flags, config keys and flow parameters keep working: each old name does what the new one
does and prints exactly one line on stderr naming the new one."""

import json
from pathlib import Path

from cli.main import main

ROOT = Path(__file__).resolve().parents[2]
TAU = ROOT / "data" / "traces" / "taubench_airline.csv"


def deprecation_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if "is deprecated" in line]


def test_eval_router_policies_flag_is_routers(capsys) -> None:
    argv = ["eval-router", "--trace", str(TAU), "--buckets", "2000,4000", "--json"]
    assert main([*argv, "--routers", "libra,cmlfq"]) == 0
    new, _ = capsys.readouterr()
    assert main([*argv, "--policies", "libra,cmlfq"]) == 0
    old, err = capsys.readouterr()
    assert deprecation_lines(err) == ["libra: --policies is deprecated; use --routers"]
    assert list(json.loads(old)["policies"]) == list(json.loads(new)["policies"]) == ["libra", "cmlfq"]


def test_eval_router_flow_policies_parameter_is_routers(capsys) -> None:
    from flows.routing import eval_router_flow

    report = eval_router_flow(str(TAU), buckets="2000,4000", policies="cmlfq", prompts_per_step=4)
    assert deprecation_lines(capsys.readouterr().err) == ["libra: policies is deprecated; use routers"]
    assert list(report["policies"]) == ["cmlfq"]


def test_simulate_policies_flag_is_systems(capsys, tmp_path: Path) -> None:
    argv = ["simulate", "--workload", "search-r1", "--cluster", "2x8:a800", "--model", "qwen3-8b", "--steps", "2",
            "--group-size", "2", "--prompts-per-step", "4", "--no-track", "--store", str(tmp_path / "store"), "--json"]
    assert main([*argv, "--policies", "static-uniform,libra"]) == 0
    out, err = capsys.readouterr()
    assert deprecation_lines(err) == ["libra: --policies is deprecated; use --systems"]
    assert list(json.loads(out)["policies"]) == ["static-uniform", "libra"]


def test_simulate_flow_policies_parameter_is_systems(capsys, tmp_path: Path) -> None:
    from flows.simulate import simulate_flow

    summary = simulate_flow("search-r1", cluster="2x8:a800", model="qwen3-8b", steps=2, policies="libra",
                            group_size=2, prompts_per_step=4, track=False, store=str(tmp_path / "store"))
    assert deprecation_lines(capsys.readouterr().err) == ["libra: policies is deprecated; use systems"]
    assert list(summary["policies"]) == ["libra"]


def test_placement_policy_key_is_strategy(capsys, tmp_path: Path) -> None:
    import pytest

    from libra.config import LibraConfig
    from libra.config_loading import load_config
    from libra.errors import ConfigError

    path = tmp_path / "old.yaml"
    path.write_text("placement:\n  policy: colocated\n")
    assert load_config(path).placement.strategy == "colocated"
    assert deprecation_lines(capsys.readouterr().err) == ["libra: placement.policy is deprecated; use placement.strategy"]
    assert load_config(overrides={"placement.policy": "static"}).placement.strategy == "static"
    assert deprecation_lines(capsys.readouterr().err) == ["libra: placement.policy is deprecated; use placement.strategy"]
    assert LibraConfig.model_validate({"placement": {"policy": "libra"}}).placement.strategy == "libra"
    assert deprecation_lines(capsys.readouterr().err) == ["libra: placement.policy is deprecated; use placement.strategy"]
    with pytest.raises(ConfigError, match="placement.policy is the old name of placement.strategy"):
        load_config(overrides={"placement.policy": "static", "placement.strategy": "libra"})


def test_train_policy_flag_is_placement(capsys) -> None:
    from cli.main import build_parser

    assert build_parser().parse_args(["train", "--placement", "static"]).placement == "static"
    assert deprecation_lines(capsys.readouterr().err) == []
    assert build_parser().parse_args(["train", "--policy", "static"]).placement == "static"
    assert deprecation_lines(capsys.readouterr().err) == ["libra: --policy is deprecated; use --placement"]
    assert build_parser().parse_args(["train"]).placement is None


def test_train_flow_policy_parameter_is_placement(capsys, tmp_path: Path) -> None:
    import pytest

    from flows.train import train_flow
    from libra.config import LibraConfig
    from libra.errors import LibraError

    config = LibraConfig.model_validate({"trainer": {"policy": str(tmp_path / "missing")},
                                         "store": {"root": str(tmp_path / "store")}})
    with pytest.raises(LibraError, match="no policy in"):  # refused after the parameter is read
        train_flow(config, policy="static")
    assert deprecation_lines(capsys.readouterr().err) == ["libra: policy is deprecated; use placement"]
