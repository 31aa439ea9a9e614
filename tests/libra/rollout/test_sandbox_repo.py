"""The sandbox against deliberate escape, through the repo environment's tools: its code edits
code.py and runs when the tests import it (see `test_sandbox.py`: both ways a call can start, and
the host directory beside the working directory that must not change). The host side never
follows what the code planted, the tests run are the task's, and what the code does to its own
working directory earns a reward of 0, never a failed environment."""

import os

import pytest

from tests.libra.rollout.test_sandbox import open_episode


def test_a_link_planted_in_the_working_directory_is_never_followed_by_the_host(tmp_path, host, config):
    workdir = tmp_path / "repo"
    episode = open_episode("repo", config, workdir)
    target = host / "secret.txt"
    # code.py runs when the tests import it: it swaps itself and the tests for links to a host file
    line = (f"import os; [os.remove(f) for f in ('code.py', 'test_code.py')]; "
            f"[os.symlink({str(target)!r}, f) for f in ('code.py', 'test_code.py')]")
    assert episode.call("edit", f"code.py 3: {line}")[1] == "ok"  # line 3: between two functions
    episode.call("test", "all")
    assert (workdir / "code.py").is_symlink()
    output, status = episode.call("read", "code.py")
    assert status == "error" and "31337" not in output and "not" in output
    assert episode.call("edit", "code.py 1: pass")[1] == "error"
    assert target.read_text() == "host secret 31337\n"  # neither read nor written through the link
    assert "31337" not in episode.call("read", "test_code.py")[0]  # the task's tests, written afresh


def test_rewriting_the_tests_earns_no_reward(tmp_path, config):
    workdir = tmp_path / "repo"
    episode = open_episode("repo", config, workdir)
    cheat = "import os; os.remove('test_code.py'); open('test_code.py', 'w').write('def test_ok():\\n    pass\\n')"
    assert episode.call("edit", f"code.py 3: {cheat}")[1] == "ok"
    episode.call("test", "all")
    assert "def test_ok" in (workdir / "test_code.py").read_text()  # the code did rewrite them
    assert episode.reward("done") == 0.0  # the tests run are the task's, whatever the code wrote


def test_breaking_its_own_working_directory_earns_a_reward_of_0_not_an_environment_failure(tmp_path, config):
    """The code puts a directory where the tests' file goes. The tool says so, and the reward is
    the tests' verdict, 0: a failed environment would leave the whole group out of the update,
    the trajectory's 0 with it."""
    workdir = tmp_path / "repo"
    episode = open_episode("repo", config, workdir)
    sabotage = "import os; os.remove('test_code.py'); os.mkdir('test_code.py')"
    assert episode.call("edit", f"code.py 3: {sabotage}")[1] == "ok"
    episode.call("test", "all")
    assert (workdir / "test_code.py").is_dir()
    assert episode.call("test", "all") == ("test_code.py is a directory", "error")
    assert episode.call("read", "test_code.py") == ("test_code.py is a directory", "error")
    assert episode.reward("done") == 0.0


def test_filling_its_own_working_directory_earns_a_reward_of_0_not_an_environment_failure(tmp_path, config):
    workdir = tmp_path / "repo"
    episode = open_episode("repo", config.model_copy(update={"workdir_bytes": 2**20}), workdir)
    if not os.path.ismount(workdir):
        pytest.skip("working directories are capped filesystems of their own only where Libra may mount (root)")
    fill = ("exec(\"import os\\nos.remove('test_code.py')\\ntry:\\n f = open('fill', 'wb', 0)\\n"
            " while True: f.write(b'x' * 65536)\\nexcept OSError: pass\")")
    assert episode.call("edit", f"code.py 3: {fill}")[1] == "ok"
    episode.call("test", "all")
    assert (workdir / "fill").stat().st_size > 2**19 and not (workdir / "test_code.py").exists()
    assert episode.call("test", "all") == ("test_code.py cannot be written (no space left on device)", "error")
    assert episode.reward("done") == 0.0
