"""The ASGI application: routes, probes and the metrics endpoint."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import re
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from urllib.parse import urlsplit

import anyio
import httpx
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from context_ceiling import __version__
from context_ceiling.core.tokenizers import bpe_engine
from context_ceiling.core.wire import Api
from context_ceiling.sidecar.admin import Admin, budget_answer
from context_ceiling.sidecar.config import Settings
from context_ceiling.sidecar.errors import error_response
from context_ceiling.sidecar.group import GroupCollector, WorkerGroup
from context_ceiling.sidecar.metrics import Metrics
from context_ceiling.sidecar.passthrough import Passthrough
from context_ceiling.sidecar.proxy import Proxy
from context_ceiling.sidecar.state import State
from context_ceiling.sidecar.tracing import Tracing

READY_CACHE_S = 5.0
PROBE_INTERVAL_S = 15.0
log = logging.getLogger(__name__)


class UpstreamProbe:
    """Whether each upstream accepts a TCP connection: ``/status`` and
    ``llm_context_upstream_up{upstream}`` (probed in the background every
    ``PROBE_INTERVAL_S``). Not part of readiness: a network blip to the provider must not take
    every replica out of its Service, where each request would get a clean per-request 502.

    The check is cached for a few seconds so a tight poll does not hammer the provider."""

    def __init__(self, state: State) -> None:
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
            for api, client in self.state.all_clients().items():
                out[api] = await self._probe(str(client.base_url))
                self.state.metrics.upstream_up.labels(upstream=api).set(out[api] == "ok")
            self._result, self._checked = out, time.monotonic()
        return self._result

    async def run(self) -> None:
        while True:
            await self.check()
            await asyncio.sleep(PROBE_INTERVAL_S)


def create_app(
    settings: Settings,
    transport: httpx.AsyncBaseTransport | None = None,
    metrics: Metrics | None = None,
    tracing: Tracing | None = None,
    group: WorkerGroup | None = None,
    freeze_heap: bool = False,
) -> HotPath:
    """Build the sidecar. ``transport`` replaces the network to the upstreams (tests, benchmarks);
    ``group``: this process is one of several workers (``sidecar/workers.py``); ``freeze_heap``:
    this process is a server that lives as long as this app (``ceiling serve``), so once started
    its heap is moved out of the collector's generations (``gc.freeze``). Without that every
    full collection walked the modules, settings and tokenizer tables loaded at startup: a long
    stall of the event loop every few thousand requests, an order of magnitude shorter after.
    In a process that builds many apps (tests) frozen garbage would never be freed."""
    state = State.build(settings, transport, metrics, tracing)
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

    async def healthz(_: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(_: Request) -> Response:
        """The sidecar's own state: config validated and ceilings loaded (both happen before
        the app exists, so a running app is ready), and not shutting down (unready from the
        SIGTERM on, so no new stream starts in the grace); the provider is not asked."""
        if state.drain.draining:
            return JSONResponse({"status": "shutting down"}, status_code=503)
        return JSONResponse({"status": "ok", "ceilings_version": state.ceilings.current.version})

    async def budget(request: Request) -> Response:
        """``GET /budget?model=M&workload=W&reservation=R``: the input budget a request builder
        must fit, read-only (its own optional token, never the admin one)."""
        return budget_answer(state, request)

    async def status(_: Request) -> Response:
        """Upstream reachability (what /readyz used to check), for people and dashboards."""
        upstreams: dict[str, str]
        if transport is not None:  # injected upstreams have no address to probe
            upstreams = dict.fromkeys(state.all_clients(), "injected")
        else:
            upstreams = await probe.check()
        down = [name for name, state_ in upstreams.items() if state_ not in ("ok", "injected")]
        return JSONResponse(
            {
                # the sidecar itself is fine (that is /readyz); an upstream it cannot reach is
                # what an operator looking here needs to see first
                "status": "degraded" if down else "ok",
                "upstreams": upstreams,
                "ceilings_version": state.ceilings.current.version,
            }
        )

    async def metrics_endpoint(_: Request) -> Response:
        return Response(generate_latest(state.metrics.exposed), media_type=CONTENT_TYPE_LATEST)

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()
        hup = False
        try:
            loop.add_signal_handler(signal.SIGHUP, state.ceilings.reload_file, "sighup")
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
                if settings.ceilings_watch:
                    tg.start_soon(state.ceilings.watch)
                if transport is None:
                    tg.start_soon(probe.run)
                if group is not None:
                    tg.start_soon(group.follow)
                try:
                    yield
                finally:
                    tg.cancel_scope.cancel()
        finally:
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

    hot: dict[str, Handler] = {
        "/v1/chat/completions": proxy.openai_chat,
        "/v1/responses": proxy.openai_responses,
        "/v1/responses/input_tokens": proxy.openai_responses_input_tokens,
        "/v1/messages": proxy.anthropic_messages,
        "/v1/messages/count_tokens": proxy.anthropic_count_tokens,
        "/openai/v1/chat/completions": proxy.azure_v1_chat,
        "/openai/v1/responses": proxy.azure_responses,
        "/openai/responses": proxy.azure_responses,
    }
    app = Starlette(
        routes=[
            # HotPath answers the measured POSTs before Starlette; every other method and path
            # that is not the sidecar's own passes through to its upstream
            Route("/v1/models", proxy.models, methods=["GET"]),
            Route("/healthz", healthz, methods=["GET"]),
            Route("/readyz", readyz, methods=["GET"]),
            Route("/status", status, methods=["GET"]),
            Route("/budget", budget, methods=["GET"]),
            Route("/metrics", metrics_endpoint, methods=["GET"]),
            Route("/admin/ceilings", admin.ceilings, methods=["GET", "PUT"]),
            Route("/admin/ceilings/validate", admin.validate, methods=["POST"]),
            Route("/{path:path}", passthrough.handle, methods=ALL_METHODS),
        ],
        lifespan=lifespan,
    )
    app.state.sidecar = state
    return HotPath(app, hot, proxy.azure_chat, proxy.gemini, settings.listen.admin_port)


def startup_fields(state: State) -> dict[str, object]:
    """The startup line: what this process runs with (names and numbers, never URLs or
    tokens)."""
    s = state.settings
    doc = state.ceilings.current
    return {
        "message": "sidecar started",
        "version": __version__,
        "listen": f"{s.listen.host}:{s.listen.port}",
        "upstreams": sorted(state.all_clients()),
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


Handler = Callable[[Request], Awaitable[Response]]
AZURE_PREFIX = "/openai/deployments/"
#: Gemini API and Vertex AI model methods the sidecar measures
GEMINI_PATH = re.compile(
    r"^/v1(?:beta\d*|alpha)?/(?:projects/[^/]+/locations/[^/]+/publishers/google/)?"
    r"models/[^/:]+:(?:generateContent|streamGenerateContent|countTokens)$"
)
AZURE_CHAT = "/chat/completions"
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

    def __init__(
        self,
        app: Starlette,
        routes: dict[str, Handler],
        azure: Handler,
        gemini: Handler,
        admin_port: int | None = None,
    ) -> None:
        self.app, self.routes, self.azure, self.gemini = app, routes, azure, gemini
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
        if self.admin_port is not None and scope["type"] == "http" and self._wrong_port(scope):
            await JSONResponse(
                {"error": {"message": "not found on this port", "type": "not_found"}},
                status_code=404,
            )(scope, receive, send)
            return
        handler = None
        if scope["type"] == "http" and scope["method"] == "POST":
            path = scope["path"]
            handler = self.routes.get(path)
            if handler is None and path.startswith(AZURE_PREFIX) and path.endswith(AZURE_CHAT):
                handler = self.azure
            elif handler is None and GEMINI_PATH.match(path):
                handler = self.gemini

        if handler is None:
            await self.app(scope, receive, send)
            return
        try:
            response = await handler(Request(scope, receive))
        except Exception:
            log.exception("unexpected error in the proxy path")
            api: Api = (
                "anthropic"
                if scope["path"].startswith("/v1/messages")
                else "gemini"
                if GEMINI_PATH.match(scope["path"])
                else "openai"
            )
            response = error_response(api, 500, "internal error in the context-ceiling sidecar")
        await response(scope, receive, send)
