"""The ASGI application: routes, probes and the metrics endpoint."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Literal
from urllib.parse import urlsplit

import anyio
import httpx
from prometheus_client import CONTENT_TYPE_LATEST, Counter, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send
from starlette.websockets import WebSocket

from context_ceiling import __version__
from context_ceiling.core.tokenizers import bpe_engine
from context_ceiling.formats import route_for
from context_ceiling.sidecar.ceilings.admin import Admin, budget_answer
from context_ceiling.sidecar.config import Settings
from context_ceiling.sidecar.errors import error_response
from context_ceiling.sidecar.incoming import Incoming
from context_ceiling.sidecar.observability.metrics import Metrics
from context_ceiling.sidecar.observability.tracing import Tracing
from context_ceiling.sidecar.openapi import document as openapi_document
from context_ceiling.sidecar.proxy import Proxy
from context_ceiling.sidecar.state import SidecarState
from context_ceiling.sidecar.upstream.passthrough import Passthrough
from context_ceiling.sidecar.workers.group import GroupCollector, WorkerGroup

READY_CACHE_S = 5.0
PROBE_INTERVAL_S = 15.0
log = logging.getLogger(__name__)


class UpstreamProbe:
    """Whether each upstream accepts a TCP connection: ``/status`` and
    ``llm_context_upstream_up{upstream}`` (probed in the background every
    ``PROBE_INTERVAL_S``). Not part of readiness: a network blip to the provider must not take
    every replica out of its Service, where each request would get a clean per-request 502.

    The check is cached for a few seconds so a tight poll does not hammer the provider."""

    def __init__(self, state: SidecarState) -> None:
        self.state = state
        self._checked = 0.0
        self._result: dict[str, str] = {}

    async def _probe(self, base_url: str) -> str:
        parts = urlsplit(base_url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        try:
            with anyio.fail_after(2.0):
                stream = await anyio.connect_tcp(parts.hostname or "localhost", port)
                await stream.aclose()
        except (OSError, TimeoutError) as exc:
            return f"unreachable ({type(exc).__name__})"
        return "ok"

    async def check(self) -> dict[str, str]:
        if time.monotonic() - self._checked > READY_CACHE_S or not self._result:
            out: dict[str, str] = {}
            for api, client in self.state.upstreams.all_clients().items():
                out[api] = await self._probe(str(client.base_url))
                self.state.metrics.upstream_up.labels(upstream=api).set(out[api] == "ok")
            self._result, self._checked = out, time.monotonic()
        return self._result

    async def run(self) -> None:
        while True:
            await self.check()
            await asyncio.sleep(PROBE_INTERVAL_S)


class Ops:
    """The sidecar's own endpoints: probes, status, the request builders' budget, metrics."""

    def __init__(self, state: SidecarState, probe: UpstreamProbe, injected: bool) -> None:
        self.state, self.probe, self.injected = state, probe, injected

    async def healthz(self, _: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(self, _: Request) -> Response:
        """The sidecar's own state: config validated and ceilings loaded (both happen before
        the app exists, so a running app is ready), and not shutting down (unready from the
        SIGTERM on, so no new stream starts in the grace); the provider is not asked."""
        state = self.state
        if state.drain.draining:
            return JSONResponse({"status": "shutting down"}, status_code=503)
        return JSONResponse({"status": "ok", "ceilings_version": state.ceilings.current.version})

    async def openapi(self, request: Request) -> Response:
        """``GET /openapi.json``: the sidecar's own API (:mod:`context_ceiling.sidecar.openapi`)."""
        return JSONResponse(openapi_document())

    async def budget(self, request: Request) -> Response:
        """``GET /budget?model=M&workload=W&reservation=R``: the input budget a request builder
        must fit, read-only (its own optional token, never the admin one)."""
        return budget_answer(self.state, request)

    async def status(self, _: Request) -> Response:
        """Upstream reachability (what /readyz used to check), for people and dashboards."""
        upstreams: dict[str, str]
        if self.injected:  # injected upstreams have no address to probe
            upstreams = dict.fromkeys(self.state.upstreams.all_clients(), "injected")
        else:
            upstreams = await self.probe.check()
        down = [name for name, state_ in upstreams.items() if state_ not in ("ok", "injected")]
        return JSONResponse(
            {
                # the sidecar itself is fine (that is /readyz); an upstream it cannot reach is
                # what an operator looking here needs to see first
                "status": "degraded" if down else "ok",
                "upstreams": upstreams,
                "ceilings_version": self.state.ceilings.current.version,
            }
        )

    async def metrics(self, _: Request) -> Response:
        exposed = generate_latest(self.state.metrics.exposed)
        return Response(exposed, media_type=CONTENT_TYPE_LATEST)


#: what a WebSocket client (the OpenAI Realtime API) is told
WEBSOCKETS_501 = (
    "WebSocket routes (such as the OpenAI Realtime API) are not proxied by context-ceiling: "
    "connect to the provider directly; HTTP routes are measured or passed through"
)


async def _no_websockets(scope: Scope, receive: Receive, send: Send) -> None:
    """A WebSocket handshake is answered 501 with a JSON body in the OpenAI error shape (where
    the server can send an HTTP answer to a handshake; else the socket is closed with the reason)
    and logged, instead of the bare 403 of a server with no WebSocket route."""
    ws = WebSocket(scope, receive, send)
    log.warning(
        "websocket refused: not proxied",
        extra={"fields": {"route": "websocket", "status": 501}},
    )
    if "websocket.http.response" in scope.get("extensions", {}):
        await ws.send_denial_response(error_response("openai", 501, WEBSOCKETS_501))
    else:
        await ws.close(code=1008, reason="not proxied by context-ceiling")


#: how long a failed background task waits before it runs again, doubling up to the second
RESTART_S = (0.5, 30.0)


async def supervised(name: str, run: Callable[[], Awaitable[None]], failures: Counter) -> None:
    """Run a background task for the server's life: an exception is logged, counted
    (``llm_context_background_failures_total{task}``) and the task started again after a
    growing pause; only cancellation (the server stopping) ends it."""
    pause = RESTART_S[0]
    while True:
        try:
            await run()
            return
        except Exception:
            failures.labels(task=name).inc()
            log.exception("background task failed; restarting", extra={"fields": {"task": name}})
        await anyio.sleep(pause)
        pause = min(pause * 2, RESTART_S[1])


def _guarded(state: SidecarState, source: Literal["sighup"]) -> Callable[[], None]:
    """The SIGHUP handler: a reload that fails in any way is logged and counted, and the handler
    stays installed."""

    def reload() -> None:
        try:
            state.ceilings.reload_file(source)
        except Exception:
            state.metrics.background_failures.labels(task="sighup_reload").inc()
            log.exception("ceilings reload on SIGHUP failed")

    return reload


def _lifespan(
    state: SidecarState,
    probe: UpstreamProbe,
    group: WorkerGroup | None,
    freeze_heap: bool,
    probing: bool,
    flush: Callable[[], None],
) -> Callable[[Starlette], contextlib.AbstractAsyncContextManager[None]]:
    """The app's lifespan: SIGHUP reloads the ceilings, SIGTERM drains, the background tasks
    (ceilings watch, upstream probe, the worker group's follower), the capture writer and the
    answer checker run while the app serves; everything stops in reverse on the way out, once
    ``flush`` has recorded the finished requests still waiting for their batch."""
    settings = state.settings

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()
        hup = False
        try:
            loop.add_signal_handler(signal.SIGHUP, _guarded(state, "sighup"))
            hup = True
        except (RuntimeError, ValueError, NotImplementedError):  # not the main thread (tests)
            pass
        state.drain.grace = settings.limits.shutdown_grace_seconds
        undo_drain = state.drain.install(loop)
        log.info("sidecar started", extra={"fields": startup_fields(state)})
        if freeze_heap:
            gc.collect()
            gc.freeze()
        if state.capture is not None:
            state.capture.start()
        if state.answers is not None:
            state.answers.start()
        try:
            async with anyio.create_task_group() as tg:
                failures = state.metrics.background_failures
                if settings.ceilings_watch:
                    tg.start_soon(supervised, "ceilings_watch", state.ceilings.watch, failures)
                if probing:
                    tg.start_soon(supervised, "upstream_probe", probe.run, failures)
                if group is not None:
                    tg.start_soon(supervised, "worker_group", group.follow, failures)
                try:
                    yield
                finally:
                    tg.cancel_scope.cancel()
        finally:
            flush()
            undo_drain()
            if group is not None:
                group.leave()
            if hup:
                loop.remove_signal_handler(signal.SIGHUP)
            if state.capture is not None:
                await anyio.to_thread.run_sync(state.capture.stop)
            if state.answers is not None:
                await anyio.to_thread.run_sync(state.answers.stop)
            await state.aclose()

    return lifespan


def create_app(
    settings: Settings,
    transport: httpx.AsyncBaseTransport | None = None,
    metrics: Metrics | None = None,
    tracing: Tracing | None = None,
    group: WorkerGroup | None = None,
    freeze_heap: bool = False,
) -> HotPath:
    """Build the sidecar. ``transport`` replaces the network to the upstreams (tests, benchmarks);
    ``group``: this process is one of several workers (``sidecar/workers/supervisor.py``); ``freeze_heap``:
    this process is a server that lives as long as this app (``ceiling serve``), so once started
    its heap is moved out of the collector's generations (``gc.freeze``). Without that every
    full collection walked the modules, settings and tokenizer tables loaded at startup: a long
    stall of the event loop every few thousand requests, an order of magnitude shorter after.
    In a process that builds many apps (tests) frozen garbage would never be freed."""
    state = SidecarState.build(settings, transport, metrics, tracing)
    state.ceilings.reload_file("startup")  # a bad file at startup raises CeilingsError
    if group is not None:
        state.group = group
        group.join(state.ceilings, state.count_cache)
        pod = GroupCollector(group)
        state.metrics.expose_group(group.dir, pod, pod.stale_states)
    proxy = Proxy(state)
    admin = Admin(state)
    probe = UpstreamProbe(state)
    passthrough = Passthrough(state)
    ops = Ops(state, probe, injected=transport is not None)
    lifespan = _lifespan(
        state, probe, group, freeze_heap, probing=transport is None, flush=proxy.rec.flush
    )
    app = Starlette(
        routes=[
            # HotPath answers the measured POSTs before Starlette; every other method and path
            # that is not the sidecar's own passes through to its upstream
            Route("/v1/models", proxy.models, methods=["GET"]),
            Route("/healthz", ops.healthz, methods=["GET"]),
            Route("/readyz", ops.readyz, methods=["GET"]),
            Route("/status", ops.status, methods=["GET"]),
            Route("/budget", ops.budget, methods=["GET"]),
            Route("/openapi.json", ops.openapi, methods=["GET"]),
            Route("/metrics", ops.metrics, methods=["GET"]),
            Route("/admin/ceilings", admin.ceilings, methods=["GET", "PUT"]),
            Route("/admin/ceilings/validate", admin.validate, methods=["POST"]),
            Route("/{path:path}", passthrough.handle, methods=ALL_METHODS),
        ],
        lifespan=lifespan,
    )
    app.state.sidecar = state
    return HotPath(app, proxy, settings.listen.admin_port)


def startup_fields(state: SidecarState) -> dict[str, object]:
    """The startup line: what this process runs with (names and numbers, never URLs or
    tokens)."""
    s = state.settings
    doc = state.ceilings.current
    return {
        "message": "sidecar started",
        "version": __version__,
        "listen": f"{s.listen.host}:{s.listen.port}",
        "upstreams": sorted(state.upstreams.all_clients()),
        "models": [spec.metric_label for spec in s.models],
        "workloads": list(s.workloads),
        "mode": s.enforcement.mode,
        "ceilings_version": doc.version,
        "ceilings_entries": len(doc.entries),
        "admin_api": state.admin_token is not None,
        "tracing": state.tracing.tracer is not None,
        "capture": state.capture is not None,
        "workers": s.workers,
        "bpe": bpe_engine(state.default_counter),
        "pid": os.getpid(),
    }


#: answered on the traffic port and the admin port alike
OPS_PATHS = frozenset({"/healthz", "/readyz", "/status"})
ALL_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]


class HotPath:
    """The proxy routes as plain ASGI in front of Starlette; everything else goes to Starlette.

    Every model call passes through here, and a stream sends dozens of messages; Starlette's
    router and its two exception middlewares wrap every one of them, a cost paid on every
    message of every stream. The proxy handlers already turn every expected failure into
    the client's own error format, so they need none of that; an unexpected exception still
    becomes a 500 in that format rather than a bare text page.
    """

    def __init__(self, app: Starlette, proxy: Proxy, admin_port: int | None = None) -> None:
        self.app, self.proxy = app, proxy
        self.state = app.state
        self.admin_port = admin_port

    def _wrong_port(self, scope: Scope) -> bool:
        """With ``listen.admin_port``: /metrics and /admin/* only there, traffic only on the
        traffic port (the probes and /status on both)."""
        server = scope.get("server") or (None, None)
        on_admin = server[1] == self.admin_port
        path = scope["path"]
        if path in OPS_PATHS:
            return False
        admin_path = path == "/metrics" or path.startswith("/admin/")
        return bool(admin_path != on_admin)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            await _no_websockets(scope, receive, send)
            return
        if self.admin_port is not None and scope["type"] == "http" and self._wrong_port(scope):
            await JSONResponse(
                {"error": {"message": "not found on this port", "type": "not_found"}},
                status_code=404,
            )(scope, receive, send)
            return
        route = None
        if scope["type"] == "http" and scope["method"] == "POST":
            route = route_for(scope["path"])
        if route is None:
            await self.app(scope, receive, send)
            return
        try:
            response = await self.proxy.handle(Incoming(scope, receive), route)
        except Exception:
            log.exception("unexpected error in the proxy path")
            response = error_response(
                route.api, 500, "internal error in the context-ceiling sidecar"
            )
        await response(scope, receive, send)
