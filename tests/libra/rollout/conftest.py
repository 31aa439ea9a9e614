import os
from pathlib import Path

import pytest

from libra.config import SandboxConfig
from libra.rollout.policy import PolicySettings, init_policy


@pytest.fixture(scope="session")
def policy_dir() -> Path:
    """The shipped policy, copied once into a cache directory the tests may read (and copy) freely;
    building one from scratch took four minutes on a fresh machine."""
    out = Path(__file__).resolve().parents[3] / ".libra" / "test-policy"
    init_policy(out, PolicySettings(), log=lambda _: None)
    return out



@pytest.fixture
def tmp_path():
    """The rollout tests' working directories are the sandbox's: its unprivileged uid must reach
    them, and pytest's own tmp_path lies under a directory only the test's user may enter."""
    from libra.files import discard_tree
    from libra.rollout.workroots import make_workroot

    root = make_workroot("libra-test-")
    yield root
    discard_tree(root)  # the trajectories' own filesystems unmounted too


@pytest.fixture
def host(tmp_path):
    """A host directory beside the working directory: a secret the sandbox must not read and a
    tree that must not change."""
    sentinel = tmp_path / "sentinel"
    sentinel.mkdir()
    (sentinel / "secret.txt").write_text("host secret 31337\n")
    os.chmod(sentinel, 0o755)
    os.chmod(sentinel / "secret.txt", 0o644)  # readable by anyone on the host: only isolation hides it
    return sentinel


@pytest.fixture(params=[True, False], ids=["server", "bwrap-per-call"])
def config(request):
    return SandboxConfig(server=request.param)
