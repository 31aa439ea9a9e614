import os
import subprocess
from pathlib import Path

import pytest

from libra.clock import WallClock
from libra.rollout.cgroups import (
    CallCgroups,
    CgroupUnavailable,
    Hierarchy,
    cpu_quota_us,
    find_hierarchies,
    remove_orphaned,
)

V1_CGROUP = "9:name=systemd:/\n8:pids:/\n4:memory:/process_api/abc\n1:cpu:/\n0::/\n"
V1_MOUNTS = ("22 27 0:21 / /proc rw,relatime - proc proc rw\n"
             "40 30 0:33 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
             "41 30 0:34 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
             "47 30 0:40 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n")
V2_CGROUP = "0::/user.slice/session-3.scope\n"
V2_MOUNTS = "30 24 0:26 / /sys/fs/cgroup rw,nosuid,nodev - cgroup2 cgroup2 rw,nsdelegate\n"


def test_v1s_controllers_are_preferred_to_a_hybrid_v2_memory_first_and_pids_only_where_mounted():
    assert find_hierarchies(V1_CGROUP, V1_MOUNTS) == (Hierarchy(1, Path("/sys/fs/cgroup/memory/process_api/abc"), ("memory",)),
                                                      Hierarchy(1, Path("/sys/fs/cgroup/cpu"), ("cpu",)))


def test_co_mounted_v1_controllers_share_one_hierarchy():
    cgroup = "5:pids:/a\n3:cpu,cpuacct:/a\n4:memory:/a\n0::/\n"
    mounts = ("40 30 0:33 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n"
              "41 30 0:34 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
              "42 30 0:35 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids\n")
    assert find_hierarchies(cgroup, mounts) == (Hierarchy(1, Path("/sys/fs/cgroup/memory/a"), ("memory",)),
                                                Hierarchy(1, Path("/sys/fs/cgroup/cpu,cpuacct/a"), ("cpu",)),
                                                Hierarchy(1, Path("/sys/fs/cgroup/pids/a"), ("pids",)))


def test_a_v2_only_machine_gives_its_own_cgroup_under_the_v2_mount_for_every_controller():
    assert find_hierarchies(V2_CGROUP, V2_MOUNTS) == (Hierarchy(2, Path("/sys/fs/cgroup/user.slice/session-3.scope"),
                                                                ("memory", "cpu", "pids")),)


def test_no_memory_hierarchy_mounted_is_none():
    assert find_hierarchies(V2_CGROUP, "22 27 0:21 / /proc rw,relatime - proc proc rw\n") == ()
    assert find_hierarchies("4:memory:/x\n", "41 30 0:34 /sub /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n") == ()
    assert find_hierarchies("1:cpu:/\n", "40 30 0:33 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n") == ()


def test_a_cpu_cap_is_a_cfs_quota_per_100_ms():
    assert [cpu_quota_us(c) for c in (1.0, 0.5, 2.25, 0.001)] == [100_000, 50_000, 225_000, 1_000]
    with pytest.raises(ValueError, match="above 0 cores"):
        cpu_quota_us(0.0)


def test_a_calls_cgroups_carry_its_limits_and_go_with_it():
    # (beside any the process's sandboxes opened: each `CallCgroups` has directories of its own)
    try:
        cgroups = CallCgroups.open(os.geteuid(), WallClock())
    except CgroupUnavailable as exc:
        pytest.skip(f"no cgroups here: {exc}")
    try:
        name = cgroups.make(256 * 2**20, cpus=0.5, processes=16)
        values = {}
        for tree in cgroups.trees:
            for file in ("memory.limit_in_bytes", "memory.max", "cpu.cfs_quota_us", "cpu.max", "pids.max"):
                if (tree.top / name / file).exists() and file.split(".")[0] in tree.controllers:
                    values[file] = (tree.top / name / file).read_text().split()
        assert values.get("memory.limit_in_bytes", values.get("memory.max")) == [str(256 * 2**20)]
        if "cpu" in cgroups.controllers:
            assert values.get("cpu.cfs_quota_us", values.get("cpu.max", [])[:1]) == ["50000"]
        if "pids" in cgroups.controllers:
            assert values["pids.max"] == ["19"]  # 16 for the code, 3 for what starts it
        assert [p.parent.name for p in cgroups.procs(name)] == [name] * len(cgroups.trees)
        if "cpu" in cgroups.controllers:  # the calls weigh together as much as each would on its own
            cpu = next(tree for tree in cgroups.trees if "cpu" in tree.controllers)
            weight = cpu.top / ("cpu.shares" if cpu.hierarchy.version == 1 else "cpu.weight")
            one = 1024 if cpu.hierarchy.version == 1 else 100
            other = cgroups.make(256 * 2**20, cpus=0.5, processes=16)
            assert int(weight.read_text()) == 2 * one
            assert cgroups.remove(other) and int(weight.read_text()) == one
        assert cgroups.remove(name) and not any((top / name).exists() for top in cgroups.tops)
    finally:
        cgroups.close()
    assert not any(top.exists() for top in cgroups.tops)


def test_the_directories_of_processes_that_are_gone_are_removed(tmp_path):
    gone = subprocess.Popen(["true"])
    gone.wait()
    (tmp_path / f"libra-sandbox-{gone.pid}" / "call-0").mkdir(parents=True)  # as an earlier version named it
    (tmp_path / f"libra-sandbox-{gone.pid}-2" / "call-1").mkdir(parents=True)
    (tmp_path / f"libra-sandbox-{os.getpid()}-0" / "call-3").mkdir(parents=True)
    (tmp_path / "libra-sandbox-x").mkdir()
    assert sorted(remove_orphaned(tmp_path)) == [tmp_path / f"libra-sandbox-{gone.pid}", tmp_path / f"libra-sandbox-{gone.pid}-2"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([f"libra-sandbox-{os.getpid()}-0", "libra-sandbox-x"])


@pytest.mark.skipif(os.geteuid() != 0, reason="calls' cgroups are made as root only")
def test_a_cpu_hierarchy_that_cannot_be_used_is_named_missing_with_the_reason(tmp_path):
    (tmp_path / "memory" / "a").mkdir(parents=True)
    mounts = (f"41 30 0:34 / {tmp_path / 'memory'} rw - cgroup cgroup rw,memory\n"
              f"40 30 0:33 / {tmp_path / 'cpu'} rw - cgroup cgroup rw,cpu\n")  # never made: not writable
    cgroups = CallCgroups.open(0, WallClock(), "4:memory:/a\n1:cpu:/\n0::/\n", mounts)
    try:
        assert cgroups.controllers == ("memory",)
        assert [top.parent for top in cgroups.tops] == [tmp_path / "memory" / "a"]
        assert cgroups.tops[0].name.startswith(f"libra-sandbox-{os.getpid()}-")
        assert cgroups.missing == {"cpu": f"{tmp_path / 'cpu'} is not writable",
                                   "pids": "its controller is not mounted or not offered here"}
    finally:
        cgroups.close()
    assert not cgroups.tops[0].exists()


def test_the_calls_together_are_capped_and_a_call_past_it_ends_not_libra(tmp_path):
    """Each call is capped alone, and the calls in flight together at `sandbox.calls_bytes`: 16
    calls of 1 GiB had held what they liked together, and a machine out of memory ends its largest
    process, Libra's (a red team's)."""
    from libra.config import SandboxConfig
    from libra.rollout.sandbox import Sandbox, SandboxLimits

    try:
        cgroups = CallCgroups.open(os.geteuid(), WallClock(), total_bytes=96 * 2**20)
    except CgroupUnavailable as exc:
        pytest.skip(f"no cgroups here: {exc}")
    try:
        memory = next(tree for tree in cgroups.trees if "memory" in tree.controllers)
        limit = memory.top / ("memory.limit_in_bytes" if memory.hierarchy.version == 1 else "memory.max")
        assert limit.read_text().split() == [str(96 * 2**20)]
    finally:
        cgroups.close()
    box = Sandbox(SandboxConfig(calls_bytes=48 * 2**20))
    work = tmp_path / "w"
    work.mkdir()
    box.prepare(work)
    code = "b = bytearray(100 * 2**20)\nfor i in range(0, len(b), 4096):\n    b[i] = 1\nprint('held')"
    alone = box.run(code, work, SandboxLimits(call_memory_bytes=256 * 2**20, memory_bytes=512 * 2**20))
    assert alone.status == "error" and "held" not in alone.stdout  # under its own cap, past the calls' together
    assert box.run("print(6 * 7)", work, SandboxLimits()).stdout.strip() == "42"
