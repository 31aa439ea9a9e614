"""Starting the dashboard: check what it was asked to show, bind its address, serve until stopped."""

from __future__ import annotations

import socket
from collections.abc import Callable, Sequence

from pydantic import ValidationError

from dashboards.sources import Store, Tracking
from libra.clock import WallClock, sleep
from libra.config import DashboardConfig, LibraConfig
from libra.config_loading import tracking_uri_in_use
from libra.errors import LibraError
from storage.manifest import committed_runs
from storage.writer import check_run_name


def settings_of(config: LibraConfig, host: str | None, port: int | None) -> DashboardConfig:
    """The config's dashboard section with the command line's host and port over it (validated)."""
    changes = {k: v for k, v in (("host", host), ("port", port)) if v is not None}
    try:
        return DashboardConfig.model_validate(config.dashboard.model_dump() | changes)
    except ValidationError as exc:
        error = exc.errors()[0]
        raise LibraError(f"dashboard.{'.'.join(map(str, error['loc']))}: {error['msg']} (got {error['input']!r})") from None


def check_runs(root: str, runs: Sequence[str]) -> None:
    """Every run asked for exists in the store; the error lists the ones that do."""
    known = committed_runs(root)
    for run in runs:
        check_run_name(run)
        if run not in known:
            hint = f"runs in the store: {', '.join(known)}" if known else "the store has no runs yet"
            raise LibraError(f"--run {run}: no such run in the store {root}; {hint}")


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (port 0: any free one); a clear error when it cannot be had."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise LibraError(f"dashboard: cannot resolve host {host!r} ({exc.strerror}); give an address such as 127.0.0.1") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise LibraError(f"dashboard: cannot listen on {host}:{port} ({exc.strerror}); choose another --port, "
                         "or 0 for any free one") from None
    sock.listen(128)
    return sock


def address(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"


def serve(config: LibraConfig, runs: Sequence[str] = (), host: str | None = None, port: int | None = None,
          announce: Callable[[str], None] = print) -> None:
    """Serve the dashboard until interrupted; `announce` hears its address once it listens."""
    import uvicorn

    from dashboards.app import create_app

    settings = settings_of(config, host, port)
    check_runs(config.store.root, runs)
    store = Store(config.store.root, runs, threads=config.store.duckdb_threads)
    app = create_app(store, Tracking(tracking_uri_in_use(config)), settings)  # (MLFLOW_TRACKING_URI, if set)
    sock = bind(settings.host, settings.port)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=1, lifespan="off"))
    announce(address(sock))
    try:
        server.run(sockets=[sock])
    finally:
        store.close()
        sock.close()


class Background:
    """The dashboard served from a thread of this process (tests, benchmarks): `url`, then `stop()`."""

    def __init__(self, store: Store, tracking: Tracking, settings: DashboardConfig) -> None:
        import threading

        import uvicorn

        from dashboards.app import create_app

        self.store = store
        sock = bind(settings.host, settings.port)
        self.url = address(sock).rstrip("/")
        self._server = uvicorn.Server(uvicorn.Config(create_app(store, tracking, settings), log_level="warning",
                                                     lifespan="off", timeout_graceful_shutdown=1))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]}, daemon=True,
                                        name="libra-dashboard")
        self._thread.start()
        while not self._server.started and self._thread.is_alive():
            sleep(WallClock(), 0.02)

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self.store.close()
