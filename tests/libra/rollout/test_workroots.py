"""Working directories: where they live (`libra.rollout.workroots`), what a killed run leaves of
them, and which ones the sandbox refuses to serve, with the reason."""

import os
import subprocess
from pathlib import Path

import pytest

from libra.config import SandboxConfig
from libra.rollout import workroots
from libra.rollout.sandbox import Sandbox, SandboxLimits, SandboxUnavailable

FAST = SandboxLimits(timeout_s=3.0, cpu_s=2, memory_bytes=256 * 2**20)
AS_ROOT = os.geteuid() == 0


def test_a_killed_runs_working_directories_go_when_the_next_process_makes_its_own(tmp_path):
    gone = subprocess.Popen(["true"])
    gone.wait()
    orphan = tmp_path / f"{workroots.BASE_PREFIX}{gone.pid}-abc"
    live = tmp_path / f"{workroots.BASE_PREFIX}{os.getpid()}-def"
    for base in (orphan, live):
        (base / "libra-train-x" / "t0").mkdir(parents=True)
        os.chmod(base / "libra-train-x", 0o500)
    assert workroots.remove_orphaned_bases(tmp_path) == [orphan]
    assert not orphan.exists() and live.is_dir()


def test_a_working_directory_is_prepared_before_anything_is_written_in_it(tmp_path):
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "task.py").write_text("x = 1\n")
    with pytest.raises(ValueError, match="before anything is written"):
        Sandbox(SandboxConfig()).prepare(tmp_path / "work")


@pytest.mark.skipif(not AS_ROOT, reason="mounts need root")


def test_a_killed_runs_mounted_working_directories_are_unmounted_then_removed(tmp_path):
    from libra.mounts import mount_tmpfs

    gone = subprocess.Popen(["true"])
    gone.wait()
    orphan = tmp_path / f"{workroots.BASE_PREFIX}{gone.pid}-abc"
    (orphan / "t0").mkdir(parents=True)
    mount_tmpfs(orphan / "t0", 2**20, 64, 65534)
    (orphan / "t0" / "f").write_text("left by a tool")
    assert workroots.remove_orphaned_bases(tmp_path) == [orphan]
    assert not orphan.exists()
    assert str(orphan) not in Path("/proc/self/mountinfo").read_text()


def test_an_unreachable_working_directory_is_a_clear_error(tmp_path):
    if not AS_ROOT:
        pytest.skip("only a root caller hands the directory to another uid")
    private = tmp_path / "private"
    (private / "work").mkdir(parents=True)
    os.chmod(private, 0o700)
    with pytest.raises(SandboxUnavailable, match="cannot enter .*private.*make_workroot"):
        Sandbox().run("print(1)", private / "work", FAST)


def test_working_directories_through_links_or_inside_another_are_refused(tmp_path):
    box = Sandbox()
    outer = tmp_path / "outer"
    outer.mkdir()
    assert box.run("import os\nos.symlink('/etc', 'inner')\nos.mkdir('real')", outer, FAST).status == "ok"
    with pytest.raises(SandboxUnavailable, match="link"):
        box.run("print(1)", outer / "inner", FAST)
    if AS_ROOT:
        with pytest.raises(SandboxUnavailable, match="which a sandbox owns"):
            box.run("print(1)", outer / "real", FAST)
        assert Path("/etc").stat().st_uid == 0
