"""The dashboard's HTTP server: the static page, the JSON API (docs/api.md) and the live stream, on a socket it is
handed (``listen`` binds one for ``tm view``; the launcher binds the web component's), in a thread of its own with
its own event loop.

aiohttp is imported here and only here, and only by tm's web process or ``tm view``: never in a training process. On
stop, every live stream ends at once, so shutting the web process down never waits for an open page.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import sys
import threading
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

from aiohttp import web

from trainmeter_core.model.history import AXIS_ALIASES, X_AXES
from trainmeter_core.run import webport
from trainmeter_core.runlog import rundir
from trainmeter_web.changes import Changes, HistoryWait
from trainmeter_web.dashboard_state import HISTORY_WAIT_S, DashboardState, encode
from trainmeter_web.guard import SECURITY_HEADERS, TOKEN_COOKIE, Guard, without_token
from trainmeter_web.stream import DEFAULT_POINTS, MAX_POINTS, LiveStream

KEEPALIVE_S = 15.0
RETRY_MS = 1000
SHUTDOWN_S = 0.5
_CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".txt": "text/plain; charset=utf-8",
}
_DASHBOARD = web.AppKey("dashboard", DashboardState)
_GUARD = web.AppKey("guard", Guard)
_CHANGES = web.AppKey("changes", object)
_STATIC = web.AppKey("static", dict)
_HISTORY_WAIT = web.AppKey("history_wait", object)


def load_static() -> dict[str, tuple[bytes, str]]:
    """The page's files, read once: name -> (bytes, content type). Only these names are ever served."""
    files: dict[str, tuple[bytes, str]] = {}
    root = resources.files("trainmeter_web") / "static"
    for entry in root.iterdir():
        suffix = Path(entry.name).suffix
        if entry.is_file() and suffix in _CONTENT_TYPES:
            files[entry.name] = (entry.read_bytes(), _CONTENT_TYPES[suffix])
    return files


# ----------------------------------------------------------------------------------------------------------------------
# Middleware: the guard first, then the handler; the headers go on every response through on_response_prepare


@web.middleware
async def guard_middleware(request: web.Request, handler):
    guard = request.app[_GUARD]
    if not guard.host_allowed(request.headers.get("Host")):
        return web.Response(
            status=403,
            text="tm: this Host is not allowed (DNS rebinding guard): open http://localhost:PORT/\n",
        )
    how = guard.token_from(
        request.headers.get("Authorization"), request.cookies.get(TOKEN_COOKIE), request.query.get("token")
    )
    if how is None:
        return web.Response(
            status=401,
            text="tm: this dashboard needs its token: open the URL tm printed (it ends in ?token=...)\n",
        )
    if how == "query" and request.path == "/" and request.method == "GET":
        # Trade the token in the address bar for a cookie, so it leaves the history and never rides in a Referer.
        return web.Response(
            status=303,
            headers={
                "Location": without_token("/", dict(request.query)),
                "Set-Cookie": guard.cookie_header(),
            },
        )
    return await handler(request)


def _want_history(request: web.Request) -> float | None:
    """The page, or a request that reads the history copy, came: the copy is wanted from now on (the first such
    request starts ``HistoryWait``). When it was first wanted, None where it was wanted from the start."""
    wait: HistoryWait = request.app[_HISTORY_WAIT]  # type: ignore[assignment]
    if request.app[_DASHBOARD].want_history():
        wait.since = asyncio.get_running_loop().time()
    return wait.since


async def _history_first(request: web.Request) -> None:
    """A request that reads the history copy: it is wanted from now on, and where this request came soon after the
    first one that wanted it (``HistoryWait``), it waits for the copy until it loaded, the server closes or the wait
    is over."""
    since = _want_history(request)
    dashboard = request.app[_DASHBOARD]
    if since is None or not dashboard.needs_history:
        return
    changes: Changes = request.app[_CHANGES]  # type: ignore[assignment]
    loop = asyncio.get_running_loop()
    while dashboard.needs_history and not changes.closing:
        left = since + HISTORY_WAIT_S - loop.time()
        if left <= 0:
            return
        await changes.wait(changes.version, left)  # any change of the dashboard: the copy's load among them


async def _headers(request: web.Request, response: web.StreamResponse) -> None:
    response.headers.update(SECURITY_HEADERS)
    if request.path.startswith("/api/"):
        response.headers["Cache-Control"] = "no-store"
    else:
        response.headers.setdefault("Cache-Control", "no-cache")


# ----------------------------------------------------------------------------------------------------------------------
# Handlers


def _json(doc: Any, status: int = 200) -> web.Response:
    return web.Response(body=encode(doc), status=status, content_type="application/json")


def _error(status: int, message: str) -> web.Response:
    return _json({"error": message}, status)


async def page(request: web.Request) -> web.Response:
    _want_history(request)  # asked for while the page loads its scripts; its live stream waits for it
    body, content_type = request.app[_STATIC]["index.html"]
    return web.Response(body=body, headers={"Content-Type": content_type})


async def static(request: web.Request) -> web.Response:
    found = request.app[_STATIC].get(request.match_info["name"])
    if found is None:
        raise web.HTTPNotFound(text="no such file\n")
    body, content_type = found
    return web.Response(body=body, headers={"Content-Type": content_type})


def _body(body: bytes, status: int = 200) -> web.Response:
    return web.Response(body=body, status=status, content_type="application/json")


async def api_run(request: web.Request) -> web.Response:
    dashboard = request.app[_DASHBOARD]
    return _body(dashboard.encoded("run", dashboard.run_doc))


async def api_snapshot(request: web.Request) -> web.Response:
    dashboard = request.app[_DASHBOARD]
    return _body(dashboard.encoded("snapshot", dashboard.snapshot_doc))


async def api_state(request: web.Request) -> web.Response:
    await _history_first(request)
    dashboard = request.app[_DASHBOARD]
    return _body(dashboard.encoded("state", dashboard.live_doc))


async def api_series(request: web.Request) -> web.Response:
    await _history_first(request)
    return _json({"x_axes": list(X_AXES), "series": request.app[_DASHBOARD].catalog()})


def _axis(request: web.Request) -> str | web.Response:
    x_axis = request.query.get("x", "step")
    x_axis = AXIS_ALIASES.get(x_axis, x_axis)  # an old name, kept for one release
    if x_axis not in X_AXES:
        return _error(400, f"x={x_axis!r} is not an x axis; use one of {', '.join(X_AXES)}")
    return x_axis


def _points(request: web.Request, default: int | None) -> int | None | web.Response:
    text = request.query.get("points")
    if text is None:
        return default
    try:
        points = int(text)
    except ValueError:
        points = 0
    if not 1 <= points <= MAX_POINTS:
        return _error(400, f"points={text!r}: give a whole number from 1 to {MAX_POINTS}")
    return points


async def api_history(request: web.Request) -> web.Response:
    await _history_first(request)
    dashboard = request.app[_DASHBOARD]
    x_axis = _axis(request)
    if isinstance(x_axis, web.Response):
        return x_axis
    points = _points(request, None)
    if isinstance(points, web.Response):
        return points
    since: float | None = None
    if "since" in request.query:
        try:
            since = float(request.query["since"])
        except ValueError:
            return _error(400, f"since={request.query['since']!r}: give a number on the x axis")
    catalog = dashboard.catalog(points=False)
    names = request.query.getall("series", []) or list(catalog)
    missing = [n for n in names if n not in catalog]
    if missing and len(names) == 1:
        return _json({"error": f"no series {missing[0]!r}: /api/series lists them", "missing": missing}, 404)
    # Assembled from each series' cached JSON: a page's worth of readers costs one encode per series and change.
    parts = [
        encode(name) + b":" + dashboard.history_json(name, x_axis, since, points)
        for name in names
        if name in catalog
    ]
    body = b'{"x_axis":' + encode(x_axis) + b',"series":{' + b",".join(parts) + b"}"
    if missing:
        body += b',"missing":' + encode(missing)
    return _body(body + b"}")


async def api_alerts(request: web.Request) -> web.Response:
    dashboard = request.app[_DASHBOARD]
    with dashboard.lock:
        return _json({"alerts": [dict(a) for a in dashboard.alerts]})


async def api_runs(request: web.Request) -> web.Response:
    dashboard = request.app[_DASHBOARD]
    if dashboard.run_dir is None:
        return _json({"runs": []})
    current = dashboard.run_dir.resolve()
    runs = []
    for path in rundir.list_runs(dashboard.run_dir.parent):
        info = rundir.run_info(path)
        runs.append(
            {
                "name": info.name,
                "path": str(path),
                "state": info.state,
                "start_wall": info.start_wall,
                "end_wall": info.end_wall,
                "steps": info.steps,
                "exit_status": info.exit_status,
                "attempts": info.attempts,
                "current": path.resolve() == current,
            }
        )
    return _json({"runs_dir": str(dashboard.run_dir.parent), "runs": runs})


async def api_passport(request: web.Request) -> web.Response:
    dashboard = request.app[_DASHBOARD]
    if dashboard.run_dir is None:
        return _json({"absent": "no run directory"})
    try:
        text = (dashboard.run_dir / "passport.md").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return _json({"absent": "the passport is written when the run ends (tm passport RUN)"})
    return _json({"markdown": text})


async def api_events(request: web.Request) -> web.StreamResponse:
    x_axis = _axis(request)
    if isinstance(x_axis, web.Response):
        return x_axis
    points = _points(request, DEFAULT_POINTS)
    if isinstance(points, web.Response):
        return points
    await _history_first(request)
    dashboard = request.app[_DASHBOARD]
    changes: Changes = request.app[_CHANGES]  # type: ignore[assignment]
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
    await response.prepare(request)
    stream = LiveStream(dashboard, x_axis, points or DEFAULT_POINTS)
    loop = asyncio.get_running_loop()
    try:
        await response.write(f"retry: {RETRY_MS}\n\n".encode())
        seen = changes.version
        # A long history takes a while to gather: off the event loop, so other pages and the API stay quick.
        first = await loop.run_in_executor(None, stream.full)
        await response.write(_event("state", first))
        while True:
            await changes.wait(seen, KEEPALIVE_S)
            if changes.version != seen:
                # Sent even when the server is closing: the run's end arrives just before tm stops the web process.
                seen = changes.version
                update = stream.update()
                if update is not None:
                    await response.write(_event("patch", update))
            elif not changes.closing:
                await response.write(b": keep-alive\n\n")
            if changes.closing:
                break
    except (ConnectionResetError, asyncio.CancelledError):
        pass
    return response


def _event(name: str, doc: Any) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + encode(doc) + b"\n\n"


def make_app(dashboard: DashboardState, guard: Guard, changes: Changes | None = None) -> web.Application:
    app = web.Application(middlewares=[guard_middleware])
    app[_DASHBOARD] = dashboard
    app[_GUARD] = guard
    app[_CHANGES] = changes if changes is not None else Changes()
    app[_HISTORY_WAIT] = HistoryWait()
    app[_STATIC] = load_static()
    app.on_response_prepare.append(_headers)
    get = app.router.add_get
    get("/", page)
    get("/static/{name}", static)
    get("/api/run", api_run)
    get("/api/snapshot", api_snapshot)
    get("/api/state", api_state)
    get("/api/series", api_series)
    get("/api/history", api_history)
    get("/api/alerts", api_alerts)
    get("/api/runs", api_runs)
    get("/api/passport", api_passport)
    get("/api/events", api_events)
    return app


async def compare_page(request: web.Request) -> web.Response:
    body, content_type = request.app[_STATIC]["compare.html"]
    return web.Response(body=body, headers={"Content-Type": content_type})


def make_compare_app(document: bytes, guard: Guard) -> web.Application:
    """``tm view A B``: the comparison page, its static files and its one document (``/api/compare``), behind the
    same guard and headers as the dashboard."""
    app = web.Application(middlewares=[guard_middleware])
    app[_GUARD] = guard
    app[_STATIC] = load_static()
    app.on_response_prepare.append(_headers)

    async def api_compare(request: web.Request) -> web.Response:
        return _body(document)

    app.router.add_get("/", compare_page)
    app.router.add_get("/static/{name}", static)
    app.router.add_get("/api/compare", api_compare)
    return app


class Server:
    """The dashboard on a listening socket, served by a thread with its own event loop until ``stop()``. ``app``
    makes another application than the run's dashboard (the comparison's)."""

    def __init__(
        self,
        dashboard: DashboardState | None,
        sock: socket.socket,
        guard: Guard,
        app: Callable[[Changes], web.Application] | None = None,
    ) -> None:
        self.dashboard = dashboard
        self.sock = sock
        self.guard = guard
        self._make_app = app
        self.changes = Changes()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tm-web-server", daemon=True)
        self.error: BaseException | None = None

    def start(self) -> None:
        self._thread.start()
        self._ready.wait(30)
        if self.error is not None:
            raise self.error

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # reported to start() or, later, to whoever joins
            self.error = exc
            self._ready.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        if self._make_app is not None:
            app = self._make_app(self.changes)
        else:
            assert self.dashboard is not None, "the dashboard serves a run: give it the run's DashboardState"
            app = make_app(self.dashboard, self.guard, self.changes)
        runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=SHUTDOWN_S)
        await runner.setup()
        site = web.SockSite(runner, self.sock)
        await site.start()
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            self.changes.close()  # every live stream returns now
            await asyncio.sleep(0)
            await runner.cleanup()

    def notify(self) -> None:
        """The dashboard changed: wake the live streams (called by the one thread that changes the dashboard)."""
        loop = self._loop
        try:
            self.changes.changed(loop if loop is not None and not loop.is_closed() else None)
        except RuntimeError:  # the loop closed between the check and the call
            pass

    def stop(self, timeout_s: float = 2.0) -> None:
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(stop.set)
            except RuntimeError:
                pass
        self._thread.join(timeout_s)


def listen(
    host: str, port: int | None, stopping: threading.Event | None
) -> tuple[webport.WebSocket, threading.Event] | None:
    """The socket a served page listens on, and the event Ctrl-C or SIGTERM sets (``stopping`` when given; the
    handlers only from the main thread); None, after one line saying why, when the address cannot be had."""
    try:
        bound = webport.bind(host, port)
    except webport.WebPortError as exc:
        print(f"tm: {exc}", file=sys.stderr)
        return None
    stopping = stopping or threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stopping.set())
    return bound, stopping
