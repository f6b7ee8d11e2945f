"""Every route the sidecar does not measure, passed through to the upstream it belongs to.

A drop-in proxy must not break the calls it has no opinion on: embeddings, legacy completions,
files, batches, stored chat completions (``GET /v1/chat/completions``), Anthropic message
batches, and whatever a provider adds next. Method, path, query, headers (less the hop-by-hop
ones) and body go upstream unchanged and the answer comes back unchanged; both bodies are
streamed (nothing is held beyond the read in progress), under the same body limit and timeouts
as the measured routes. Each request is counted (``llm_context_requests_total{api="passthrough"}``
and ``llm_context_passthrough_requests_total{upstream,route,outcome}``, ``route`` a known route
name or ``other``: never the raw path) and logged in one line, without its path beyond the route
name.

Which upstream, first match wins: the model a JSON body names (embeddings, legacy completions,
stored responses, ... : the model entry's ``upstream``, so a model served by a named upstream gets
its pass-through calls there too, with the client's key and prompt); an ``X-Ceiling-Upstream:
NAME`` header (files and batches, which name no model); an Azure OpenAI path's resource, by its
deployment when a model entry matches the deployment name; then the API's default: an Anthropic
client always sends ``anthropic-version`` (and usually ``x-api-key``), anything else goes to the
OpenAI-style upstream. A sidecar with one upstream sends everything there. A request that names
no upstream this sidecar has is a 404 in the client's error shape, never an empty body.

Bodies are re-sent with the client's framing: a body the client sent with ``Content-Length`` goes
upstream with it (some gateways answer 411 to a chunked body), a chunked one chunked.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Protocol

import httpx
import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from context_ceiling.core.models import Registry
from context_ceiling.core.vocabulary import Api
from context_ceiling.formats import API_FORMATS, APIS, client_api_of
from context_ceiling.formats.azure import AZURE, deployment
from context_ceiling.formats.base import ApiInfo, SigningRefused
from context_ceiling.sidecar.config import Settings
from context_ceiling.sidecar.errors import error_response
from context_ceiling.sidecar.exchange import request_id
from context_ceiling.sidecar.observability.logs import log_request
from context_ceiling.sidecar.observability.metrics import OTHER_ROUTE, Metrics
from context_ceiling.sidecar.outcomes import Outcome, failure_of, outcome_of
from context_ceiling.sidecar.upstream.bodies import BodyTooLarge, capped, check_declared, read_body
from context_ceiling.sidecar.upstream.client import request_headers, response_headers
from context_ceiling.sidecar.upstream.credentials import accepts, owner_of, refusal
from context_ceiling.sidecar.upstream.pool import UpstreamPool

log = logging.getLogger(__name__)


def route_label(api: Api, path: str) -> str:
    """The ``route`` label of a pass-through request: the provider's name for its first path
    segment (after the version), else ``other``; never the raw path."""
    parts = [p for p in path.split("/") if p]
    if parts[:1] and parts[0] in ("v1", "v1beta", "v1alpha"):
        parts = parts[1:]
    routes = API_FORMATS[api].passthrough_routes
    return routes.get(parts[0], OTHER_ROUTE) if parts else OTHER_ROUTE


def client_api(request: Request) -> Api:
    """The API a client speaks, from the headers its SDK always sends (and the paths only its
    routes have)."""
    return client_api_of(request.headers, request.url.path)


#: a pass-through JSON body up to this size is read whole to find the model it names (larger
#: ones, and every other body, stream through untouched)
MODEL_PEEK_BYTES = 1 << 20
#: names the upstream of a pass-through request that names no model (files, batches)
UPSTREAM_HEADER = "x-ceiling-upstream"


def body_model(body: bytes | None) -> str | None:
    """The ``model`` a JSON body names, if any."""
    if not body:
        return None
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    model = obj.get("model") if isinstance(obj, dict) else None
    return model if isinstance(model, str) and model else None


class PassthroughDeps(Protocol):
    """What the pass-through uses: the upstreams, the registry (a model's upstream), the
    settings (body limits) and the metrics."""

    upstreams: UpstreamPool
    registry: Registry
    settings: Settings
    metrics: Metrics


def pick_upstream(
    pool: UpstreamPool, registry: Registry, request: Request, model: str | None = None
) -> tuple[Api, str] | None:
    """(API, upstream name) the request belongs to (see the module's docstring): the model's
    upstream, the named one, the Azure resource, else the API's default (an Anthropic client's
    to an Anthropic upstream, the default one, else the first named one; anything else to the
    OpenAI-style one likewise, or to the only upstream there is)."""
    api = client_api(request)
    named_header = request.headers.get(UPSTREAM_HEADER)
    if named_header is not None:
        found = pool.named.get(named_header)
        if found is not None:
            return found[0], named_header
        if named_header in pool.clients:
            return named_header, named_header
        return None
    azure_path = request.url.path.startswith("/openai/")
    spec = registry.resolve(model) if model else None
    if spec is None and azure_path:
        named_deployment = deployment(request.url.path)
        spec = registry.resolve(named_deployment) if named_deployment else None
    if spec is not None and spec.upstream is not None and spec.upstream in pool.named:
        up_api = pool.named[spec.upstream][0]
        if up_api == api or (azure_path and up_api == "openai"):
            return up_api, spec.upstream
    azure = pool.marked(AZURE.marked_by) if azure_path else None
    if api == "openai" and azure is not None:
        return api, azure  # an Azure OpenAI client's deployment path
    if api in pool.clients:
        return api, api
    named = next((n for n, (a, _, _) in pool.named.items() if a == api), None)
    if named is not None:
        return api, named
    if api == "openai" and len(pool.clients) == 1 and not pool.named:
        only = next(iter(pool.clients))
        return only, only
    return None


def upstream_path(api: Api, base_url: httpx.URL, path: str) -> str:
    """The client's path relative to the upstream's base URL: an OpenAI base URL ends in /v1
    (what the SDK is given), so the client's /v1 prefix is the base's."""
    base = base_url.path.rstrip("/")
    if api == "openai" and base.endswith("/v1") and (path == "/v1" or path.startswith("/v1/")):
        return path[3:] or "/"
    return path


async def _sign(info: ApiInfo, req: httpx.Request, content: Any) -> None:
    """``req`` signed again where its API signs its requests (the body ``content`` read
    whole); else as it is."""
    if info.signer is None:
        return
    body = content if isinstance(content, bytes) else b""
    req.headers = httpx.Headers(
        await info.signed(str(req.url), list(req.headers.multi_items()), body, False, req.method)
    )


class Passthrough:
    def __init__(self, state: PassthroughDeps) -> None:
        self.state = state

    async def handle(self, request: Request) -> Response:
        try:
            return await self._forward(request)
        except Exception:
            log.exception("internal error in the pass-through")
            return error_response(
                client_api(request), 500, "internal error in the context-ceiling pass-through"
            )

    async def _forward(self, request: Request) -> Response:
        st = self.state
        started = time.perf_counter()
        limits = st.settings.limits
        declared = request.headers.get("content-length")
        peeked: bytes | None = None
        if (
            request.method in ("POST", "PUT", "PATCH")
            and "json" in request.headers.get("content-type", "")
            and declared is not None
            and declared.isdigit()
            and int(declared) <= min(MODEL_PEEK_BYTES, limits.max_body_bytes)
        ):
            try:
                async with asyncio.timeout(limits.body_read_timeout):
                    peeked = await read_body(request, limits.max_body_bytes)
            except BodyTooLarge:
                peeked = None
            except TimeoutError:
                return error_response(
                    client_api(request),
                    408,
                    f"the request body did not arrive within {limits.body_read_timeout:g} s",
                )
        picked = pick_upstream(st.upstreams, st.registry, request, body_model(peeked))
        rid = request_id(None)
        target = st.upstreams.route(*picked) if picked else None
        owner = owner_of(request.headers, request.url.path)
        if owner is not None and (
            picked is None or target is None or not accepts(owner, picked[0], target[2])
        ):
            return refusal(owner, client_api(request), headers={"x-ceiling-request-id": rid})
        if picked is None or target is None:
            asked = client_api(request)
            return error_response(
                asked,
                404,
                f"this sidecar has no {asked} upstream for the route "
                f"{route_label(asked, request.url.path)!r} (configure upstreams.{asked})",
                headers={"x-ceiling-request-id": rid},
            )
        api, name = picked
        route = route_label(api, request.url.path)

        def fail(status: int, outcome: Outcome, message: str) -> Response:
            self._record(name, route, request, rid, started, status, outcome)
            return error_response(api, status, message, headers={"x-ceiling-request-id": rid})

        too_large = f"request body exceeds the limit of {limits.max_body_bytes} bytes"
        _, client, cfg = target
        has_body = request.method not in ("GET", "HEAD", "DELETE", "OPTIONS") or bool(declared)
        headers = request_headers(request.headers.items())
        headers = [(k, v) for k, v in headers if k.lower() != UPSTREAM_HEADER]
        if "accept-encoding" in request.headers:  # never read here: relayed as it comes
            headers.append(("accept-encoding", request.headers["accept-encoding"]))
        try:
            check_declared(declared, limits.max_body_bytes, BodyTooLarge)
            content: Any = None
            if peeked is not None:
                content = peeked  # httpx frames it with its Content-Length
            elif has_body:
                content = capped(request.stream(), limits.max_body_bytes, BodyTooLarge)
                if declared is not None and declared.isdigit():
                    headers.append(("content-length", declared))  # the client's framing
            if APIS[api].signer is not None and has_body and peeked is None:
                # a signature covers the body: read it whole (capped) to sign it
                content = await read_body(request, limits.max_body_bytes)
                headers = [(k, v) for k, v in headers if k.lower() != "content-length"]
            req = client.build_request(
                request.method,
                upstream_path(api, client.base_url, request.url.path),
                params=list(request.query_params.multi_items()),
                headers=headers,
                content=content,
            )
            await _sign(APIS[api], req, content)
            async with asyncio.timeout(cfg.timeouts.total):
                resp = await client.send(req, stream=True)
        except BodyTooLarge:
            return fail(413, "invalid", too_large)
        except SigningRefused as exc:
            return fail(exc.status, exc.outcome, str(exc))
        except (httpx.TransportError, TimeoutError) as exc:
            f = failure_of(exc)
            return fail(f.status, f.outcome, f.message)
        deadline = time.monotonic() + cfg.timeouts.total
        return _Relay(
            resp,
            deadline,
            lambda outcome: self._record(
                name, route, request, rid, started, resp.status_code, outcome
            ),
            rid,
        )

    def _record(
        self,
        upstream: str,
        route: str,
        request: Request,
        rid: str,
        started: float,
        status: int,
        outcome: Outcome,
    ) -> None:
        m = self.state.metrics
        # the upstream that took it, by name (the API's default under its API's name): a
        # named upstream or a second Azure resource is told apart; labels stay bounded by the
        # configuration
        m.passthrough.labels(upstream=upstream, route=route, outcome=outcome).inc()
        m.requests.labels(
            model="other", workload="default", api="passthrough", outcome=outcome
        ).inc()
        log_request(
            {
                "request_id": rid,
                "api": "passthrough",
                "upstream": upstream,
                "route": route,
                "method": request.method if request.method.isalpha() else "other",
                "status": status,
                "outcome": outcome,
                "latency_ms": round((time.perf_counter() - started) * 1000, 2),
            }
        )


class _Relay(Response):
    """The upstream's answer as it arrives (pure ASGI): status and headers, then the body read
    by read; a failure after the headers aborts the connection (no clean end for a cut body)."""

    def __init__(self, resp: httpx.Response, deadline: float, record: Any, rid: str) -> None:
        self.resp, self.deadline, self.record = resp, deadline, record
        self.status_code = resp.status_code
        self.background = None
        headers = response_headers(resp.headers) | {"x-ceiling-request-id": rid}
        if resp.headers.get("content-encoding"):  # relayed raw, so still encoded
            headers["content-encoding"] = resp.headers["content-encoding"]
        self.raw_headers = [
            (k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()
        ]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        outcome = outcome_of(self.resp.status_code)
        failed = False
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": self.status_code,
                    "headers": self.raw_headers,
                }
            )
            async with asyncio.timeout(max(0.0, self.deadline - time.monotonic())):
                async for chunk in self.resp.aiter_raw():
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except (httpx.TransportError, TimeoutError) as exc:
            f = failure_of(exc)
            outcome, failed = f.outcome, True
        except OSError:
            outcome, failed = "cancelled", True
        finally:
            await self.resp.aclose()
            self.record(outcome)
        if not failed:
            await send({"type": "http.response.body", "body": b"", "more_body": False})
