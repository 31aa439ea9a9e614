"""Reading a config: YAML files and dotted overrides into a `LibraConfig`, and the one-line errors.

`load_config` answers any file at all with a config or a `ConfigError` naming the file: it reads at
most `MAX_CONFIG_BYTES` (a config is a short file), decodes UTF-8, parses with a safe loader that
refuses duplicate keys, and refuses documents whose aliases expand to more than `MAX_CONFIG_VALUES`
values (an alias bomb is refused at once instead of being expanded while the error is written), or
that hold a NUL character (no path can). Values quoted in errors are cut short.
"""

from __future__ import annotations

import os
import reprlib
import stat
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from libra.config import LibraConfig
from libra.errors import ConfigError

MAX_CONFIG_BYTES = 1 << 20  # a config file larger than this is refused unread
MAX_CONFIG_VALUES = 100_000  # mappings, lists and scalars a config may hold once aliases are expanded


def load_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> LibraConfig:
    """Load a YAML config (or the embedded defaults when `path` is None), then apply overrides.

    `overrides` maps dotted keys to values, e.g. {"store.root": "/data/store"}.
    """
    data: dict[str, Any] = {}
    source = "embedded defaults"
    if path is not None:
        if not str(path).strip():  # Path("") is the working directory: "not a regular file" said nothing useful
            raise ConfigError("the config file's name is empty: give a YAML file (--config FILE.yaml), or none "
                              "for the embedded defaults")
        source = str(path)
        data = _read_yaml(Path(path))
    for dotted, value in (overrides or {}).items():
        _set_dotted(data, dotted, value)
    try:
        return LibraConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{source}: {describe_validation_error(exc, LibraConfig)}") from None


def resolve_config(config: LibraConfig | str | Path | None = None,
                   overrides: dict[str, Any] | None = None) -> LibraConfig:
    """The config a flow runs with: a `LibraConfig` as given, a YAML file's path (a deployment's
    parameter), or the embedded defaults (None); then `overrides` (dotted keys, values of None left
    out). One function for the CLI and the flows, so both refuse the same values with the same line."""
    overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
    if not isinstance(config, LibraConfig):
        return load_config(config, overrides)
    if not overrides:
        return config
    data = config.model_dump()
    for dotted, value in overrides.items():
        _set_dotted(data, dotted, value)
    try:
        return LibraConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(exc, LibraConfig)) from None


class _UniqueKeyLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """yaml.safe_load's loader, refusing a key given twice in one mapping (YAML says keys are unique;
    PyYAML would keep the last one silently). Keys brought in by a merge (`<<: *base`) may be overridden."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, yaml.ScalarNode):
                continue
            key = self.construct_object(key_node)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {_shown(key)}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def tracking_uri_in_use(config: LibraConfig) -> str:
    """The MLflow tracking URI every command uses: MLFLOW_TRACKING_URI where the environment sets it
    (it overrides tracking.tracking_uri, as it does for MLflow's own clients), checked as that is;
    else tracking.tracking_uri."""
    from libra.config import check_tracking_uri

    if "MLFLOW_TRACKING_URI" not in os.environ:
        return config.tracking.tracking_uri
    try:
        return check_tracking_uri(os.environ["MLFLOW_TRACKING_URI"], "MLFLOW_TRACKING_URI")
    except ValueError as exc:
        raise ConfigError(f"{exc} (or unset it)") from None


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO without a writer would block the open
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config ({exc.strerror}); pass an existing YAML file") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ConfigError(f"{path}: not a regular file; pass a YAML file")
    with os.fdopen(fd, "rb") as fh:
        try:
            raw = fh.read(MAX_CONFIG_BYTES + 1)
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read config ({exc.strerror}); pass an existing YAML file") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_CONFIG_BYTES:,} bytes; a config is a short YAML file")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start}); "
                          "a config is a YAML file") from None
    try:
        loaded = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a safe loader
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({_first_line(exc)})") from None
    except RecursionError:
        raise ConfigError(f"{path}: not valid YAML (nested too deeply)") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections, got {type(loaded).__name__}")
    _check_values(path, loaded)
    return loaded


def _first_line(exc: yaml.YAMLError) -> str:
    """'<problem> at line L, column C' of a parser error, on one line."""
    problem = getattr(exc, "problem", None)
    mark = getattr(exc, "problem_mark", None)
    if problem and mark is not None:
        return " ".join(f"{problem} at line {mark.line + 1}, column {mark.column + 1}".split())
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def _check_values(path: Path, data: dict[str, Any]) -> None:
    """Walk the document once (iteratively, at most MAX_CONFIG_VALUES values): refuse alias bombs and
    self-referencing aliases, and strings with a NUL character."""
    stack: list[tuple[str, Any]] = [("", data)]
    count = 0
    while stack:
        key, value = stack.pop()
        count += 1
        if count > MAX_CONFIG_VALUES:
            raise ConfigError(f"{path}: the document expands to more than {MAX_CONFIG_VALUES:,} values "
                              "(aliases repeating aliases?); a config is a short YAML file")
        if isinstance(value, dict):
            stack.extend((f"{key}.{k}" if key else str(k), v) for k, v in value.items())
            stack.extend(("(a key)", k) for k in value)
        elif isinstance(value, list):
            stack.extend((f"{key}[{i}]", v) for i, v in enumerate(value))
        elif isinstance(value, str) and "\x00" in value:
            raise ConfigError(f"{path}: {_shown(key, 80)}: a value holds a NUL character")


def _set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = data
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {dotted}: {part} is not a section")
        node = child
    node[parts[-1]] = value


def describe_validation_error(exc: ValidationError, model: type[BaseModel]) -> str:
    """One line per problem: the dotted key, the value given and what is allowed."""
    lines = []
    for error in exc.errors():
        key = ".".join(str(p) for p in error["loc"])
        if not error["loc"]:  # a rule across keys (a model's validator): its message names them
            lines.append(error["msg"].removeprefix("Value error, "))
            continue
        if error["type"] == "extra_forbidden":
            parent = _model_at(model, error["loc"][:-1])
            allowed = ", ".join(parent.model_fields) if parent else "see configs/default.yaml"
            lines.append(f"unknown key {_shown(key, 80)}; allowed keys here: {allowed}")
            continue
        allowed = _allowed(model, error["loc"])
        value = error.get("input")
        lines.append(f"{_shown(key, 80, quote=False)} = {_shown(value)}: {error['msg']}" + (f" (allowed: {allowed})" if allowed else ""))
    return "; ".join(lines)


_SHORT = reprlib.Repr()
_SHORT.maxstring = _SHORT.maxother = 60
_SHORT.maxlevel, _SHORT.maxlist, _SHORT.maxdict = 2, 4, 4


def _shown(value: Any, limit: int = 60, quote: bool = True) -> str:
    """`value` as an error message quotes it: its repr, cut to about `limit` characters."""
    if isinstance(value, str) and not quote:
        return value if len(value) <= limit else value[:limit] + "..."
    text = _SHORT.repr(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _model_at(model: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    current: type[BaseModel] | None = model
    for part in loc:
        if current is None or part not in current.model_fields:
            return None
        annotation = current.model_fields[part].annotation
        current = annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None
    return current


def _allowed(model: type[BaseModel], loc: tuple[Any, ...]) -> str:
    """The range or choices of the field at `loc`, e.g. '1024 <= value <= 67108864'."""
    parent = _model_at(model, loc[:-1])
    if parent is None or loc[-1] not in parent.model_fields:
        return ""
    info = parent.model_fields[loc[-1]]
    low = high = None
    for meta in info.metadata:
        for name, op in (("ge", "<="), ("gt", "<")):
            if getattr(meta, name, None) is not None:
                low = f"{getattr(meta, name)} {op} "
        for name, op in (("le", "<="), ("lt", "<")):
            if getattr(meta, name, None) is not None:
                high = f" {op} {getattr(meta, name)}"
    if low or high:
        return f"{low or ''}value{high or ''}"
    args = getattr(info.annotation, "__args__", None)
    if args and all(isinstance(a, str) for a in args):
        return "one of " + ", ".join(args)
    return ""


def default_config_yaml() -> str:
    """The embedded defaults as YAML (what configs/default.yaml holds)."""
    return yaml.safe_dump(LibraConfig().model_dump(), sort_keys=False)
