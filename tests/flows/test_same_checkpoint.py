"""A fixed-seed training on the transformers engine ends in the same checkpoint, bit for bit, as
it did before the training session was restructured (placement, opening a run and a batch's
lifecycle out of the session; one GRPO step for every trainer; one source per dial).

One tool thread makes the rollout's batching independent of when tool calls return, so two runs
of this configuration are bit-identical. The digest is pinned for the arithmetic it was made
with (torch's version and the CPU's vector capability); elsewhere the test says so and skips.
"""

import hashlib

import pytest
import yaml

from tests.flows.test_train import finished, libra
from tests.libra.rollout.conftest import policy_dir  # noqa: F401 - the session fixture

# (torch version, CPU capability) -> sha256 of model.safetensors after 3 updates
PINNED = {("2.13.0+cpu", "AVX512"): "341f023cd067b446e0bccaee34c386e685825e0ab6f1e3234a555628f8f79c67"}


def test_a_fixed_seed_run_ends_in_the_pinned_checkpoint(policy_dir, tmp_path):  # noqa: F811
    import torch

    key = (torch.__version__, torch.backends.cpu.get_cpu_capability())
    if key not in PINNED:
        pytest.skip(f"the checkpoint's digest is pinned for {sorted(PINNED)}; this machine computes with {key}")
    config = {
        "store": {"root": str(tmp_path / "store"), "fsync": False},
        "tracking": {"tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "artifact_root": str(tmp_path / "artifacts")},
        "orchestration": {"prefect_home": str(tmp_path / "prefect")},
        "rollout": {"engine": "hf", "max_turns": 3, "max_tokens_per_turn": 40, "max_context": 512, "tool_threads": 1},
        "trainer": {"policy": str(policy_dir), "run": "pinned", "steps": 3, "prompts_per_step": 2,
                    "samples_per_prompt": 4, "eval_prompts": 2, "eval_every": 2,
                    "checkpoint_dir": str(tmp_path / "checkpoints"), "lr": 1e-4},
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    summary = finished(libra(path))
    assert summary["steps"] == 3 and summary["resumed_at"] == 0
    weights = tmp_path / "checkpoints" / "pinned" / "step-000003" / "model.safetensors"
    assert hashlib.sha256(weights.read_bytes()).hexdigest() == PINNED[key]
