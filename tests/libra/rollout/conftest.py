import shutil
from pathlib import Path

import pytest

from libra.rollout.policy import PolicySettings, init_policy

# a smaller policy than `libra policy init` builds (about a minute here), cached between test runs
TEST_POLICY = PolicySettings(demos_per_env=64, steps=150)


@pytest.fixture(scope="session")
def policy_dir() -> Path:
    out = Path(__file__).resolve().parents[3] / ".libra" / "test-policy"
    init_policy(out, TEST_POLICY, log=lambda _: None)
    return out



@pytest.fixture
def tmp_path():
    """The rollout tests' working directories are the sandbox's: its unprivileged uid must reach
    them, and pytest's own tmp_path lies under a directory only the test's user may enter."""
    from libra.rollout.sandbox import make_workroot

    root = make_workroot("libra-test-")
    yield root
    shutil.rmtree(root, ignore_errors=True)
