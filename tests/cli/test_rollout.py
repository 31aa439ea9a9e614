import json
from pathlib import Path

import pytest

from cli.main import main
from storage.catalog import Catalog
from tests.builders import local_config as config_file
from tests.libra.rollout.conftest import policy_dir  # noqa: F401 - the session fixture


def test_rollout_json_and_store(tmp_path: Path, capsys, policy_dir) -> None:  # noqa: F811
    code = main(["rollout", "--env", "math", "--prompts", "4", "--samples", "2", "--batches", "2", "--engine", "hf",
                 "--instances", "2", "--router", "cmlfq", "--policy", str(policy_dir), "--run", "r1", "--no-track",
                 "--config", str(config_file(tmp_path)), "--json"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert {"trajectories", "generated_tokens", "tokens_per_s", "solved_fraction", "migrations", "run"} <= set(out)
    assert (out["trajectories"], out["run"], out["instances"]) == (16, "r1", 2)
    with Catalog(tmp_path / "store", "r1") as catalog:
        turns = catalog.query("select step, count(*) as n, sum(gen_tokens) as tokens, count(distinct instance) as "
                              "instances from turns group by step order by step").to_pylist()
        assert [t["step"] for t in turns] == [0, 1] and sum(t["tokens"] for t in turns) == out["generated_tokens"]
        contexts = catalog.query("select sum(context_tokens) as n from turns").to_pylist()[0]["n"]
        assert out["context_tokens"] == out["prefill_tokens"] == contexts  # transformers caches no prefix
        trajectories = catalog.query("select count(*) as n from trajectories").to_pylist()[0]["n"]
        assert trajectories == 16


def test_the_rollout_command_holds_trajectories_to_the_configs_time_limits(tmp_path: Path, capsys,
                                                                         policy_dir) -> None:  # noqa: F811
    """`libra rollout` had ignored rollout.trajectory_timeout_s and rollout.tool_timeout_s."""
    config = config_file(tmp_path, "rollout: {trajectory_timeout_s: 0.001}\n")
    assert main(["rollout", "--env", "math", "--prompts", "2", "--samples", "2", "--engine", "hf", "--policy",
                 str(policy_dir), "--no-track", "--config", str(config), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["trajectories"], out["failed_trajectories"]) == (4, 4)


@pytest.mark.parametrize("args, message", [
    (["--env", "chess"], "unknown environment 'chess'; environments: search, math, repo"),
    (["--env", "math", "--router", "oracle"], "--router: unknown router 'oracle'; routers: libra, libra-tree"),
    (["--env", "math", "--samples", "0"], "--samples must be >= 1"),
    (["--env", "math", "--policy", "nowhere"], "--policy: no policy in nowhere; build one with `libra policy init --out "
                                               "nowhere`, or give a directory with an HF-format checkpoint"),
])
def test_bad_arguments(tmp_path: Path, capsys, args, message) -> None:
    assert main(["rollout", "--no-track", "--config", str(config_file(tmp_path)), *args]) == 2
    assert message in capsys.readouterr().err


def test_a_context_longer_than_the_policys_positions_is_refused_before_engines_start(tmp_path: Path, capsys,
                                                                                    policy_dir) -> None:  # noqa: F811
    """Training refused it; the rollout command started vLLM, which failed with a 226-line traceback."""
    config = config_file(tmp_path, "rollout: {max_context: 10000000}\n")
    assert main(["rollout", "--env", "math", "--no-track", "--config", str(config), "--policy", str(policy_dir)]) == 2
    assert capsys.readouterr().err.startswith("libra: error: rollout.max_context 10000000 is more than the policy's ")


def test_a_file_given_as_the_policy_is_named_a_file(tmp_path: Path, capsys) -> None:
    notes = tmp_path / "notes.txt"  # the message had said to run `libra policy init --out notes.txt`
    notes.write_text("mine")
    assert main(["rollout", "--no-track", "--config", str(config_file(tmp_path)), "--env", "math", "--policy",
                 str(notes)]) == 2
    assert capsys.readouterr().err == (f"libra: error: --policy {notes} is a file, not a policy directory; give a directory "
                                       "with an HF-format checkpoint (config.json and its weights), such as `libra policy "
                                       "init --out DIR` makes\n")
    assert notes.read_text() == "mine"


def test_more_gpu_instances_than_gpus(tmp_path: Path, capsys, policy_dir) -> None:  # noqa: F811
    from libra.devices import gpu_count

    count = gpu_count()
    assert main(["rollout", "--no-track", "--config", str(config_file(tmp_path)), "--env", "math", "--engine", "hf",
                 "--device", "cuda", "--instances", str(count + 1), "--policy", str(policy_dir)]) == 2
    have = "torch sees no GPU here" if count == 0 else f"this machine has {count} GPU(s) torch can use"
    assert (f"--device cuda with {count + 1} instance(s): {have}; use fewer --instances or --device cpu"
            in capsys.readouterr().err)


def test_policy_init_builds_and_then_reuses(tmp_path: Path, capsys) -> None:
    out = tmp_path / "p"
    assert main(["policy", "init", "--out", str(out), "--steps", "3", "--demos", "16"]) == 0
    assert (out / "config.json").exists() and (out / "tokenizer.json").exists()
    first = capsys.readouterr().out
    assert main(["policy", "init", "--out", str(out), "--steps", "3", "--demos", "16"]) == 0
    assert "is up to date" in capsys.readouterr().out and "demonstrations" in first


@pytest.mark.parametrize("args, message", [
    (["--env", "chess"], "unknown environment 'chess'; environments: search, math, repo"),
    (["--demos", "0"], "--demos must be >= 1"),
    (["--demos", "10", "--batch", "64"], "10 demonstrations in batches of 64; give at least 64 demonstrations"),
    (["--lr", "nan"], "--lr must be a finite number"),
    (["--held-out", "-1"], "--held-out must be >= 0"),
    (["--base", "nowhere"], "the policy to tune: no policy in nowhere; build one with `libra policy init --out nowhere`"),
])
def test_policy_tune_bad_arguments(tmp_path: Path, capsys, args, message) -> None:
    assert main(["policy", "tune", "--out", str(tmp_path / "t"), *args]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
    assert not (tmp_path / "t").exists()


def test_policy_tune_with_the_defaults_copies_the_shipped_tuning(tmp_path: Path, capsys, policy_dir) -> None:  # noqa: F811
    from libra.rollout.policy import SHIPPED_TUNED

    assert main(["policy", "tune", "--base", str(policy_dir), "--out", str(tmp_path / "m")]) == 0
    out = capsys.readouterr().out
    assert f"policy in {tmp_path / 'm'}: {policy_dir} after 4800 math demonstrations in 75 updates" in out
    for name in ("model.safetensors", "libra_policy.json", "tokenizer.json"):
        assert (tmp_path / "m" / name).read_bytes() == (SHIPPED_TUNED["math"] / name).read_bytes()
