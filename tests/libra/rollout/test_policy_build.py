"""The supervised step the policy's warm start (and `bench_train --reference`) takes: the mean
cross-entropy over the labelled tokens only, one clipped AdamW step; and the tuning that continues
a built policy's supervision on one environment."""

import torch

from libra.optim import make_optimizer
from libra.rollout.policy import PolicySettings, build_model, supervised_step


def _examples() -> list[tuple[list[int], list[int]]]:
    # two sequences of different lengths; the first three tokens of each are the prompt (unlabelled)
    return [([5, 6, 7, 8, 9, 10], [-100, -100, -100, 8, 9, 10]), ([11, 12, 13, 14], [-100, -100, -100, 14])]


def _loss(model, examples) -> float:
    """The cross-entropy of every labelled token, averaged over all of them, written out."""
    total, count = 0.0, 0
    with torch.no_grad():
        for ids, labels in examples:
            logp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0], dim=-1)
            for position in range(1, len(ids)):
                if labels[position] != -100:
                    total -= float(logp[position - 1, labels[position]])
                    count += 1
    return total / count


def test_a_supervised_step_averages_the_labelled_tokens_and_lowers_their_loss() -> None:
    torch.manual_seed(0)
    model = build_model(PolicySettings(hidden=64, heads=1, layers=1, intermediate=128, max_positions=32), 32)
    optimizer = make_optimizer(model.parameters(), 1e-2, weight_decay=0.0)
    before = [p.detach().clone() for p in model.parameters()]
    expected = _loss(model, _examples())
    loss = supervised_step(model, optimizer, _examples())  # padding and prompts carry no loss
    assert abs(loss - expected) < 1e-5
    assert _loss(model, _examples()) < expected
    assert all(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_tuning_takes_the_supervised_steps_written_out_and_is_then_kept(tmp_path, policy_dir) -> None:
    """Two updates of four fresh math demonstrations each, as the settings say, equal the same two
    supervised steps taken by hand from the base; a second call keeps the result, `rebuild` redoes it."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from libra.rollout.envs import demonstration, make_env
    from libra.rollout.policy import TUNE_TASK_SEED, TuneSettings, encode, tune_policy
    from libra.rollout.workroots import temporary_workroot

    settings = TuneSettings(env="math", demonstrations=9, batch=4, lr=1e-3, seed=3, held_out=0)  # 2 updates of 4
    heard: list[tuple[int, int]] = []
    out = tmp_path / "tuned"
    record = tune_policy(out, policy_dir, settings, log=lambda _: None, progress=lambda d, n, _: heard.append((d, n)))
    assert heard == [(1, 2), (2, 2)] and record["demonstrations"] == 8
    assert record["tuned"]["settings"] == {"env": "math", "demonstrations": 9, "batch": 4, "lr": 1e-3, "seed": 3,
                                           "held_out": 0}
    assert record["base"]["settings"]["demos_per_env"] == 400  # the base's own record, kept

    env, tokenizer = make_env("math"), AutoTokenizer.from_pretrained(policy_dir)
    examples = []
    for task in env.tasks(8, seed=TUNE_TASK_SEED + 3):
        with temporary_workroot("libra-test-tune-") as workdir:
            examples.append(encode(tokenizer, *demonstration(env, task, workdir)))
    torch.manual_seed(3)
    model = AutoModelForCausalLM.from_pretrained(policy_dir, dtype=torch.float32).train()
    optimizer = make_optimizer(model.parameters(), 1e-3, weight_decay=0.0)
    losses = [supervised_step(model, optimizer, examples[:4]), supervised_step(model, optimizer, examples[4:])]
    assert record["final_loss"] == sum(losses) / 2
    tuned = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    base = AutoModelForCausalLM.from_pretrained(policy_dir, dtype=torch.float32)
    for (name, mine), theirs, before in zip(model.named_parameters(), tuned.parameters(), base.parameters(), strict=True):
        assert torch.equal(mine, theirs), name
        assert not torch.equal(theirs, before), name
    assert (out / "tokenizer.json").read_bytes() == (policy_dir / "tokenizer.json").read_bytes()

    messages: list[str] = []
    assert tune_policy(out, policy_dir, settings, log=messages.append) == record
    assert messages == [f"policy in {out} is up to date (tuned in {record['train_s']:.0f} s, final loss "
                        f"{record['final_loss']:.3f})"]
    assert tune_policy(out, policy_dir, settings, log=messages.append, rebuild=True)["train_s"] != record["train_s"]
    assert not (tmp_path / ".tuned.tuning").exists()  # the staging directory became the policy


def test_tuning_leaves_out_the_held_out_problems_and_keeps_the_order_of_the_rest() -> None:
    import pytest

    from libra.errors import LibraError
    from libra.rollout.envs import fresh_tasks, make_env

    env = make_env("math")
    held = {env.problem(t) for t in env.tasks(1024, seed=0)}
    drawn = env.tasks(5051, seed=20_000)
    fresh = fresh_tasks(env, 4800, 20_000, 1024, "ask for less")
    assert [t.task_id for t in fresh] == [t.task_id for t in drawn if env.problem(t) not in held]  # 251 left out
    assert fresh[-1].task_id == "math-20000-5050"
    same_problem = [t for t in drawn if env.problem(t) in held]
    assert len(same_problem) == 251 and env.problem(same_problem[0]).startswith(same_problem[0].data["category"])
    search = make_env("search")  # 72 problems, every one among 1,024 held-out tasks
    with pytest.raises(LibraError, match="only 0 of 160 search tasks are problems outside the first 1024 held-out tasks, "
                                         "short of 10: ask for less"):
        fresh_tasks(search, 10, 20_000, 1024, "ask for less")


def test_tuning_refuses_what_it_cannot_do_and_replaces_nothing(tmp_path, policy_dir) -> None:
    import pytest

    from libra.errors import LibraError
    from libra.rollout.policy import TuneSettings, tune_policy

    with pytest.raises(LibraError, match="unknown environment 'chess'; environments: search, math, repo"):
        TuneSettings(env="chess")
    with pytest.raises(LibraError, match="3 demonstrations in batches of 4; give at least 4 demonstrations"):
        TuneSettings(demonstrations=3, batch=4)
    with pytest.raises(LibraError, match=r"learning rate 2.0 must be in \(0, 1\]"):
        TuneSettings(lr=2.0)
    with pytest.raises(LibraError, match="held_out -1 must be >= 0"):
        TuneSettings(held_out=-1)
    small = TuneSettings(demonstrations=4, batch=4)
    with pytest.raises(LibraError, match=f"the policy to tune: no policy in {tmp_path / 'none'}; build one with `libra policy init"):
        tune_policy(tmp_path / "x", tmp_path / "none", small, log=lambda _: None)
    with pytest.raises(LibraError, match="give --out a directory other than its base"):
        tune_policy(policy_dir, policy_dir, small, log=lambda _: None)
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text("{}")
    for settings in (small, TuneSettings()):  # the defaults' shipped tuning is not copied over it either
        with pytest.raises(LibraError, match=r"holds files that `libra policy tune` did not write \(config.json\); "
                                             "give --out a new or empty directory"):
            tune_policy(other, policy_dir, settings, log=lambda _: None)
    assert [p.name for p in other.iterdir()] == ["config.json"] and (other / "config.json").read_text() == "{}"
    # any directory of the user's, not only one with a policy (tuning removed it whole), and a file
    notes = tmp_path / "notes"
    (notes / "sub").mkdir(parents=True)
    (notes / "notes.md").write_text("important")
    with pytest.raises(LibraError, match=r"holds files that `libra policy tune` did not write \(notes.md, sub\)"):
        tune_policy(notes, policy_dir, small, log=lambda _: None)
    assert (notes / "notes.md").read_text() == "important" and (notes / "sub").is_dir()
    with pytest.raises(LibraError, match="is a file, not a directory: give --out a new or empty directory"):
        tune_policy(notes / "notes.md", policy_dir, small, log=lambda _: None)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no staging left behind


def test_init_refuses_a_directory_it_did_not_write_and_replaces_nothing(tmp_path, monkeypatch) -> None:
    """`libra policy init --out ""` wrote the policy into the working directory, over the user's own
    config.json and tokenizer.json (a bad-input review); a file, or a directory holding anything but
    a policy init built, is refused now, and a policy it built is still kept or copied again."""
    import pytest

    from libra.errors import LibraError
    from libra.rollout.policy import init_policy

    quiet = {"log": lambda _: None}
    project = tmp_path / "project"
    project.mkdir()
    (project / "config.json").write_text("mine")
    (project / "tokenizer.json").write_text("mine too")
    monkeypatch.chdir(project)
    with pytest.raises(LibraError, match=r"^the policy's directory \(--out\) is empty: give a directory"):
        init_policy("", **quiet)
    for out in (".", project):
        with pytest.raises(LibraError, match=r"holds files that `libra policy init` did not write \(config.json, "
                                             r"tokenizer.json\); give --out a new or empty directory"):
            init_policy(out, **quiet)
    (project / "libra_policy.json").write_text("not json")
    with pytest.raises(LibraError, match="did not write"):
        init_policy(project, **quiet)
    with pytest.raises(LibraError, match="is a file, not a directory"):
        init_policy(project / "config.json", **quiet)
    assert sorted(p.name for p in project.iterdir()) == ["config.json", "libra_policy.json", "tokenizer.json"]
    assert (project / "config.json").read_text() == "mine" and (project / "tokenizer.json").read_text() == "mine too"
    built = tmp_path / "built"
    init_policy(built, **quiet)  # a copy of the shipped policy
    assert init_policy(built, **quiet) == init_policy(tmp_path / "again", **quiet)  # kept as it is


def test_the_shipped_tuned_policy_is_the_default_tuning_of_the_shipped_policy() -> None:
    """data/policy-math's record says it is data/policy tuned with TuneSettings(): so `libra policy
    tune` with the defaults, and the main job, copy it instead of spending the tuning's minutes."""
    import hashlib
    import json
    from dataclasses import asdict

    from libra.rollout.policy import SHIPPED, SHIPPED_TUNED, TuneSettings

    record = json.loads((SHIPPED_TUNED["math"] / "libra_policy.json").read_text())
    assert record["tuned"] == {"base_sha256": hashlib.sha256((SHIPPED / "model.safetensors").read_bytes()).hexdigest(),
                               "settings": asdict(TuneSettings())}
    assert record["demonstrations"] == 4800 and record["base"] == json.loads((SHIPPED / "libra_policy.json").read_text())
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (SHIPPED_TUNED["math"] / name).read_bytes() == (SHIPPED / name).read_bytes()
