import os
import subprocess
from pathlib import Path

from libra.rollout.cgroups import Hierarchy, find_hierarchy, remove_orphaned

V1_CGROUP = "9:name=systemd:/\n8:pids:/\n4:memory:/process_api/abc\n1:cpu:/\n0::/\n"
V1_MOUNTS = ("22 27 0:21 / /proc rw,relatime - proc proc rw\n"
             "40 30 0:33 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
             "41 30 0:34 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
             "47 30 0:40 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n")
V2_CGROUP = "0::/user.slice/session-3.scope\n"
V2_MOUNTS = "30 24 0:26 / /sys/fs/cgroup rw,nosuid,nodev - cgroup2 cgroup2 rw,nsdelegate\n"


def test_v1s_memory_controller_is_preferred_to_a_hybrid_v2():
    assert find_hierarchy(V1_CGROUP, V1_MOUNTS) == Hierarchy(1, Path("/sys/fs/cgroup/memory/process_api/abc"))


def test_a_v2_only_machine_gives_its_own_cgroup_under_the_v2_mount():
    assert find_hierarchy(V2_CGROUP, V2_MOUNTS) == Hierarchy(2, Path("/sys/fs/cgroup/user.slice/session-3.scope"))


def test_no_hierarchy_mounted_is_none():
    assert find_hierarchy(V2_CGROUP, "22 27 0:21 / /proc rw,relatime - proc proc rw\n") is None
    assert find_hierarchy("4:memory:/x\n", "41 30 0:34 /sub /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n") is None


def test_the_directories_of_processes_that_are_gone_are_removed(tmp_path):
    gone = subprocess.Popen(["true"])
    gone.wait()
    (tmp_path / f"libra-sandbox-{gone.pid}" / "call-0").mkdir(parents=True)
    (tmp_path / f"libra-sandbox-{os.getpid()}" / "call-3").mkdir(parents=True)
    (tmp_path / "libra-sandbox-x").mkdir()
    assert remove_orphaned(tmp_path) == [tmp_path / f"libra-sandbox-{gone.pid}"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([f"libra-sandbox-{os.getpid()}", "libra-sandbox-x"])
