"""Tracking and Prefect servers that cannot serve: one line before anything is written."""

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli.main import main
from tests.cli.inputs import libra, nothing_written


@pytest.mark.parametrize("uri, message", [
    ("garbage://x", "MLFLOW_TRACKING_URI 'garbage://x': MLflow has no tracking store for 'garbage'; give "
                    "sqlite:///FILE.db, file:DIR, http(s)://SERVER"),  # a 225-line traceback, the run committed
    ("http://[::1", "MLflow's tracking server http://[::1 is not a valid address (Invalid IPv6 URL); fix "
                    "tracking.tracking_uri (or MLFLOW_TRACKING_URI)"),  # 29 lines
])
def test_an_unusable_mlflow_tracking_uri_in_the_environment_is_one_line_before_anything_is_written(
        files: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch, uri: str, message: str) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    assert main(["simulate", "--workload", "search-r1", "--steps", "1", "--cluster", "2x8:a800", "--model", "qwen3-8b",
                 "--systems", "libra", "--group-size", "2", "--prompts-per-step", "2", "--store", "store"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("libra: error: " + message) and err.count("\n") == 1, err
    nothing_written(files)


@pytest.mark.parametrize("url, message", [
    ("http://127.0.0.1:1/api", "Prefect's server (PREFECT_API_URL) http://127.0.0.1:1/api cannot be reached (Connection "
                               "refused); start it (prefect server start --host 127.0.0.1), fix PREFECT_API_URL, or "
                               "unset it to run without a server"),  # 120 lines of traceback
    ("garbage", "Prefect's server (PREFECT_API_URL) garbage is not a valid address (not an http(s) URL); fix "
                "PREFECT_API_URL, e.g. http://127.0.0.1:4200/api"),
])
def test_a_prefect_server_that_cannot_be_reached_is_one_line(files: Path, url: str, message: str) -> None:
    """(In a process of its own: Prefect reads its settings once a process.)"""
    done = libra("simulate", "--workload", "search-r1", "--steps", "1", "--cluster", "2x8:a800", "--model", "qwen3-8b",
                 "--systems", "libra", "--group-size", "2", "--prompts-per-step", "2", "--no-track", "--store", "store",
                 cwd=files, PREFECT_API_URL=url)
    assert (done.returncode, done.stdout, done.stderr) == (2, "", f"libra: error: {message}\n")
    assert not (files / "store").exists()


@pytest.fixture
def not_a_tracking_server() -> Iterator[tuple[int, int]]:
    """A web server that answers 404 to every path, and a port that answers in another protocol."""
    import http.server
    import socket

    class NotFound(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self.send_response(404 if "auth" not in self.path else 401)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    web = http.server.HTTPServer(("127.0.0.1", 0), NotFound)
    threading.Thread(target=web.serve_forever, daemon=True).start()
    other = socket.create_server(("127.0.0.1", 0))

    def greet() -> None:
        while True:
            try:
                conn, _ = other.accept()
            except OSError:
                return
            with conn:
                conn.sendall(b"SSH-2.0-OpenSSH_9.6\r\n")

    threading.Thread(target=greet, daemon=True).start()
    try:
        yield web.server_address[1], other.getsockname()[1]
    finally:
        web.shutdown()
        other.close()


def test_a_server_that_answers_but_is_not_mlflow_or_prefect_is_one_line_before_anything_is_written(
        files: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch,
        not_a_tracking_server: tuple[int, int]) -> None:
    """A web server on the port (MLflow's client had retried, then raised a traceback), or another
    protocol there."""
    from flows.runtime import PREFECT_SERVER, reach_server
    from libra.errors import LibraError

    web, other = not_a_tracking_server
    for uri, wrong in ((f"http://127.0.0.1:{web}", f"GET http://127.0.0.1:{web}/health: HTTP 404"),
                       (f"http://127.0.0.1:{other}", f"GET http://127.0.0.1:{other}/health: BadStatusLine: "
                                                     "SSH-2.0-OpenSSH_9.6")):
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
        assert main(["simulate", "--workload", "search-r1", "--steps", "1", "--cluster", "2x8:a800", "--model", "qwen3-8b",
                     "--systems", "libra", "--group-size", "2", "--prompts-per-step", "2", "--store", "store"]) == 2
        assert capsys.readouterr().err == (f"libra: error: MLflow's tracking server {uri} answers, but not as one "
                                           f"({wrong}); fix tracking.tracking_uri (or MLFLOW_TRACKING_URI)\n")
        nothing_written(files)
    with pytest.raises(LibraError, match=rf"^Prefect's server \(PREFECT_API_URL\) http://127.0.0.1:{web}/api answers, "
                                         rf"but not as one \(GET http://127.0.0.1:{web}/api/health: HTTP 404\); fix "
                                         r"PREFECT_API_URL, e.g. http://127.0.0.1:4200/api$"):
        reach_server(f"http://127.0.0.1:{web}/api", 5, PREFECT_SERVER)
    reach_server(f"http://127.0.0.1:{web}/auth", 5)  # one that asks for credentials: the client's to answer
    with pytest.raises(LibraError, match=rf"^MLflow's tracking server http://me:\*\*\*@127.0.0.1:{web} answers, but not "
                                         rf"as one \(GET http://127.0.0.1:{web}/health: HTTP 404\)"):
        reach_server(f"http://me:secret@127.0.0.1:{web}", 5)  # the password is never shown


def test_compare_reads_the_tracking_store_mlflow_tracking_uri_names(files: Path, capsys: pytest.CaptureFixture,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """train and simulate log where MLFLOW_TRACKING_URI says; compare looked in tracking.tracking_uri."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{files}/elsewhere.db")
    assert main(["compare"]) == 2
    assert capsys.readouterr().err.startswith(f"libra: error: no MLflow database at sqlite:///{files}/elsewhere.db; ")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "garbage://x")
    assert main(["compare"]) == 2
    assert capsys.readouterr().err.startswith("libra: error: MLFLOW_TRACKING_URI 'garbage://x': MLflow has no tracking "
                                              "store for 'garbage'")
