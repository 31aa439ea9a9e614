"""The training run's policy: Libra's own directories are built (or copied) when missing, others
are refused with what to do."""

from pathlib import Path

from libra.config import LibraConfig
from libra.rollout.policy import SHIPPED, SHIPPED_TUNED
from tasks.run_context import RunContext
from tasks.train_tasks import default_policy, policy_missing, prepare_policy_task


def test_libras_own_policy_directories_are_the_default_and_its_tunings(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert default_policy(Path(".libra/policy")) == ()
    assert default_policy(Path(".libra/policy-math")) == ("math",)
    assert default_policy(tmp_path / ".libra" / "policy-repo") == ("repo",)
    assert default_policy(Path(".libra/policy-chess")) is None
    assert default_policy(Path("data/policy-math")) is None
    assert policy_missing(LibraConfig.model_validate({"trainer": {"policy": ".libra/policy-math"}})) is None
    assert policy_missing(LibraConfig.model_validate({"trainer": {"policy": "elsewhere"}})) == (
        "trainer.policy: no policy in elsewhere; build one with `libra policy init --out elsewhere`, or give a "
        "directory with an HF-format checkpoint")


def test_a_missing_tuned_policy_is_the_shipped_one_tuned_and_the_shipped_tuning_is_copied(tmp_path: Path,
                                                                                        monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    heard: list[tuple[int, int, float]] = []
    context = RunContext()
    context.policy_progress = lambda *step: heard.append(step)
    prepare_policy_task.fn(context, LibraConfig.model_validate({"trainer": {"policy": ".libra/policy-math"}}))
    for directory, shipped in ((".libra/policy", SHIPPED), (".libra/policy-math", SHIPPED_TUNED["math"])):
        for name in ("model.safetensors", "libra_policy.json", "tokenizer.json"):
            assert (tmp_path / directory / name).read_bytes() == (shipped / name).read_bytes(), (directory, name)
    assert heard == []  # copied, nothing trained
