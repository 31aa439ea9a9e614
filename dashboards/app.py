"""The dashboard as a web application (FastAPI): HTML pages, their data as JSON, and a stream of
change notices that makes an open page redraw without a reload.

    GET /                               the store's runs
    GET /runs/{run}/{page}              a run's page: overview, trajectories, scheduling, pools
    GET /compare?series=<run>:<policy>  runs side by side
    GET /api/...                        the same pages' charts and tables as JSON (what the browser draws)
    GET /events?run=...                 server-sent events: the runs' version, sent when it changes
    GET /static/...                     the page script, the style sheet and Plotly's bundled plotly.js

Only GET routes exist (anything else is 405), and nothing behind them writes: the store is read
through locked read-only catalogs, MLflow through its client. A run the store does not have, or a
parameter a page cannot take, is a page (or JSON) that says so, with status 404 or 400.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import asdict
from pathlib import Path
from urllib.parse import quote

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, RedirectResponse, StreamingResponse
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from starlette.middleware.trustedhost import TrustedHostMiddleware

from dashboards.figures import Page
from dashboards.pages import COMPARE, RUN_PAGES
from dashboards.sources import MissingRun, Store, Tracking
from dashboards.view import BadParameter, View
from libra.clock import Stopwatch
from libra.config import DashboardConfig
from libra.errors import LibraError, first_line

HERE = Path(__file__).parent
LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")
MAX_EVENT_RUNS = 100


def plotly_js() -> Path:
    import plotly

    return Path(plotly.__file__).parent / "package_data" / "plotly.min.js"


def create_app(store: Store, tracking: Tracking, settings: DashboardConfig) -> FastAPI:
    app = FastAPI(title="Libra dashboard", docs_url=None, redoc_url=None, openapi_url=None)
    if settings.host in LOOPBACK:  # a page on another site cannot reach this one through a rebound DNS name
        app.add_middleware(TrustedHostMiddleware, allowed_hosts=["127.0.0.1", "localhost", "::1", "[::1]"])
    templates = Jinja2Templates(directory=str(HERE / "templates"))
    app.mount("/static", StaticFiles(directory=str(HERE / "static")), name="static")

    def html(request: Request, template: str, status: int = 200, **context) -> HTMLResponse:
        return templates.TemplateResponse(request, template, {"store": str(store.root), "pages": RUN_PAGES, "run": None,
                                                              "page": "", "refresh_s": settings.refresh_s, **context},
                                          status_code=status)

    def problem(request: Request, status: int, message: str) -> HTMLResponse:
        return html(request, "problem.html", status, message=message, runs=store.names())

    @app.get("/plotly.min.js", include_in_schema=False)
    def plotly_bundle() -> FileResponse:
        return FileResponse(plotly_js(), media_type="text/javascript", headers={"Cache-Control": "max-age=86400"})

    @app.get("/favicon.ico", include_in_schema=False)
    def favicon() -> FileResponse:
        return FileResponse(HERE / "static" / "favicon.svg", media_type="image/svg+xml")

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:  # a bug: one line, not a traceback page
        return JSONResponse({"error": f"the dashboard failed: {first_line(exc, typed=True)}"},
                            status_code=500)

    @app.get("/", response_class=HTMLResponse)
    def index(request: Request) -> HTMLResponse:
        runs = sorted(store.runs(), key=lambda r: -r.committed_at)
        return html(request, "index.html", runs=runs,
                    committed={r.name: time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r.committed_at)) for r in runs})

    @app.get("/runs/{run}", include_in_schema=False)
    def run_home(run: str) -> RedirectResponse:
        return RedirectResponse(f"/runs/{quote(run, safe='')}/overview")

    @app.get("/runs/{run}/{page}", response_class=HTMLResponse)
    def run_page(request: Request, run: str, page: str) -> HTMLResponse:
        if page not in RUN_PAGES:
            return problem(request, 404, f"no page {page!r}; pages: {', '.join(RUN_PAGES)}, and compare")
        try:
            info = store.info(run)
        except MissingRun as exc:
            return problem(request, 404, str(exc))
        except LibraError as exc:  # a manifest that cannot be read
            return problem(request, 500, str(exc))
        return html(request, "page.html", run=run, page=page, info=info, title=f"{run}: {RUN_PAGES[page][0]}",
                    api=f"/api/runs/{quote(run, safe='')}/{page}", events=f"/events?run={quote(run, safe='')}")

    @app.get("/compare", response_class=HTMLResponse)
    def compare_page(request: Request) -> HTMLResponse:
        return html(request, "page.html", run=None, page="compare", info=None, title="compare runs",
                    api="/api/compare", events="/events?" + "&".join(f"run={quote(r, safe='')}" for r in compared()))

    def refusal(exc: LibraError, **more) -> JSONResponse:
        """A run not in the store (404), a parameter a page cannot take (400), or a query the store
        could not answer (500: a run replaced mid-read, a manifest that cannot be read)."""
        status = 404 if isinstance(exc, MissingRun) else 400 if isinstance(exc, BadParameter) else 500
        return JSONResponse({"error": str(exc), **more}, status_code=status)

    def answer(build, view: View, runs: list[str]) -> JSONResponse:
        watch = Stopwatch()
        seen = ""
        try:
            seen = version(runs)  # before reading: a commit during the build shows as a change
            page: Page = build(view)
        except LibraError as exc:
            return refusal(exc, version=seen)
        body = asdict(page) | {"version": seen, "reads": [asdict(t) for t in view.reads.times],
                               "built_ms": round(1000 * watch.seconds(), 1)}
        return JSONResponse(body, headers={"Cache-Control": "no-store"})

    def params(request: Request) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for key, value in request.query_params.multi_items():
            out.setdefault(key, []).append(value)
        return out

    @app.get("/api/runs/{run}/{page}")
    def run_api(request: Request, run: str, page: str) -> JSONResponse:
        if page not in RUN_PAGES:
            return JSONResponse({"error": f"no page {page!r}; pages: {', '.join(RUN_PAGES)}"}, status_code=404)
        return answer(RUN_PAGES[page][1], View(store, tracking, settings, run, params(request)), [run])

    @app.get("/api/compare")
    def compare_api(request: Request) -> JSONResponse:
        return answer(COMPARE, View(store, tracking, settings, "", params(request)), compared())

    @app.get("/api/runs")
    def runs_api() -> JSONResponse:
        return JSONResponse([asdict(r) | {"kind": r.kind} for r in store.runs()])

    def compared() -> list[str]:
        """The runs the comparison page listens to (the events stream takes at most MAX_EVENT_RUNS)."""
        return store.names()[:MAX_EVENT_RUNS]

    def version(runs: list[str]) -> str:
        """What changes when a commit changes one of `runs`, or MLflow's database changes."""
        return json.dumps([repr(store.version(r)) for r in runs] + [tracking.version()])

    streams = [0]  # change streams open now, and requests for one being checked

    @app.get("/events", response_model=None)
    async def events(request: Request) -> StreamingResponse | JSONResponse:
        """The runs' version now, then again each time it changes; the page compares it with the
        version its data was read at, so a commit between the two (or during a reconnect) is not lost."""
        runs = list(dict.fromkeys(request.query_params.getlist("run")))  # a run named twice is polled once
        if len(runs) > MAX_EVENT_RUNS:
            return JSONResponse({"error": f"give at most {MAX_EVENT_RUNS} run parameters"}, status_code=400)
        if streams[0] >= settings.max_streams:  # each open stream polls its runs; the loop serves every page
            return JSONResponse({"error": f"{streams[0]} change streams are open, the most this dashboard serves "
                                 "(dashboard.max_streams); close a page or try again later"}, status_code=503)
        streams[0] += 1  # counted while its runs are checked too: a burst of requests cannot pass the cap at once
        try:
            await asyncio.to_thread(lambda: [store.info(run) for run in runs])  # off the loop: reads manifests
        except LibraError as exc:
            return refusal(exc)
        finally:
            streams[0] -= 1

        async def stream() -> AsyncIterator[str]:
            streams[0] += 1
            try:
                last, beat = None, Stopwatch()
                yield f"retry: {int(1000 * settings.refresh_s)}\n\n"
                while not await request.is_disconnected():
                    now = await asyncio.to_thread(version, runs)
                    if now != last:
                        yield f"event: version\ndata: {json.dumps(now)}\n\n"
                        last, beat = now, Stopwatch()
                    elif beat.seconds() > 15:
                        yield ": still here\n\n"
                        beat = Stopwatch()
                    await asyncio.sleep(settings.refresh_s)
            finally:
                streams[0] -= 1

        return StreamingResponse(stream(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})

    return app
