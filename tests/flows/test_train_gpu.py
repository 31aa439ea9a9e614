"""`libra train` on one GPU, the paths that run only there: the transformers engine with the torch
trainer, the same with the megatron trainer, and a placed run on the local cluster's GPUs (one GPU
a worker). Marked `gpu` (skipped without CUDA); the configs themselves are checked everywhere."""

import pytest
import yaml

from libra.config import LibraConfig
from tests.flows.test_train import finished, libra, weights
from tests.libra.rollout.conftest import policy_dir  # noqa: F401 - the session fixture

STEPS = 2


def gpu_config(base, policy, run: str, **sections) -> dict:
    config = {
        "store": {"root": str(base / "store"), "fsync": False},
        "tracking": {"tracking_uri": f"sqlite:///{base / 'mlflow.db'}", "artifact_root": str(base / "artifacts")},
        "orchestration": {"prefect_home": str(base / "prefect")},
        "rollout": {"engine": "hf", "device": "cuda", "max_turns": 3, "max_tokens_per_turn": 40, "max_context": 512},
        "trainer": {"policy": str(policy), "run": run, "steps": STEPS, "prompts_per_step": 2, "samples_per_prompt": 4,
                    "eval_prompts": 2, "eval_every": 2, "checkpoint_dir": str(base / "checkpoints"), "lr": 1e-4,
                    "device": "cuda"},
    }
    for section, values in sections.items():
        config[section] = {**config.get(section, {}), **values}
    return config


CASES = {
    "torch": {},
    "megatron": {"trainer": {"backend": "megatron"}},
    "placed": {"placement": {"strategy": "colocated"}},  # the local cluster: one GPU a worker
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_gpu_configs_are_valid(case, tmp_path):
    LibraConfig.model_validate(gpu_config(tmp_path, tmp_path / "policy", case, **CASES[case]))


@pytest.mark.gpu
@pytest.mark.parametrize("case", list(CASES))
def test_libra_train_trains_on_one_gpu(case, policy_dir, tmp_path):  # noqa: F811
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(gpu_config(tmp_path, policy_dir, f"gpu-{case}", **CASES[case])))
    summary = finished(libra(path))
    assert summary["steps"] == STEPS and summary["resumed_at"] == 0
    trained, initial = weights(summary["checkpoint"]), weights(str(policy_dir))
    assert any((trained[name].float() - initial[name].float()).abs().max().item() > 0 for name in initial)
    assert all(torch.isfinite(t).all() for t in trained.values())
