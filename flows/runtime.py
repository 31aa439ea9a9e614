"""Process environment for Prefect and MLflow on embedded defaults: local files, no server, no telemetry.

`prepare_runtime` is called by whatever tracks runs (CLI commands, flows), before Prefect or MLflow is imported.
Values already set in the environment win, so a user pointing at a Prefect server or MLflow server
keeps them. Both libraries log at WARNING (to stderr, like every log line of `libra`).

Two `libra` processes may start at once in a fresh directory, and both libraries create and migrate
their SQLite databases on first use, which is not safe twice at once (MLflow's migration fails with
"Online migration expected to match one row", Prefect's servers race likewise). So the first use is
serialised with a file lock: `prepare_runtime` opens MLflow's store (creating its tables) under a
lock beside the database file, and `start_prefect` starts Prefect's temporary server (which migrates
Prefect's database before it answers) under a lock in PREFECT_HOME, before any flow needs it. A
second process waits on the lock and then finds the databases ready.

`held_logs` keeps the log lines of a flow from the terminal while it runs, and prints them after
it, unless it ended with an expected error: then the CLI's one line says all (Prefect otherwise
logs the exception, with its traceback, before the CLI gets to say anything).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import SplitResult, unquote, urlsplit

from libra.config import LibraConfig
from libra.config_loading import tracking_uri_in_use
from libra.errors import LibraError, first_line
from libra.files import absolute_tracking_uri

# what keeps both libraries quiet and at home; they read these when they are imported
QUIET = {
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_LOGGING_LEVEL": "WARNING",
    # Prefect gives its temporary server 20 s to answer; a loaded machine (or a second run starting
    # beside the first) can take longer
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180",
    "MLFLOW_LOGGING_LEVEL": "WARNING",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "DO_NOT_TRACK": "1",
}


def quiet_environment() -> None:
    """The QUIET variables, where the environment does not set them. Both libraries read their
    logging levels when they are imported, so a caller that imports a flow module (which imports
    Prefect) sets them first: `cli.main` does, before any command runs. Nothing is created (Prefect's
    home is named only by `prepare_runtime`: importing Prefect creates the directory it names)."""
    for key, value in QUIET.items():
        os.environ.setdefault(key, value)
    for key in ("PREFECT_API_URL", "PREFECT_HOME"):  # empty is unset (Prefect took an empty URL for a server,
        if key in os.environ and not os.environ[key].strip():  # and an empty home for the working directory)
            del os.environ[key]


def prepare_runtime(config: LibraConfig, tracking: bool = True) -> None:
    """Prefect's and MLflow's environment from `config`, where the environment does not set it;
    with `tracking`, MLflow's store is opened (its database created). Prefect's home is created
    only when it is the one in use (not when PREFECT_HOME is set, or a server is named)."""
    quiet_environment()
    uri = tracking_uri_in_use(config)
    if "MLFLOW_TRACKING_URI" not in os.environ:  # (working a relative path out makes its database's folder)
        uri = absolute_tracking_uri(uri, create=tracking)
    home = str(Path(config.orchestration.prefect_home).resolve())
    given = os.environ.get("PREFECT_HOME")
    if given is not None and Path(given).exists() and not Path(given).is_dir():
        raise LibraError(f"PREFECT_HOME={given} is not a directory; point it at a directory for Prefect's database, "
                         "or unset it for orchestration.prefect_home")
    ours = "PREFECT_HOME" not in os.environ and "PREFECT_API_URL" not in os.environ
    if tracking:  # first: a store refused leaves no Prefect home behind, and the environment as it was
        check_artifact_root(Path(config.tracking.artifact_root))
        open_mlflow_store(uri)
    os.environ.setdefault("MLFLOW_TRACKING_URI", uri)
    os.environ.setdefault("PREFECT_HOME", home)
    if ours:
        Path(home).mkdir(parents=True, exist_ok=True)


def check_artifact_root(root: Path) -> None:
    """A LibraError unless `root` is, or can be made, a directory this process writes in (it was found
    unusable only when the first run was logged: after a whole training, and at every rerun). Nothing
    is created."""
    existing = root.absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    why = ("Not a directory" if not existing.is_dir() else
           "Permission denied" if not os.access(existing, os.W_OK | os.X_OK) else None)
    if why is not None:
        raise LibraError(f"tracking.artifact_root {root}: {why}; point it at a directory MLflow can write its "
                         "artifacts in")


def flow_config(config: LibraConfig | str | None, overrides: dict | None = None, tracking: bool = True) -> LibraConfig:
    """What a flow does first: its config (a LibraConfig, a YAML file's path, or the embedded
    defaults, then the overrides; `libra.config_loading.resolve_config`) and the runtime it describes. A
    deployment run gets here with Prefect already configured by its worker; the CLI, having
    prepared both before the flow started, gets the same values again."""
    from libra.config_loading import resolve_config

    resolved = resolve_config(config, overrides)
    prepare_runtime(resolved, tracking)
    return resolved


def quiet_engines() -> None:
    """Keep the engines' start-up and per-reload lines, and their worker processes' deprecation
    warnings, off the terminal (vLLM logs to stdout by default: to stderr, errors only), unless the
    environment says otherwise. Call before an engine is made."""
    for key, value in (("VLLM_LOGGING_STREAM", "ext://sys.stderr"), ("VLLM_LOGGING_LEVEL", "ERROR"),
                       ("PYTHONWARNINGS", "ignore"), ("TORCH_CPP_LOG_LEVEL", "ERROR")):
        os.environ.setdefault(key, value)


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive lock on `path` (created if missing) for the block; other processes wait. The
    kernel releases it if the process dies. Without fcntl (not POSIX) the block runs unlocked."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def open_mlflow_store(uri: str) -> None:
    """Open MLflow's tracking store once: a SQLite database's tables created under a lock, a
    directory store (MLflow keeps those behind `MLFLOW_ALLOW_FILE_STORE`, set here unless the
    environment says otherwise) checked to be a directory, a server checked to answer at its health path (`/health`) as MLflow does.
    Each fails in one line (`LibraError`) rather than deep in the first flow that logs."""
    prefix = "sqlite:///"
    if uri.startswith(("http://", "https://")):
        reach_server(uri)
        return
    directory = file_store_directory(uri)
    if directory is not None:
        if directory.exists() and not directory.is_dir():
            raise LibraError(f"MLflow's tracking store {uri} is a file, not a directory: point tracking.tracking_uri at "
                             "a directory or an MLflow database (sqlite:///FILE.db), or run with --no-track")
        allow_file_store(uri)
        return
    if not uri.startswith(prefix):
        return  # another database: nothing to create here
    import mlflow

    with file_lock(Path(uri[len(prefix):] + ".lock")):
        try:
            mlflow.MlflowClient(tracking_uri=uri).search_experiments(max_results=1)
        except Exception as exc:  # a file that is not MLflow's database (or is not a database at all)
            raise store_error(uri, exc) from None


def file_store_directory(uri: str) -> Path | None:
    """The directory of a directory store (`file:DIR`, `file:///DIR`, or a plain path); None for a
    database or a server."""
    if uri.startswith("file:"):
        return Path(uri.removeprefix("file://") if uri.startswith("file://") else uri.removeprefix("file:"))
    return None if "://" in uri else Path(uri)


def allow_file_store(uri: str) -> None:
    """Let MLflow open `uri` if it is a directory store: MLflow 3 refuses those unless
    `MLFLOW_ALLOW_FILE_STORE` is set (set here unless the environment says)."""
    if file_store_directory(uri) is not None:
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")


def store_error(uri: str, exc: BaseException) -> LibraError:
    """MLflow's tracking store at `uri` failed to open with `exc`: one line that says what to do."""
    return LibraError(f"MLflow's tracking store {uri} cannot be opened ({first_line(exc, typed=True)}); point "
                      "tracking.tracking_uri at a new file or an MLflow database, or run with --no-track")


@dataclass(frozen=True)
class Server:
    """A server a flow talks to, as `reach_server` checks it and says what to do."""

    what: str
    bad_address: str  # what to do about an address that is not one, or not this server's
    unreachable: str  # what to do about a server that does not answer
    health: str  # the path under its address that answers when it is this server


MLFLOW_SERVER = Server("MLflow's tracking server", "fix tracking.tracking_uri (or MLFLOW_TRACKING_URI)",
                       "start it, fix tracking.tracking_uri, or run with --no-track", "/health")
PREFECT_SERVER = Server("Prefect's server (PREFECT_API_URL)", "fix PREFECT_API_URL, e.g. http://127.0.0.1:4200/api",
                        "start it (prefect server start --host 127.0.0.1), fix PREFECT_API_URL, or unset it to run "
                        "without a server", "/health")


def reach_server(uri: str, timeout_s: float = 10.0, server: Server | None = None) -> None:
    """`LibraError` unless the server at `uri` accepts a connection within `timeout_s` and answers
    HTTP at its health path as the server it should be (MLflow's and Prefect's clients retry for
    minutes, then raise a traceback). `server`: which (default MLflow's tracking server)."""
    import socket

    server = server or MLFLOW_SERVER
    shown = _without_password(uri)
    try:
        parts = urlsplit(uri)
        if parts.scheme not in ("http", "https"):
            raise ValueError("not an http(s) URL")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        host = parts.hostname or "localhost"
    except ValueError as exc:  # no valid port, an unclosed IPv6 bracket, another scheme
        raise LibraError(f"{server.what} {shown} is not a valid address ({exc}); {server.bad_address}") from None
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as exc:
        raise LibraError(f"{server.what} {shown} cannot be reached ({exc.strerror or exc}); {server.unreachable}") from None
    if (wrong := _not_the_server(parts, server.health, timeout_s)) is not None:
        raise LibraError(f"{server.what} {shown} answers, but not as one ({wrong}); {server.bad_address}")


def _without_password(uri: str) -> str:
    """`uri` as a message may show it: a password in it replaced by `***`."""
    try:
        parts = urlsplit(uri)
        if parts.password is None:
            return uri
        return parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@", 1)).geturl()
    except ValueError:
        return uri


def _not_the_server(address: SplitResult, health: str, timeout_s: float) -> str | None:
    """What shows that the server at `address` is not the one meant, asked at its `health` path: no
    HTTP there, or no such path (404). None otherwise: an answer, one that needs credentials or
    refuses them, a slow one, a TLS certificate the client may be set to accept, a proxy's failure
    (each the client's own to report). Credentials in the address go as HTTP basic auth, never
    into the message."""
    import base64
    import http.client
    import urllib.error
    import urllib.request

    netloc = address.hostname if ":" not in (address.hostname or "") else f"[{address.hostname}]"
    netloc = f"{netloc}:{address.port}" if address.port else netloc
    url = address._replace(netloc=netloc, query="", fragment="").geturl().rstrip("/") + health
    request = urllib.request.Request(url)
    if address.username is not None:
        pair = f"{unquote(address.username)}:{unquote(address.password or '')}".encode()
        request.add_header("Authorization", "Basic " + base64.b64encode(pair).decode())
    try:
        with urllib.request.urlopen(request, timeout=timeout_s):  # noqa: S310 - an http(s) URL, checked above
            return None
    except urllib.error.HTTPError as exc:
        return f"GET {url}: HTTP 404" if exc.code == 404 else None
    except http.client.HTTPException as exc:  # not HTTP: another protocol on that port
        return f"GET {url}: {first_line(exc, typed=True)}"
    except (urllib.error.URLError, OSError):
        return None


def start_prefect() -> None:
    """Start Prefect's temporary server (when no PREFECT_API_URL is set) under a lock in PREFECT_HOME;
    the flows of this process then use it. Call after `prepare_runtime`."""
    from prefect.settings import PREFECT_API_URL, PREFECT_SERVER_ALLOW_EPHEMERAL_MODE

    if PREFECT_API_URL.value():
        reach_server(PREFECT_API_URL.value(), server=PREFECT_SERVER)  # before any flow: one line, not 120
        return
    if not PREFECT_SERVER_ALLOW_EPHEMERAL_MODE.value():
        return
    from prefect.server.api.server import SubprocessASGIServer

    with file_lock(Path(os.environ["PREFECT_HOME"]) / "libra-start.lock"):
        server = SubprocessASGIServer()
        started = server.server_process is None
        server.start()
    if started and server.server_process is not None:
        watch_server(server.server_process.pid)


# Stops the temporary server when the process that started it is gone without stopping it (a
# SIGKILL skips the atexit that stops it otherwise): argv = the starter's pid, the server's pid.
_WATCH = r"""
import os, signal, sys, time
parent, server = int(sys.argv[1]), int(sys.argv[2])
os.setsid()
def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
while alive(server) and os.getppid() == parent:
    time.sleep(0.5)
if alive(server) and os.getppid() != parent:
    os.kill(server, signal.SIGTERM)
    for _ in range(50):
        time.sleep(0.1)
        if not alive(server):
            break
    else:
        os.kill(server, signal.SIGKILL)
"""


def watch_server(server_pid: int) -> None:
    """A small process that stops Prefect's temporary server if this process dies without stopping
    it (`kill -9` of a training), and ends by itself when the server ends first."""
    import subprocess
    import sys

    subprocess.Popen([sys.executable, "-I", "-S", "-c", _WATCH, str(os.getpid()), str(server_pid)],
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, close_fds=True)


class _Hold(logging.Filter):
    """Attached to a handler: keeps each record it sees for later instead of letting it through."""

    def __init__(self, handler: logging.Handler, held: list[tuple[logging.Handler, logging.LogRecord]]) -> None:
        super().__init__()
        self.handler = handler
        self.held = held

    def filter(self, record: logging.LogRecord) -> bool:
        self.held.append((self.handler, record))
        return False


def _stream_handlers() -> list[logging.Handler]:
    """Every handler that writes to a stream, on the root logger or any logger created so far."""
    loggers = [logging.getLogger()] + [
        logger for logger in list(logging.Logger.manager.loggerDict.values()) if isinstance(logger, logging.Logger)]
    found: dict[int, logging.Handler] = {}
    for logger in loggers:
        for handler in logger.handlers:
            if isinstance(handler, logging.StreamHandler):
                found[id(handler)] = handler
    return list(found.values())


@contextmanager
def held_logs(expected: tuple[type[BaseException], ...]) -> Iterator[None]:
    """Hold back what stream handlers would print while the block runs (configure logging first:
    handlers added later are not held). If the block ends with one of `expected`, the held lines
    are dropped; otherwise (success, or a bug) they are printed after it, in order."""
    held: list[tuple[logging.Handler, logging.LogRecord]] = []
    holds = [_Hold(handler, held) for handler in _stream_handlers()]
    for hold in holds:
        hold.handler.addFilter(hold)
    drop = False
    try:
        yield
    except expected:
        drop = True
        raise
    finally:
        for hold in holds:
            hold.handler.removeFilter(hold)
        if not drop:
            for handler, record in held:
                handler.handle(record)
