"""`libra query` only reads: statements that write or change state are refused, files outside the
run's committed shards cannot be read, and the store is byte-for-byte unchanged afterwards."""

import json
from pathlib import Path

import pytest

from cli.main import main
from libra.config import StoreConfig
from libra.errors import LibraError
from storage.catalog import Catalog, QueryRefused, check_read_only
from storage.ingest import import_trace
from tests.builders import small_trace
from tests.storage.test_import import snapshot

SHARD = "turns/v1/run=s/step=00000000/part-00000001-00000.parquet"
OTHER_SHARD = "turns/v1/run=other/step=00000000/part-00000001-00000.parquet"
HINT = "the store is read-only here (run a SELECT, or EXPLAIN SELECT)"


@pytest.fixture()
def store(tmp_path: Path) -> Path:
    config = StoreConfig(root=str(tmp_path / "store"), fsync=False)
    import_trace(small_trace(tmp_path / "t.csv"), "s", config, prompts_per_step=1)
    import_trace(small_trace(tmp_path / "t.csv"), "other", config, prompts_per_step=1)
    return tmp_path / "store"


def refused(kind: str) -> str:
    return f"query refused: {kind} statements are not allowed; {HINT}"


def denied(path: str) -> str:
    return f'query failed: Permission Error: Cannot access file "{path}" - file system operations are disabled by configuration'


def attacks(store: Path, out: Path) -> list[tuple[str, str]]:
    """(statement, the one-line message it gets)."""
    shard = store / SHARD
    return [
        (f"COPY turns TO '{shard}' (FORMAT parquet)", refused("COPY")),
        (f"copy (select 1 as a) to '{out}/x.csv'", refused("COPY")),
        (f"/* a comment first */ COPY (select 1) TO '{out}/y.csv'", refused("COPY")),
        (f"attach '{out}/x.db' as x", refused("ATTACH")),
        ("create table t as select 1", refused("CREATE")),
        ("create or replace view turns as select 1 as a", refused("CREATE")),
        ("create macro m(a) as a", refused("CREATE")),
        ("insert into turns select * from turns", refused("INSERT")),
        ("update trajectories set reward = 1", refused("UPDATE")),
        ("delete from turns", refused("DELETE")),
        ("drop view turns", refused("DROP")),
        ("install httpfs", refused("INSTALL")),
        ("load httpfs", refused("LOAD")),
        ("set enable_external_access = true", refused("SET")),
        ("set lock_configuration = false", refused("SET")),
        ("reset threads", refused("RESET")),
        ("pragma enable_profiling", refused("PRAGMA")),
        (f"export database '{out}/exported'", refused("EXPORT")),
        ("call pragma_version()", refused("CALL")),
        ("checkpoint", refused("CHECKPOINT")),
        ("begin transaction", refused("BEGIN")),
        # a statement type newer than the Python module's names for them: refused, not a traceback
        ("UPDATE EXTENSIONS", refused("UPDATE")),
        ("explain UPDATE EXTENSIONS", "query refused: EXPLAIN is allowed of a SELECT only; the store is read-only here"),
        (f"select 1; copy (select 1) to '{out}/z.csv'", "query refused: give exactly one SQL statement, got 2"),
        (f"explain copy turns to '{shard}'", "query refused: EXPLAIN is allowed of a SELECT only; the store is read-only here"),
        (f"explain analyze copy turns to '{shard}'",
         "query refused: EXPLAIN is allowed of a SELECT only; the store is read-only here"),
        ("", "query refused: no SQL statement given; give one SELECT (e.g. select count(*) as n from turns) or a "
             "named query (libra query --list)"),
        # SELECTs that reach outside the run's committed shards
        ("select * from read_csv('/etc/passwd')", denied("/etc/passwd")),
        ("select * from read_text('/etc/hostname')", denied("/etc/hostname")),
        (f"select * from read_parquet('{store / OTHER_SHARD}')", denied(str(store / OTHER_SHARD))),
        (f"select * from glob('{store}/**')", denied(f"{store}/**")),
        ("select * from read_parquet('https://example.com/x.parquet')", denied("https://example.com/x.parquet")),
    ]


def test_attacks_are_refused_and_the_store_is_unchanged(store: Path, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture) -> None:
    before = snapshot(store)
    outside = sorted(p.name for p in tmp_path.iterdir())
    for sql, message in attacks(store, tmp_path):
        code = main(["query", "--run", "s", "--store", str(store), sql])
        out, err = capsys.readouterr()
        assert (code, out, err) == (2, "", f"libra: error: {message}\n"), sql
    assert snapshot(store) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == outside  # no x.csv, x.db, exported/


def test_the_catalog_refuses_for_every_caller(store: Path) -> None:
    with Catalog(store, "s") as catalog:
        with pytest.raises(QueryRefused, match="^query refused: COPY statements are not allowed"):
            catalog.query(f"copy turns to '{store / SHARD}'")
        with pytest.raises(QueryRefused):
            catalog.query("set threads = 1")
        settings = catalog.query("select name, value from duckdb_settings() where name in "
                                 "('enable_external_access', 'lock_configuration') order by name").to_pylist()
    assert settings == [{"name": "enable_external_access", "value": "false"}, {"name": "lock_configuration", "value": "true"}]
    with Catalog(store) as everything:  # every run's committed shards, and nothing else
        rows = everything.query("select run, count(*) as n from turns group by run order by run").to_pylist()
        assert rows == [{"run": "other", "n": 6}, {"run": "s", "n": 6}]
        with pytest.raises(LibraError, match="^query failed: Permission Error"):
            everything.query("select * from read_csv('/etc/passwd')")


def test_uncommitted_shards_cannot_be_read_by_path(store: Path) -> None:
    stray = store / "turns/v1/run=s/step=00000000/part-00000009-00000.parquet"
    stray.write_bytes((store / SHARD).read_bytes())  # what a killed import would leave
    with Catalog(store, "s") as catalog:
        assert catalog.query("select count(*) as n from turns").to_pylist() == [{"n": 6}]
        with pytest.raises(LibraError, match="^query failed: Permission Error"):
            catalog.query(f"select * from read_parquet('{stray}')")


def test_reading_statements_still_work(store: Path, capsys: pytest.CaptureFixture) -> None:
    def query(*argv: str) -> list[dict]:
        code = main(["query", "--store", str(store), "--json", *argv])
        out, err = capsys.readouterr()
        assert (code, err) == (0, ""), err
        return json.loads(out)

    assert query("--run", "s", "select count(*) as n from turns") == [{"n": 6}]
    assert query("--run", "s", "with t as (select * from trajectories) select max(total_tokens) as m from t") == [{"m": 3046}]
    assert query("--run", "s", "from trajectories select count(*) as n where step = 1") == [{"n": 1}]
    assert query("--run", "s", "select * from (values (1, 'a')) v(x, y)") == [{"x": 1, "y": "a"}]
    assert [r["column_name"] for r in query("--run", "s", "describe trajectories")][:3] == ["run", "step", "trajectory_id"]
    assert sorted(r["name"] for r in query("--run", "s", "show tables")) == [
        "plans", "pool_events", "steps", "timings", "trajectories", "turns"]
    assert [r["explain_key"] for r in query("--run", "s", "explain select count(*) from turns")] == ["physical_plan"]
    assert len(query("--run", "s", "explain analyze select count(*) from turns")) == 1
    assert query("--run", "s", "--named", "run_summary")[0]["trajectories"] == 3
    assert [r["tool_name"] for r in query("--named", "tool_statistics")] == ["search", "python"]


@pytest.mark.parametrize("sql", ["select 1", "SELECT 1;", "with a as (select 1) select * from a", "from turns",
                                 "values (1)", "describe turns", "summarize turns", "explain select 1",
                                 "EXPLAIN (FORMAT JSON) SELECT 1", "  explain  analyze select 1"])
def test_check_read_only_allows(sql: str) -> None:
    check_read_only(sql)


def test_parse_errors_are_one_line() -> None:
    with pytest.raises(LibraError, match=r"^query failed: Parser Error: syntax error at or near \"selec\""):
        check_read_only("selec 1")


@pytest.mark.parametrize("sql", [
    "select count(*) from range(1000000000000)",
    "with recursive r(n) as (select 1 union all select n + 1 from r) select count(*) from r",
])
def test_a_runaway_query_is_stopped_at_the_time_limit(store: Path, tmp_path: Path, capsys: pytest.CaptureFixture,
                                                      sql: str) -> None:
    import time

    config = tmp_path / "c.yaml"
    config.write_text(f"store:\n  root: {store}\n  query_timeout_s: 1.5\n")
    began = time.monotonic()
    code = main(["query", "--config", str(config), "--run", "s", sql])
    out, err = capsys.readouterr()
    assert (code, out) == (2, "")
    assert err == ("libra: error: query stopped after 1.5 s (store.query_timeout_s): narrow it (a WHERE on step, a "
                   "LIMIT) or raise the limit\n")
    assert time.monotonic() - began < 20
    with Catalog(store, "s", timeout_s=1.5) as catalog:  # and the catalog still answers
        assert catalog.query("select count(*) as n from turns").to_pylist() == [{"n": 6}]


def test_max_rows_must_not_be_negative(store: Path, capsys: pytest.CaptureFixture) -> None:
    code = main(["query", "--run", "s", "--store", str(store), "--max-rows", "-5", "select 1"])
    assert (code, capsys.readouterr().err) == (2, "libra: error: --max-rows must be 0 to 1,000,000,000 (rows shown in "
                                                  "table output), got -5\n")
    code = main(["query", "--run", "s", "--store", str(store), "--max-rows", "99999999999999999999", "select 1"])
    assert (code, capsys.readouterr().err) == (2, "libra: error: --max-rows must be 0 to 1,000,000,000 (rows shown in "
                                                  "table output), got 99999999999999999999\n")


def test_a_shard_its_manifest_lists_that_is_gone_is_one_line_naming_it(store: Path) -> None:
    (store / SHARD).unlink()
    with pytest.raises(LibraError, match=rf"^run 's': turns shard {store.absolute() / SHARD} listed by its manifest is "
                                         r"missing; import it again whole: libra traces import t\.csv --run s --replace$"):
        Catalog(store, "s")
    with Catalog(store, "other") as catalog:  # another run of the store still reads
        assert catalog.query("select count(*) as n from turns").to_pylist() == [{"n": 6}]


def test_a_store_whose_path_duckdb_would_expand_is_refused(tmp_path: Path) -> None:
    with pytest.raises(LibraError, match=r"its path holds one of \*\?\[, which DuckDB reads as a pattern"):
        Catalog(tmp_path / "st*r")


def test_values_python_cannot_hold_and_control_characters_are_shown_as_text(store: Path,
                                                                            capsys: pytest.CaptureFixture) -> None:
    sql = "select 'infinity'::timestamp as t, '-infinity'::date as d, chr(27) || '[31mred' as s, 2 as n"
    assert main(["query", "--run", "s", "--store", str(store), sql]) == 0
    assert capsys.readouterr().out.splitlines()[2].split() == [
        "<value", "out", "of", "range:", "9223372036854775807>", "<value", "out", "of", "range:", "-2147483647>",
        "\\x1b[31mred", "2"]  # the escape is shown, never sent to the terminal
    assert main(["query", "--run", "s", "--store", str(store), "--json", sql]) == 0
    assert json.loads(capsys.readouterr().out) == [{"t": "<value out of range: 9223372036854775807>",
                                                    "d": "<value out of range: -2147483647>", "s": "\x1b[31mred", "n": 2}]
    # a column named by stored text (a PIVOT over an imported trace's tool names) is shown as text too
    assert main(["query", "--run", "s", "--store", str(store), "select 1 as \"\x1b]0;owned\x07x\", 2 as n"]) == 0
    assert capsys.readouterr().out.splitlines()[:2] == ["\\x1b]0;owned\\x07x  n", "-" * 17 + "  -"]
