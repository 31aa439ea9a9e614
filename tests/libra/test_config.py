import os
import re
import time
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from libra.config import LibraConfig, StoreConfig
from libra.config_loading import MAX_CONFIG_BYTES, load_config, resolve_config
from libra.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def test_default_yaml_equals_embedded_defaults() -> None:
    assert load_config(ROOT / "configs" / "default.yaml") == LibraConfig()
    assert load_config(None) == LibraConfig()


def test_every_preset_validates() -> None:
    for preset in sorted((ROOT / "configs").glob("*.yaml")):
        load_config(preset)


def test_unknown_key_names_key_and_allowed(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"store": {"roots": "/x"}}))
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value) == (
        f"{path}: unknown key 'store.roots'; allowed keys here: root, compression, row_group_rows, fsync, duckdb_threads, query_timeout_s"
    )


def test_unknown_section(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("planer: {}\n")
    with pytest.raises(ConfigError, match="unknown key 'planer'; allowed keys here: store, traces, planner, scheduler, pool, tracking, dashboard, orchestration"):
        load_config(path)


def test_out_of_range_names_value_and_range(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("traces:\n  prompts_per_step: 0\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value) == (
        f"{path}: traces.prompts_per_step = 0: Input should be greater than or equal to 1 "
        "(allowed: 1 <= value <= 100000)"
    )


def test_choice_lists_choices() -> None:
    with pytest.raises(ConfigError, match=r"store.compression = 'brotli'.*allowed: one of zstd, snappy, lz4, gzip, none"):
        load_config(overrides={"store.compression": "brotli"})


def test_overrides_apply() -> None:
    assert load_config(overrides={"store.root": "/data/x"}).store.root == "/data/x"


def test_bad_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config"):
        load_config(tmp_path / "absent.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(tmp_path / "list.yaml")
    (tmp_path / "bad.yaml").write_text("store: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(tmp_path / "bad.yaml")
    (tmp_path / "empty.yaml").write_text("")
    assert load_config(tmp_path / "empty.yaml") == LibraConfig()


def test_configs_are_frozen() -> None:
    config = LibraConfig()
    with pytest.raises(ValidationError):
        config.store.root = "/elsewhere"  # type: ignore[misc]


def _error(path: Path, data: bytes) -> str:
    path.write_bytes(data)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert message.startswith(f"{path}: ") and "\n" not in message
    return message[len(f"{path}: "):]


def test_bytes_that_are_not_utf8(tmp_path: Path) -> None:
    assert _error(tmp_path / "c.yaml", b"store:\n  root: \xff\xfe\n") == (
        "not UTF-8 text (byte 0xff at offset 15); a config is a YAML file")
    assert load_config(_write(tmp_path / "bom.yaml", b"\xef\xbb\xbfstore: {root: /b}\n")).store.root == "/b"


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_duplicate_keys_are_refused_but_merges_may_override(tmp_path: Path) -> None:
    assert _error(tmp_path / "c.yaml", b"store: {root: /a}\ntraces: {}\nstore: {root: /b}\n") == (
        "not valid YAML (duplicate key 'store' at line 3, column 1)")
    assert _error(tmp_path / "c.yaml", b"store:\n  root: /a\n  fsync: false\n  root: /b\n") == (
        "not valid YAML (duplicate key 'root' at line 4, column 3)")
    merged = _write(tmp_path / "m.yaml", b"store: &s {root: /a, fsync: false}\ntracking: {}\n"
                    b"orchestration:\n  prefect_home: /p\n")
    assert load_config(merged).store == StoreConfig(root="/a", fsync=False)
    merged.write_bytes(b"store:\n  <<: {root: /a, fsync: false}\n  root: /b\n")
    assert load_config(merged).store == StoreConfig(root="/b", fsync=False)


def test_alias_bombs_are_refused_at_once(tmp_path: Path) -> None:
    lines = ['a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for name, previous in zip("bcdefghi", "abcdefgh", strict=True):
        lines.append(f"{name}: &{name} [{', '.join(['*' + previous] * 9)}]")
    lines.append("store: {root: *i}")  # 9**9 strings once expanded
    started = time.perf_counter()
    assert _error(tmp_path / "c.yaml", "\n".join(lines).encode()) == (
        "the document expands to more than 100,000 values (aliases repeating aliases?); a config is a short YAML file")
    assert time.perf_counter() - started < 2.0
    assert _error(tmp_path / "c.yaml", b"store: &s [*s]\n").startswith("the document expands to more than 100,000 values")


def test_large_deep_and_nul_documents(tmp_path: Path) -> None:
    assert _error(tmp_path / "c.yaml", b"#" * (MAX_CONFIG_BYTES + 1)) == (
        "larger than 1,048,576 bytes; a config is a short YAML file")
    assert _error(tmp_path / "c.yaml", b"store: " + b"[" * 5000 + b"]" * 5000).startswith("not valid YAML (")
    assert _error(tmp_path / "c.yaml", b'store: {root: "/a\\0b"}\n') == "'store.root': a value holds a NUL character"
    assert _error(tmp_path / "c.yaml", b"42\n") == "the top level must be a mapping of sections, got int"
    assert _error(tmp_path / "c.yaml", b"store: !!python/object/apply:os.system [ls]\n") == (
        "not valid YAML (could not determine a constructor for the tag 'tag:yaml.org,2002:python/object/apply:os.system' "
        "at line 1, column 8)")
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)  # nothing writes to it: opening it to read waited for ever
    for path in (tmp_path, fifo, Path("/dev/zero")):
        with pytest.raises(ConfigError) as info:
            load_config(path)
        assert str(info.value) == f"{path}: not a regular file; pass a YAML file"
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "missing.yaml")
    assert str(info.value) == f"{tmp_path / 'missing.yaml'}: cannot read config (No such file or directory); pass an existing YAML file"


def test_long_values_are_cut_short_in_errors(tmp_path: Path) -> None:
    assert _error(tmp_path / "c.yaml", f"store: {{compression: {'z' * 500}}}\n".encode()) == (
        f"store.compression = {repr('z' * 500)[:60]}...: Input should be 'zstd', 'snappy', 'lz4', 'gzip' or 'none' "
        "(allowed: one of zstd, snappy, lz4, gzip, none)")
    assert _error(tmp_path / "c.yaml", b"store: {root: [[1, 2, 3, 4, 5, 6], {a: 1}]}\n") == (
        "store.root = [[1, 2, 3, 4, ...], {'a': 1}]: Input should be a valid string")


def test_hybrids_need_a_split_on_cpu_workers_and_a_schedule_within_them() -> None:
    with pytest.raises(ConfigError, match="hybrids are rollout workers that also train.*not colocated"):
        load_config(overrides={"placement.strategy": "colocated", "placement.hybrids": 1})
    with pytest.raises(ConfigError, match="placed on CPU workers only so far"):
        load_config(overrides={"placement.strategy": "static", "placement.hybrids": 1, "rollout.device": "cuda",
                               "rollout.engine": "vllm"})
    with pytest.raises(ConfigError, match=r"hybrid_schedule \{3: 2\}: .*counts 0..placement.hybrids \(1\)"):
        load_config(overrides={"placement.strategy": "static", "placement.hybrids": 1, "placement.hybrid_schedule": {3: 2}})
    config = load_config(overrides={"placement.strategy": "libra", "placement.hybrids": 1,
                                    "placement.hybrid_schedule": {0: 1, 6: 0}, "rollout.engine": "vllm"})
    assert (config.placement.hybrids, config.placement.hybrid_schedule) == (1, {0: 1, 6: 0})


def test_a_rule_across_sections_is_one_line_naming_its_keys() -> None:
    with pytest.raises(ConfigError, match=r": placement.strategy static overlaps rollout and training \(one-step-off\): "
                                          r"trainer.max_staleness must be >= 1 \(or use placement.strategy colocated\)$"):
        load_config(overrides={"placement.strategy": "static", "trainer.pipeline": "sync", "trainer.max_staleness": 0})


def test_a_ray_cluster_is_for_placed_runs_and_gives_the_transformers_engine_actors_of_its_own() -> None:
    with pytest.raises(ConfigError, match=r"cluster.ray_address '10.0.0.1:6379': a run on a Ray cluster is placed on its "
                                          r"hosts' workers; set placement.strategy to libra, static or colocated$"):
        load_config(overrides={"cluster.ray_address": "10.0.0.1:6379"})
    with pytest.raises(ConfigError, match="rollout.engine hf"):
        load_config(overrides={"placement.strategy": "static", "rollout.engine": "hf"})
    config = load_config(overrides={"placement.strategy": "static", "rollout.engine": "hf", "cluster.ray_address": "auto"})
    assert (config.cluster.ray_address, config.cluster.start_timeout_s) == ("auto", 120.0)


def test_resolve_config_takes_a_record_a_file_or_the_defaults_then_the_overrides(tmp_path) -> None:
    from libra.config import LibraConfig
    from libra.config_loading import resolve_config

    path = tmp_path / "c.yaml"
    path.write_text("trainer: {steps: 7}\n")
    assert resolve_config(str(path)).trainer.steps == 7
    assert resolve_config(None, {"trainer.steps": 3, "trainer.run": None}).trainer.steps == 3  # None: left as it is
    record = LibraConfig()
    assert resolve_config(record) is record
    assert resolve_config(record, {"trainer.env": "search"}).trainer.env == "search"
    with pytest.raises(ConfigError, match=r"^trainer.steps = 0: Input should be greater than or equal to 1"):
        resolve_config(record, {"trainer.steps": 0})


def test_a_parallel_layout_needs_the_megatron_backend():
    from libra.config import TrainerConfig

    with pytest.raises(ValueError, match="trainer.tp/pp/dp \\(2/1/1\\) are the megatron backend's layout"):
        TrainerConfig(tp=2)
    assert TrainerConfig(backend="megatron", tp=2, pp=2).dp == 1


def test_a_planned_layout_is_megatrons_and_needs_a_placement_and_no_fixed_degrees():
    from libra.config import TrainerConfig

    with pytest.raises(ValueError, match="trainer.layout planned runs the planner's tp x pp x dp on megatron's ranks"):
        TrainerConfig(layout="planned")
    with pytest.raises(ValueError, match="trainer.tp/pp/dp \\(1/1/2\\) fix the layout that trainer.layout planned "
                                         "leaves to the planner"):
        TrainerConfig(backend="megatron", layout="planned", dp=2)
    with pytest.raises(ConfigError, match="trainer.layout planned takes the layout the planner chooses for the "
                                          "trainer's workers; set placement.strategy to libra, static or colocated"):
        load_config(overrides={"trainer.backend": "megatron", "trainer.layout": "planned"})
    config = load_config(overrides={"trainer.backend": "megatron", "trainer.layout": "planned",
                                    "placement.strategy": "colocated", "rollout.engine": "vllm"})
    assert (config.trainer.layout, config.trainer.tp, config.trainer.dp) == ("planned", 1, 1)


def test_the_planner_section_is_the_planners_settings() -> None:
    """The planner's dials are declared once, in its settings records: the section is each of them
    (the trigger takes it as it is) and the records taken out of it are the planner's defaults."""
    from libra.config import PlannerConfig
    from libra.planner.cost_model import CostModel, RolloutSettings, TrainingSettings
    from libra.planner.planner import PlannerSettings, SearchDials
    from libra.planner.profiles import MODELS, parse_cluster
    from libra.planner.trigger import TriggerSettings

    section = PlannerConfig()
    assert isinstance(section, TriggerSettings) and isinstance(section, SearchDials)
    assert PlannerSettings.of(section) == PlannerSettings() and TriggerSettings.of(section) == TriggerSettings()
    cost = CostModel.configured(parse_cluster("1x8:a800"), MODELS["qwen3-8b"], section)
    assert (cost.training, cost.rollout) == (TrainingSettings(), RolloutSettings())
    tuned = load_config(overrides={"planner.period_steps": 3, "planner.zero_stage": 3, "planner.granularity": 8}).planner
    assert tuned.period_steps == 3 and PlannerSettings.of(tuned).granularity == 8
    assert CostModel.configured(parse_cluster("1x8:a800"), MODELS["qwen3-8b"], tuned).training.zero_stage == 3


def test_a_planner_dial_out_of_range_names_its_key_and_range() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(overrides={"planner.period_steps": 0})
    assert str(info.value) == ("embedded defaults: planner.period_steps = 0: Input should be greater than or equal to 1 "
                               "(allowed: 1 <= value <= 100000)")


def test_the_config_imports_nothing_above_it() -> None:
    """libra.config sits below the subsystems it configures: importing it loads no pool, trainer or
    rollout module (the planner's settings records, which it composes, are pure)."""
    import subprocess
    import sys

    code = "import sys, libra.config; print(sorted(m for m in sys.modules if m.startswith('libra')))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert not any(f"'libra.{layer}" in loaded for layer in ("pools", "trainer", "rollout", "rl", "sim")), loaded


@pytest.mark.parametrize(("yaml_text", "key"), [
    ("trainer:\n  steps: true\n", "trainer.steps = True"),
    ("trainer:\n  lr: false\n", "trainer.lr = False"),
    ("planner:\n  period_steps: yes\n", "planner.period_steps = True"),  # YAML 1.1's yes is a boolean
    ("store:\n  query_timeout_s: on\n", "store.query_timeout_s = True"),
])
def test_booleans_are_not_numbers(tmp_path: Path, yaml_text: str, key: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(yaml_text)
    with pytest.raises(ConfigError, match=f"^{path}: {key}: Value error, a number is needed here, not "):
        load_config(path)
    with pytest.raises(ConfigError, match="a number is needed here"):  # a command line's override the same
        resolve_config(None, {key.split(" = ")[0]: True})
    assert load_config(None, {"store.fsync": False}).store.fsync is False  # booleans stay booleans


def test_epochs_beyond_one_are_the_torch_trainers() -> None:
    assert LibraConfig.model_validate({"trainer": {"epochs": 4}}).trainer.epochs == 4
    for other in ({"trainer": {"epochs": 2, "backend": "megatron"}},
                  {"trainer": {"epochs": 2}, "placement": {"strategy": "static", "hybrids": 1}}):
        with pytest.raises(ValueError, match="trainer.epochs 2: several optimizer steps per update are the torch"):
            LibraConfig.model_validate(other)


def test_a_tracking_uri_mlflow_cannot_open_is_refused_up_front() -> None:
    with pytest.raises(ConfigError, match=r"tracking_uri 'bogus://x': MLflow has no tracking store for 'bogus'"):
        load_config(overrides={"tracking.tracking_uri": "bogus://x"})
    with pytest.raises(ConfigError, match=r"tracking_uri is empty"):
        load_config(overrides={"tracking.tracking_uri": " "})
    for uri in ("sqlite:///a.db", "file:/tmp/m", "https://mlflow.example", "postgresql+psycopg2://u@h/db", "/tmp/m"):
        assert load_config(overrides={"tracking.tracking_uri": uri}).tracking.tracking_uri == uri


def test_a_tracking_database_that_is_not_mlflows_is_one_line(tmp_path: Path) -> None:
    from flows.runtime import open_mlflow_store
    from libra.errors import LibraError

    (tmp_path / "bad.db").write_text("not a database\n")
    with pytest.raises(LibraError, match=r"^MLflow's tracking store sqlite:///.*/bad.db cannot be opened \(DatabaseError: "
                                         r".*file is not a database\); point tracking.tracking_uri at a new file"):
        open_mlflow_store(f"sqlite:///{tmp_path / 'bad.db'}")
    assert (tmp_path / "bad.db").read_text() == "not a database\n"


def test_a_tracking_store_that_is_a_file_or_a_server_that_does_not_answer_is_one_line(tmp_path: Path, monkeypatch) -> None:
    """A plain path named a file went to MLflow (a 209-line traceback); a server that does not answer
    kept MLflow's client retrying, silent, for minutes (a bad-input review); a directory is a store
    MLflow opens again (it refuses those unless told)."""
    import socket

    import mlflow

    from flows.runtime import open_mlflow_store
    from libra.errors import LibraError

    (tmp_path / "notes.txt").write_text("mine\n")
    for uri in (str(tmp_path / "notes.txt"), f"file:{tmp_path / 'notes.txt'}"):
        with pytest.raises(LibraError, match=r"^MLflow's tracking store .*notes.txt is a file, not a directory: point "
                                             r"tracking.tracking_uri at a directory or an MLflow database"):
            open_mlflow_store(uri)
    assert (tmp_path / "notes.txt").read_text() == "mine\n"
    with socket.socket() as unused:  # a port nothing listens on
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    started = time.monotonic()
    with pytest.raises(LibraError, match=rf"^MLflow's tracking server http://127.0.0.1:{port} cannot be reached "
                                         r"\(Connection refused\); start it, fix tracking.tracking_uri, or run with --no-track$"):
        open_mlflow_store(f"http://127.0.0.1:{port}")
    assert time.monotonic() - started < 5
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "")  # (so that it is unset again after the test)
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE")
    open_mlflow_store(str(tmp_path / "mlruns"))
    assert mlflow.MlflowClient(tracking_uri=str(tmp_path / "mlruns")).search_experiments() is not None


@pytest.mark.parametrize("bounds", [[], [-1], [1, 2, 3], [5000, 500]])
def test_payload_bounds_that_are_not_two_increasing_counts_say_so(bounds: list[int]) -> None:
    with pytest.raises(ConfigError, match=rf"payload_bounds must be two increasing positive token counts, got "
                                          rf"{re.escape(str(bounds))}$"):
        load_config(overrides={"scheduler.payload_bounds": bounds})
