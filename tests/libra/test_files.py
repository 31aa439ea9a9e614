"""Removing a tree that a tool call wrote: nothing it can build breaks the host's cleanup, and
nothing outside the tree is touched."""

import os
import shutil
import socket
from pathlib import Path

import pytest

from libra.files import remove_tree


def deep(root, levels: int) -> None:
    """A chain of `levels` directories, built by descriptor (the path is too long to name at once)."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(levels):
            os.mkdir("d", dir_fd=fd)
            child = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = child
        with open(os.open("leaf", os.O_WRONLY | os.O_CREAT, dir_fd=fd), "w") as leaf:
            leaf.write("x")
    finally:
        os.close(fd)


def test_a_tree_3000_levels_deep_is_removed_where_shutils_rmtree_fails(tmp_path):
    (tmp_path / "a").mkdir()
    deep(tmp_path / "a", 3000)
    with pytest.raises((RecursionError, OSError)):
        shutil.rmtree(tmp_path / "a")
    remove_tree(tmp_path / "a")
    assert not (tmp_path / "a").exists()


def test_read_only_directories_fifos_sockets_links_and_unreadable_files_go_and_nothing_outside(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep")
    top = tmp_path / "work"
    (top / "a" / "b").mkdir(parents=True)
    (top / "a" / "b" / "f").write_text("x")
    os.chmod(top / "a" / "b" / "f", 0)
    os.mkfifo(top / "a" / "fifo")
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(top / "a" / "sock"))
    server.close()
    (top / "link-out").symlink_to(outside, target_is_directory=True)
    (top / "a" / "file-link").symlink_to(outside / "keep.txt")
    os.chmod(top / "a" / "b", 0o500)  # no write: its entries cannot be removed as it is
    os.chmod(top / "a", 0o100)  # search only: cannot be listed
    os.chmod(top, 0o500)
    remove_tree(top)
    assert not top.exists() and (outside / "keep.txt").read_text() == "keep"


def test_a_missing_tree_or_a_lone_file_is_fine(tmp_path):
    remove_tree(tmp_path / "nothing")
    (tmp_path / "f").write_text("x")
    remove_tree(tmp_path / "f")
    assert not (tmp_path / "f").exists()


def test_a_replacing_write_follows_no_planted_link_and_a_failed_one_leaves_the_file_as_it_was(tmp_path: Path) -> None:
    from libra.files import replacing

    victim, out = tmp_path / "victim.txt", tmp_path / "tree.json"
    victim.write_text("precious")
    (tmp_path / ".tree.json.tmp").symlink_to(victim)  # the old fixed temporary name, planted
    with replacing(out) as f:
        f.write(b"new")
    assert out.read_text() == "new" and not out.is_symlink() and victim.read_text() == "precious"
    with pytest.raises(RuntimeError), replacing(out, durable=True) as f:
        f.write(b"half")
        raise RuntimeError
    assert out.read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".tree.json.tmp", "tree.json", "victim.txt"]  # no temp left
