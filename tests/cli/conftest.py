"""The CLI tests' fixtures."""

from pathlib import Path

import pytest

from tests.builders import small_trace, trace_rows, write_trace


@pytest.fixture
def files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory of bad (and some good) inputs; libra runs in it, so .libra would land there."""
    monkeypatch.chdir(tmp_path)
    small_trace(tmp_path / "small.csv")
    (tmp_path / "binary.csv").write_bytes(bytes(range(255, -1, -1)) * 4)
    (tmp_path / "empty.csv").write_text("")
    (tmp_path / "dir.csv").mkdir()
    rows = trace_rows("p", "s", 5, [(1, "none", 0, "")])
    write_trace(tmp_path / "huge_int.csv", [{**rows[0], "gen_tokens": str(2**64)}])
    write_trace(tmp_path / "wide.csv", [{**rows[0], "source": "s" * 200_000}])
    write_trace(tmp_path / "zero.csv", trace_rows("p", "s", 0, [(0, "none", 0, "")])
                + trace_rows("q", "s", 0, [(0, "none", 0, "")]))
    (tmp_path / "binary.yaml").write_bytes(b"store:\n  root: \xff\xfe\n")
    (tmp_path / "list.yaml").write_text("- store\n- traces\n")
    (tmp_path / "scalar.yaml").write_text("42\n")
    (tmp_path / "steps.yaml").write_text("trainer:\n  steps: true\n")
    (tmp_path / "dup.yaml").write_text("store: {root: a}\nstore: {root: b}\n")
    (tmp_path / "big.yaml").write_text("# " + "x" * (1 << 20) + "\n")
    (tmp_path / "ranks.yaml").write_text("trainer: {backend: megatron, dp: 4}\nplacement: {strategy: static}\n"
                                         "rollout: {engine: vllm}\n")
    (tmp_path / "unplaced.yaml").write_text("trainer: {backend: megatron, layout: planned}\n")
    (tmp_path / "notes.txt").write_text("not a database\n")
    (tmp_path / "notdb.yaml").write_text(f"tracking: {{tracking_uri: 'sqlite:///{tmp_path / 'notes.txt'}'}}\n")
    lines = ['a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"{n}: &{n} [{', '.join(['*' + p] * 9)}]" for n, p in zip("bcdefghi", "abcdefgh", strict=True)]
    (tmp_path / "bomb.yaml").write_text("\n".join(lines) + "\nstore: {root: *i}\n")
    return tmp_path
