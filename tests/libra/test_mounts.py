from pathlib import Path

from libra.mounts import mounts_below, workdir_bytes_held

MOUNTINFO = """22 27 0:21 / /proc rw,relatime - proc proc rw
60 27 254:0 /tmp/libra-sandbox-7-x /tmp/libra-sandbox-7-x rw,relatime shared:2 - ext4 /dev/vda rw
61 60 0:45 / /tmp/libra-sandbox-7-x/r/a rw,nosuid,nodev shared:3 - tmpfs libra-work rw,size=1024k
62 60 0:46 / /tmp/libra-sandbox-7-x/r/with\\040space rw,nosuid,nodev shared:4 - tmpfs libra-work rw,size=1024k
63 61 0:47 / /tmp/libra-sandbox-7-x/r/a/deeper rw - tmpfs libra-work rw
64 27 0:48 / /tmp/libra-sandbox-7-xy rw - tmpfs other rw
"""


def test_the_mounts_below_a_directory_come_deepest_first_with_escapes_read():
    assert mounts_below("/tmp/libra-sandbox-7-x", MOUNTINFO) == [
        Path("/tmp/libra-sandbox-7-x/r/a/deeper"), Path("/tmp/libra-sandbox-7-x/r/a"),
        Path("/tmp/libra-sandbox-7-x/r/with space"), Path("/tmp/libra-sandbox-7-x")]


def test_a_sibling_whose_name_starts_alike_is_not_below():
    assert mounts_below("/tmp/libra-sandbox-7-x/r/a", MOUNTINFO) == [
        Path("/tmp/libra-sandbox-7-x/r/a/deeper"), Path("/tmp/libra-sandbox-7-x/r/a")]
    assert mounts_below("/nowhere", MOUNTINFO) == []


def test_the_bytes_working_directories_may_hold_are_their_caps_each_filesystem_once():
    seen_twice = MOUNTINFO + "65 27 0:45 / /elsewhere rw - tmpfs libra-work rw,size=1024k\n"  # 0:45 again
    other = "66 27 0:49 / /big rw - tmpfs libra-work rw,size=3m,mode=700\n67 27 0:50 / /x rw - ext4 libra-work rw\n"
    assert workdir_bytes_held(seen_twice) == 2 * 2**20  # 0:45 and 0:46; 0:47 has no cap, 0:48 is not one
    assert workdir_bytes_held(seen_twice + other) == 5 * 2**20
    assert workdir_bytes_held("") == 0
