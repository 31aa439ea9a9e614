from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from libra.config import LibraConfig, load_config
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
        f"{path}: unknown key 'store.roots'; allowed keys here: root, compression, row_group_rows, fsync, duckdb_threads"
    )


def test_unknown_section(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("planer: {}\n")
    with pytest.raises(ConfigError, match="unknown key 'planer'; allowed keys here: store, traces, planner, scheduler, pool, tracking, orchestration"):
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
