"""The ASGI app: a static page, and read-only JSON over the runs of a `RunIndex`."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from contextlib import asynccontextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import QueryParams
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from chute.errors import PlotError, QueryError

from .._query import parse
from .._reader import Reader
from ._group import group_series
from ._runs import NotServed, Run, RunIndex, check_name
from ._series import MAX_WIDTH, MIN_WIDTH, metric_kinds, read_series
from ._table import diff as config_diff
from ._table import listing

STATIC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "static")
#: Metrics one series request may name (the page asks for at most 128 at a time), and the
#: longest metric name taken (a path's length limit).
MAX_METRICS, MAX_NAME = 256, 4096
#: Runs one group or config-diff request may name.
MAX_GROUP = 256
_NO_CACHE = {"Cache-Control": "no-store"}


def _json(data: Any) -> JSONResponse:
    return JSONResponse(data, headers=_NO_CACHE)


def _bad(msg: str) -> HTTPException:
    return HTTPException(400, msg)


def _int(value: str, what: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise _bad(f"{what} must be an integer, got {value!r}") from None


def _smooth(value: str) -> float:
    try:
        f = float(value)
    except ValueError:
        raise _bad(f"smooth must be a number, got {value!r}") from None
    if not 0 <= f < 1:
        raise _bad(f"smooth must be in [0, 1), got {value!r}")
    return f


def _curve_params(q: QueryParams) -> tuple[str, int, float]:
    """A chart request's x axis, width (clamped to what a page can show) and smoothing."""
    width = min(max(_int(q.get("width", "800"), "width"), MIN_WIDTH), MAX_WIDTH)
    return _name(q.get("x", "step")), width, _smooth(q.get("smooth", "0"))


def _name(value: str) -> str:
    if len(value) > MAX_NAME:
        raise _bad(f"a metric name has at most {MAX_NAME} characters")
    return value


def _names(values: list[str], what: str) -> list[str]:
    if len(values) > MAX_METRICS:
        raise _bad(f"name at most {MAX_METRICS} {what}")
    return [*dict.fromkeys(map(_name, values))]


def _series_params(names: list[str], afters: list[str]) -> dict[str, int]:
    """Each metric asked for once, with the earliest `after` it was asked with.

    The count and length of names are bounded before any is read, so one URL cannot
    cost more than a page's own requests do.
    """
    if not names:
        raise _bad("name at least one metric")
    if len(names) > MAX_METRICS:
        raise _bad(f"name at most {MAX_METRICS} metrics per request")
    steps = [_int(a, "after") for a in afters] or [-1] * len(names)
    if len(steps) != len(names):
        raise _bad("give one 'after' per metric, or none")
    wanted: dict[str, int] = {}
    for name, after in zip(map(_name, names), steps, strict=True):
        wanted[name] = min(after, wanted.get(name, after))
    return wanted


def create_app(paths: list[str], *, allowed_hosts: list[str] | None = None) -> Starlette:
    """The dashboard over the runs at or under `paths` (folders, archives or run roots).

    `allowed_hosts` limits the Host headers answered (a loopback server passes its own
    names, so a web page that rebinds a DNS name to 127.0.0.1 cannot read the runs).

    >>> import tempfile
    >>> app = create_app([tempfile.mkdtemp()])  # an empty folder: a page with no runs yet
    >>> sorted(r.path for r in app.routes)[:4]
    ['/', '/api/diff', '/api/group', '/api/runs']
    """
    index = RunIndex([os.fspath(p) for p in paths])

    def _runs_of(request: Request) -> list[Run]:
        ids = request.query_params.getlist("run")
        if not ids or len(ids) > MAX_GROUP:
            raise _bad(f"name 1 to {MAX_GROUP} runs")
        try:
            return [index.get(i) for i in dict.fromkeys(ids)]
        except NotServed:
            raise HTTPException(404, "no such run") from None

    def run_of(request: Request) -> Run:
        try:
            return index.get(request.path_params["run"])
        except NotServed:
            raise HTTPException(404, "no such run") from None

    async def in_thread(fn: Callable[[], Any]) -> Any:
        """Run blocking reads off the event loop; a malformed run answers its error as JSON."""
        try:
            return await run_in_threadpool(fn)
        except NotServed as e:
            raise HTTPException(404, str(e)) from None
        except Exception as e:
            return {"error": f"{type(e).__name__}: {e}"}

    async def page(request: Request) -> Response:
        return FileResponse(os.path.join(STATIC, "index.html"), headers=_NO_CACHE)

    async def runs(request: Request) -> Response:
        q = request.query_params
        try:
            query = parse(q.get("where", ""))
        except QueryError as e:
            raise _bad(str(e)) from None
        columns = _names(q.getlist("column"), "config columns")
        last = _names(q.getlist("last"), "metrics")

        def work() -> dict[str, Any]:
            summaries = [run.summary(last) for run in index.runs()]
            return {**listing(summaries, query, columns, last), "now": time.time()}

        return _json(await in_thread(work))

    async def diff(request: Request) -> Response:
        chosen = _runs_of(request)

        def work() -> dict[str, Any]:
            summaries = [run.summary() for run in chosen]
            return config_diff(
                [s["name"] for s in summaries],
                [s["config"] for s in summaries],
                [s.get("error") or s.get("config_error") for s in summaries],
            )

        return _json(await in_thread(work))

    async def group(request: Request) -> Response:
        chosen = _runs_of(request)
        q = request.query_params
        wanted = _names(q.getlist("metric"), "metrics")
        if not wanted:
            raise _bad("name at least one metric")
        try:  # a name no run could hold is not served, as for one run's series
            for name in wanted:
                check_name(name)
        except NotServed as e:
            raise HTTPException(404, str(e)) from None
        x, width, smooth = _curve_params(q)
        return _json(await in_thread(lambda: group_series(chosen, wanted, x, width, smooth)))

    async def metrics(request: Request) -> Response:
        run = run_of(request)
        return _json(await in_thread(lambda: {"metrics": run.use(metric_kinds)}))

    async def config(request: Request) -> Response:
        run = run_of(request)
        return _json(await in_thread(lambda: run.use(lambda r: r.config())))

    async def series(request: Request) -> Response:
        run = run_of(request)
        q = request.query_params
        wanted = _series_params(q.getlist("metric"), q.getlist("after"))
        x, width, smooth = _curve_params(q)

        def work(r: Reader) -> dict[str, Any]:
            for name in wanted:
                run.check_metric(r, name)
            if x in r.metrics():
                run.check_metric(r, x)
            elif x != "step":  # an x this run lacks is an error on its charts, not a 404
                check_name(x)
            out: dict[str, Any] = {}
            for name, after in wanted.items():
                try:
                    out[name] = read_series(r, name, x=x, after=after, width=width, smooth=smooth)
                except Exception as e:  # one bad column shows on its chart, the rest still draw
                    msg = str(e) if isinstance(e, PlotError) else f"{type(e).__name__}: {e}"
                    out[name] = {"error": msg}
            return out

        return _json(await in_thread(lambda: {"series": run.use(work)}))

    @asynccontextmanager
    async def lifespan(app: Starlette) -> Any:
        yield
        index.close()

    routes = [
        Route("/", page),
        Route("/api/runs", runs),
        Route("/api/runs/{run}/metrics", metrics),
        Route("/api/runs/{run}/config", config),
        Route("/api/runs/{run}/series", series),
        Route("/api/diff", diff),
        Route("/api/group", group),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    middleware = (
        [Middleware(TrustedHostMiddleware, allowed_hosts=allowed_hosts)] if allowed_hosts else []
    )
    app = Starlette(routes=routes, middleware=middleware, lifespan=lifespan)
    app.state.index = index
    return app
