"""The proxy path: measure a chat request, forward it, pass the answer back, record the result.

Every request is parsed and counted once before forwarding; its body goes upstream byte for byte
unless the sidecar must change it (OpenAI streams get ``stream_options.include_usage`` so usage
can be recorded). Responses come back unchanged: bodies as the upstream sent them, streams event
by event as they arrive, errors with the upstream's own status and body.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from typing import Any, Protocol

import httpx
import orjson
from starlette.requests import Request
from starlette.responses import Response

from context_ceiling.core.models import OTHER, Registry
from context_ceiling.core.shape_checks import RequestShapeError
from context_ceiling.core.tokenizers import TextCounter
from context_ceiling.core.vocabulary import Api
from context_ceiling.formats import APIS
from context_ceiling.formats.base import Route, SigningRefused, Usage
from context_ceiling.sidecar import routing, schedule
from context_ceiling.sidecar.capture.redact import looks_like_credential
from context_ceiling.sidecar.capture.writer import Collector
from context_ceiling.sidecar.ceilings.store import CeilingStore
from context_ceiling.sidecar.config import Upstream
from context_ceiling.sidecar.drain import Drain
from context_ceiling.sidecar.enforce import Decision, context_error
from context_ceiling.sidecar.errors import error_response
from context_ceiling.sidecar.exchange import Exchange, request_id
from context_ceiling.sidecar.incoming import ClientDisconnect, Incoming
from context_ceiling.sidecar.observability.logs import bounded
from context_ceiling.sidecar.observability.record import RecordDeps, Recorder
from context_ceiling.sidecar.observability.semconv import provider_name
from context_ceiling.sidecar.outcomes import Outcome, failure_of, outcome_of
from context_ceiling.sidecar.upstream.bodies import (
    BodyTooLarge,
    ResponseTooLarge,
    gzipped,
    read_body,
    read_capped,
    read_capped_raw,
)
from context_ceiling.sidecar.upstream.client import (
    UpstreamClient,
    accepts_gzip,
    request_headers,
    response_headers,
    with_beta,
)
from context_ceiling.sidecar.upstream.credentials import accepts, owner_of, refusal_message
from context_ceiling.sidecar.upstream.relay import StreamRelay, Tap

log = logging.getLogger(__name__)

WORKLOAD_HEADER = "x-ceiling-workload"
#: With the admin token as its value, the request is never trimmed (the sweep measures with it).
BYPASS_HEADER = "x-ceiling-bypass"


class Refused(Exception):
    """A step of the request path ends the exchange: answered in the client's error shape with
    this status and recorded with this outcome (``invalid`` unless the step says otherwise)."""

    def __init__(
        self, status: int, message: str, outcome: Outcome = "invalid", code: str | None = None
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.outcome, self.code = status, message, outcome, code


def _merged_models(answers: list[httpx.Response]) -> dict[str, Any] | None:
    """The model lists of several upstreams as one (each model once, the first upstream's
    entry winning); None when none of them is a model list."""
    merged: dict[str, Any] | None = None
    seen: set[str] = set()
    for r in answers:
        try:
            body = orjson.loads(r.content)
        except orjson.JSONDecodeError:
            continue
        if not isinstance(body, dict) or not isinstance(body.get("data"), list):
            continue
        if merged is None:
            merged = {**body, "data": []}
        for m in body["data"]:
            mid = m.get("id") if isinstance(m, dict) else None
            if isinstance(mid, str) and mid not in seen:
                seen.add(mid)
                merged["data"].append(m)
    return merged


class ProxyDeps(schedule.PlanDeps, RecordDeps, Protocol):
    """What the measured routes use: the count plan's and the recorder's collaborators, and
    the registry, the ceilings, the workloads, the admin token (a bypass), the fallback
    counter and the drain (streams ended at shutdown)."""

    registry: Registry
    ceilings: CeilingStore
    workloads: frozenset[str]
    admin_token: str | None
    default_counter: TextCounter
    drain: Drain


class Proxy:
    """The measured routes' handlers."""

    def __init__(self, state: ProxyDeps) -> None:
        #: an answer longer than this is not read for answer signals (answers.max_bytes)
        self._answer_bytes = state.settings.answers.max_bytes
        self.state = state
        self.rec = Recorder(state)

    # -- helpers ---------------------------------------------------------------------------

    def _workload(self, request: Incoming) -> str:
        name = request.headers.get(WORKLOAD_HEADER)
        return name if name and name in self.state.workloads else "default"

    def _fail(
        self, ex: Exchange, status: int, outcome: Outcome, message: str, code: str | None = None
    ) -> Response:
        ex.status, ex.outcome = status, outcome
        self.rec.finish(ex)
        return error_response(ex.route.api, status, message, code, headers=self.rec.headers(ex))

    # -- the request path ------------------------------------------------------------------

    async def handle(self, request: Incoming, route: Route) -> Response:
        """The request path: parse -> measure -> decide -> forward, each step a function that
        either fills the exchange or refuses it; recording happens once, when it ends."""
        ex = Exchange(
            route=route,
            request_id=request_id(request.headers.get("x-request-id")),
            workload=self._workload(request),
            started=time.perf_counter(),
        )
        self.rec.opened()
        plan: schedule.CountPlan | None = None
        try:
            raw, obj = await self._parse(request, route, ex)
            plan = await self._measure(request, route, ex, obj, raw)
            target = await self._decide(request, route, plan)
            body = raw if ex.decision is None or ex.decision.body is None else None
            return await self._forward(request, route, plan, body, target)
        except Refused as r:
            if plan is not None and ex.upstream_started is None:
                plan.cancel()
            elif plan is not None:  # forwarded, then failed: its count is still this request's
                await plan.settle()
            return self._fail(ex, r.status, r.outcome, r.message, r.code)
        except ClientDisconnect:
            if plan is not None:
                plan.cancel()
            ex.outcome = "cancelled"
            self.rec.finish(ex)
            return Response(status_code=499)
        except Exception:
            if plan is not None:
                plan.cancel()
            # a bug, not bad input (bad input is a 4xx before this): logged with its type and
            # traceback, counted as internal_error, its span ended, answered in the client's
            # error shape with the request id, so it can be found
            log.exception(
                "internal error",
                extra={"fields": {"request_id": ex.request_id, "api": route.metric_api}},
            )
            try:
                return self._fail(
                    ex,
                    500,
                    "internal_error",
                    f"internal error in context-ceiling (request id {ex.request_id})",
                )
            except Exception:
                log.exception("recording an internal error failed")
                return error_response(
                    route.api,
                    500,
                    f"internal error in context-ceiling (request id {ex.request_id})",
                    headers={"x-ceiling-request-id": ex.request_id},
                )

    async def _parse(
        self, request: Incoming, route: Route, ex: Exchange
    ) -> tuple[bytes, dict[str, Any]]:
        """Parse: an upstream for this API, headers and body within their limits, a JSON object
        with a model. Sets the exchange's model."""
        st = self.state
        if not st.upstreams.serves(route.api):
            example = APIS[route.api].example if route.api in APIS else "..."
            raise Refused(
                404,
                f"no {route.api} upstream is configured on this sidecar; the request was not "
                f"forwarded anywhere (add upstreams.{route.api}: {{base_url: {example}}})",
            )
        limits = st.settings.limits
        if sum(len(k) + len(v) for k, v in request.headers.raw) > limits.max_header_bytes:
            raise Refused(431, f"request headers exceed {limits.max_header_bytes} bytes")
        try:
            async with asyncio.timeout(limits.body_read_timeout):
                raw = await read_body(request, limits.max_body_bytes)
        except TimeoutError:
            raise Refused(
                408,
                f"the request body did not arrive within {limits.body_read_timeout:g} seconds",
            ) from None
        except BodyTooLarge:
            raise Refused(
                413, f"request body exceeds the limit of {limits.max_body_bytes} bytes"
            ) from None
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise Refused(400, f"request body is not valid JSON: {exc}") from None
        if not isinstance(obj, dict):
            raise Refused(400, "request body must be a JSON object")
        model = route.model(obj, request.path)
        if not isinstance(model, str) or not model:
            raise Refused(400, "'model' is required and must be a string")
        if looks_like_credential(model):
            # refused before anything records it: the name is never logged, traced or labelled
            raise Refused(
                400,
                "'model' looks like a credential (an API key or token), not a model name; "
                "the request was refused and the value not recorded",
            )
        ex.model = model
        return raw, obj

    async def _measure(
        self, request: Incoming, route: Route, ex: Exchange, obj: dict[str, Any], raw: bytes
    ) -> schedule.CountPlan:
        """Measure: the model's spec, the ceilings in force, the count plan, and the count when
        it is taken first (exact from the engine where it tokenizes), or none when a bound proves
        the request within its budget (``counting.strategy: bounded``)."""
        st = self.state
        ex.ceilings = st.ceilings.current
        ex.max_tokens = route.format.requested_output(obj)
        if not route.count_only:
            ex.provider = route.provider_name(request.path)
            ex.operation = route.format.operation
            ex.span = st.tracing.start(ex.operation, ex.model, ex.provider, request.headers)
        spec = st.registry.resolve(ex.model)
        if spec is not None:
            if route.format.betas_header is not None:
                spec = spec.for_betas(request.headers.get(route.format.betas_header))
            ex.spec, ex.label = spec, spec.metric_label
        counter = st.registry.counter(spec) if spec else st.default_counter
        ex.body_bytes = len(raw)
        plan = schedule.plan(st, self.rec, route, ex, obj, raw, counter)
        if plan.first:
            try:
                await plan.count_first()
            except RequestShapeError as exc:
                raise Refused(400, str(exc)) from None
        return plan

    async def _decide(
        self, request: Incoming, route: Route, plan: schedule.CountPlan
    ) -> tuple[UpstreamClient, Upstream]:
        """Decide: which upstream, whether a bypass is allowed, and the ceiling's verdict
        (forward, trim or reject). Returns the upstream's client and settings."""
        st, ex = self.state, plan.ex
        spec = ex.spec
        wanted = spec.upstream if spec else None
        if wanted is None and route.provider is not None:
            wanted = st.upstreams.marked(route.provider.marked_by)
        target = st.upstreams.route(route.api, wanted)
        if target is None:
            served = f"the {spec.upstream!r} upstream" if spec and spec.upstream else "no upstream"
            raise Refused(
                404 if not (spec and spec.upstream) else 400,
                f"model {bounded(ex.model)!r} is served by {served}, which does not take "
                f"{route.api} requests on this sidecar",
            )
        client, upstream_cfg = self._take(request, route, ex, target)
        bypass_token = request.headers.get(BYPASS_HEADER)
        if bypass_token is not None:
            if st.admin_token is None or not hmac.compare_digest(
                bypass_token.encode(), st.admin_token.encode()
            ):
                raise Refused(403, f"{BYPASS_HEADER} needs this sidecar's admin token")
            ex.bypass = True
        if route.count_only:
            return client, upstream_cfg
        if ex.bypass:
            plan.bypass()
        try:
            verdict = await plan.verdict()
        except RequestShapeError as exc:
            raise Refused(400, str(exc)) from None
        if verdict is None:  # nothing to trim: forwarded before (or without) a count
            return client, upstream_cfg
        d, why, rerouted = self._over_ceiling(request, route, plan, verdict)
        if rerouted is not None:
            return rerouted
        plan.decide(d)
        if d.reject:
            assert spec is not None
            message = context_error(route.format, ex.label, ex.workload, d, spec.window) + why
            raise Refused(400, message, "rejected", "context_length_exceeded")
        return client, upstream_cfg

    def _over_ceiling(
        self, request: Incoming, route: Route, plan: schedule.CountPlan, d: Decision
    ) -> tuple[Decision, str, tuple[UpstreamClient, Upstream] | None]:
        """The over-ceiling action on a verdict (:mod:`context_ceiling.sidecar.routing`): the
        decision as it stands, a rejection (with why, for its message), or the fallback's
        upstream the exchange was rerouted to."""
        st, ex, obj = self.state, plan.ex, plan.obj
        action = routing.action_for(st.settings.enforcement, ex.workload, ex.spec)
        if routing.rejects(action, d):
            return routing.rejected(d), " (over_ceiling: reject, so nothing was trimmed)", None
        if not routing.needs_fallback(action, d):
            return d, "", None
        routed, tried = routing.candidates(
            route,
            request.path,
            self._sent_path(request, route),
            obj,
            ex.model,
            ex.workload,
            action,
            st.registry,
            ex.ceilings,
            st.settings.enforcement,
            served=lambda s: st.upstreams.route(route.api, s.upstream) is not None,
            chunk_pattern=st.chunk_pattern,
        )
        if routed is not None:
            return d, "", self._reroute(request, route, plan, routed)
        return routing.rejected(d), "; " + routing.tried(tried), None

    def _reroute(
        self, request: Incoming, route: Route, plan: schedule.CountPlan, routed: routing.Routed
    ) -> tuple[UpstreamClient, Upstream]:
        """The exchange becomes the fallback's: its model, entry, count and decision; its
        upstream, checked for the request's credentials as the first one was. Metrics, usage,
        answer signals and prices then follow the model that answers."""
        st, ex = self.state, plan.ex
        self.rec.record_routed(ex, routed.spec.metric_label)
        target = st.upstreams.route(route.api, routed.spec.upstream)
        assert target is not None  # candidates() took only served models
        client, upstream_cfg = self._take(request, route, ex, target)
        ex.routed_from, ex.routed_from_label = ex.model, ex.label
        ex.routed_path, ex.routed_measured = routed.path_model, routed.measured
        ex.model, ex.spec, ex.label = routed.model, routed.spec, routed.spec.metric_label
        plan.reroute(routed.count, routed.decision)
        return client, upstream_cfg

    @staticmethod
    def _take(
        request: Incoming,
        route: Route,
        ex: Exchange,
        target: tuple[str, UpstreamClient, Upstream],
    ) -> tuple[UpstreamClient, Upstream]:
        """The exchange goes to this upstream, if the request's credentials may (a key of one
        provider never reaches another's upstream)."""
        ex.upstream, client, upstream_cfg = target
        owner = owner_of(request.headers, request.path)
        if not accepts(owner, route.api, upstream_cfg):
            assert owner is not None
            raise Refused(404, refusal_message(owner))
        where = client.base_url  # parsed once, when the client was built
        ex.server_address = where.host
        ex.server_port = where.port or (443 if where.scheme == "https" else 80)
        if not route.count_only:
            named = ex.upstream if ex.upstream != route.api else None
            ex.provider = provider_name(
                upstream_cfg.provider,
                ex.server_address,
                route.provider_name(request.path),
                named,
                compatible=route.api == "openai" and not getattr(upstream_cfg, "azure", False),
            )
            if ex.span is not None:
                ex.span.set_attribute("gen_ai.provider.name", ex.provider)
        return client, upstream_cfg

    @staticmethod
    def _sent_path(request: Incoming, route: Route) -> str:
        """The path as it goes upstream: where the route sends it as it came, the client's
        with its percent-escapes kept (a Bedrock model ARN's ``%3A``), else the route's."""
        if route.path_as_sent:
            return request.raw_path
        return route.path

    async def _forward(
        self,
        request: Incoming,
        route: Route,
        plan: schedule.CountPlan,
        body: bytes | None,
        target: tuple[UpstreamClient, Upstream],
    ) -> Response:
        """Forward: the (possibly trimmed) body upstream with the trace context; a streamed
        answer is relayed event by event, anything else read whole (capped). ``body`` is the
        client's bytes when nothing changed them (None: serialize ``obj``)."""
        client, upstream_cfg = target
        st, ex, obj = self.state, plan.ex, plan.obj
        if (
            st.capture is not None
            and not route.count_only
            and not ex.bypass
            and st.capture.sample(ex.workload, ex.body_bytes)
        ):
            ex.capture_body = obj  # the client's request, before any trimming
        if st.answers is not None and not route.count_only:
            ex.answer_expect = route.format.expect(obj)
        d = ex.decision
        if d is not None and d.body is not None:
            obj = d.body
        beta: tuple[str, str] | None = None  # (header, value) that turns native management on
        if d is not None and d.native is not None and not ex.bypass:
            obj = {**obj, "context_management": d.native}
            body = None  # serialized again, with the provider's context management
            native, header = route.format.native, route.format.betas_header
            if native is not None and native.beta is not None and header is not None:
                beta = (header, native.beta)
        ex.stream = not route.count_only and route.format.streams(obj, request.path)
        injected = False
        changed = body is None  # trimmed, or given the provider's context management
        if ex.stream:
            body, injected = route.format.prepare_stream(obj, body)
        changed = changed or injected
        content = body if body is not None else orjson.dumps(obj)
        headers = request_headers(request.headers.pairs)
        ex.accepts_gzip = accepts_gzip(request.headers.get("accept-encoding"))
        if not ex.stream and ex.accepts_gzip:
            # a compressed answer comes back compressed (the sidecar inflates a copy to read
            # its usage); a stream is parsed event by event, so it is asked for plain
            headers.append(("accept-encoding", "gzip"))
        if beta is not None:
            headers = with_beta(headers, *beta)
        if ex.span is not None:
            carrier: dict[str, str] = {}
            st.tracing.propagate(ex.span, carrier)
            headers = [(k, v) for k, v in headers if k.lower() not in carrier] + list(
                carrier.items()
            )
        path, params, headers = await self._addressed(
            request, route, client, headers, content, changed, ex.routed_path
        )
        deadline = time.monotonic() + upstream_cfg.timeouts.total
        ex.upstream_started = time.perf_counter()
        try:
            # asyncio's own timeout: the proxy runs on asyncio only, and anyio's cancel scope
            # costs ~3x more per use on this path (measured with py-spy under load)
            async with asyncio.timeout(upstream_cfg.timeouts.total):
                resp = await client.forward(path, content, headers, params)
        except (httpx.TransportError, TimeoutError) as exc:
            f = failure_of(exc)
            raise Refused(f.status, f.message, f.outcome) from None
        ex.status = resp.status_code
        if ex.pending is not None and not ex.bounded:  # the answer goes back with its count
            try:
                await plan.settle()
            except BaseException:
                await resp.aclose()
                raise
        if not ex.stream or resp.status_code != 200:
            return await self._unary(plan, resp, deadline)
        return self._relay(plan, resp, route.tap(injected), deadline)

    @staticmethod
    async def _addressed(
        request: Incoming,
        route: Route,
        client: UpstreamClient,
        headers: list[tuple[str, str]],
        content: bytes,
        changed: bool,
        routed_path: tuple[str, str] | None = None,
    ) -> tuple[str, list[tuple[str, str]] | None, list[tuple[str, str]]]:
        """Where the request goes upstream (path, query) and its final headers: signed again
        where the route's provider signs the body (``changed``: the sidecar changed it).
        ``routed_path``: the model's segment in the path and the fallback's, to swap."""
        path = Proxy._sent_path(request, route)
        params = request.query() if route.path_as_sent else None
        if routed_path is not None:
            path, changed = path.replace(*routed_path, 1), True
        # the signature covers the host, the path and the body: signed here, last
        try:
            headers = await APIS[route.api].signed(
                str(client.url(path, params)), headers, content, changed
            )
        except SigningRefused as exc:
            raise Refused(exc.status, str(exc), exc.outcome) from None
        return path, params, headers

    async def _unary(
        self, plan: schedule.CountPlan, resp: httpx.Response, deadline: float
    ) -> Response:
        ex = plan.ex
        cap = self.state.settings.limits.max_response_bytes
        try:
            async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                if gzipped(resp) and ex.accepts_gzip:  # relayed compressed; usage from a copy
                    content, plain = await read_capped_raw(resp, cap)
                else:
                    content = plain = await read_capped(resp, cap)
        except ResponseTooLarge:
            await resp.aclose()
            return self._fail(
                ex,
                502,
                "upstream_5xx",
                f"the upstream response exceeds limits.max_response_bytes ({cap} bytes)",
            )
        except (httpx.TransportError, TimeoutError) as exc:
            f = failure_of(exc)
            return self._fail(ex, f.status, f.outcome, f.message)
        finally:
            await resp.aclose()
        status = resp.status_code
        ex.outcome = outcome_of(status)
        if ex.outcome == "ok":
            ex.usage = ex.route.body_usage(plain)
            if ex.capture_body is not None:
                ex.capture_response = plain
            checker = self.state.answers
            if ex.answer_expect is not None and len(plain) <= self._answer_bytes:
                if checker is None or checker.reading(self.rec.busy):
                    ex.answer_raw = plain
                else:
                    ex.answer_unread = "cpu"  # counted by its stop reason only
        plan.after()
        headers = response_headers(resp.headers) | self.rec.headers(ex)
        if content is not plain:
            headers["content-encoding"] = "gzip"
        return Response(content, status_code=status, headers=headers)

    def _relay(
        self, plan: schedule.CountPlan, resp: httpx.Response, tap: Tap, deadline: float
    ) -> StreamRelay:
        ex = plan.ex
        collecting: Collector | None = None
        capture = ex.capture_body is not None and self.state.capture is not None
        limit = self.state.capture.cfg.max_request_bytes if self.state.capture and capture else 0
        checker = self.state.answers if ex.answer_expect is not None else None
        if checker is not None and not checker.reading(self.rec.busy):
            checker, ex.answer_unread = None, "cpu"  # counted by its stop reason only
        if checker is not None:
            limit = max(limit, self._answer_bytes)
        if limit:
            held = checker.held if checker is not None else None
            collecting = Collector(limit, held)

        def done(outcome: Outcome, usage: Usage) -> None:
            ex.outcome, ex.usage = outcome, usage
            if collecting is not None:
                if collecting.held is not None:  # the stream ended: what it kept is given back
                    collecting.held.give(collecting.size)
                if capture:
                    ex.capture_response = b"".join(collecting.reads)
                if checker is not None:
                    if not collecting.overflow and collecting.size <= self._answer_bytes:
                        ex.answer_raw = collecting.reads  # joined on the checker thread
                    elif collecting.size < self._answer_bytes:
                        ex.answer_unread = "busy"  # other answers held the bytes
            ex.chunks = relay.chunks
            plan.after()

        def first() -> None:
            ex.first_chunk_at = time.perf_counter()

        headers = response_headers(resp.headers) | self.rec.headers(ex)
        relay = StreamRelay(
            resp,
            tap,
            deadline,
            headers,
            done,
            self.state.settings.limits.max_event_bytes,
            drain=self.state.drain,
            on_first=first,
            framing=ex.route.format.framing,
            keep=collecting.keep if collecting is not None else None,
        )
        return relay

    async def models(self, request: Request) -> Response:
        """``GET /v1/models``: the models of every upstream of the API the client's headers
        point at (the default one and the named ones), merged: one ``base_url`` serves them
        all. An upstream that fails is left out; if every one fails, the first failure is
        answered as it came."""
        st = self.state
        api: Api = (
            "anthropic"
            if ("x-api-key" in request.headers or "anthropic-version" in request.headers)
            else "openai"
        )
        targets: list[UpstreamClient] = []
        if api in st.upstreams.clients:
            targets.append(st.upstreams.clients[api])
        targets += [
            c
            for a, c, up in st.upstreams.named.values()
            if a == api and not getattr(up, "azure", False)
        ]
        if not targets:  # the only upstream there is
            api = next(iter(st.upstreams.clients), "openai")
            targets = [st.upstreams.clients[api]] if st.upstreams.clients else []
        if not targets:
            return error_response(api, 404, "this sidecar has no upstream that lists models")
        path = "/models" if api == "openai" else "/v1/models"
        headers = request_headers(request.headers.items())
        params = httpx.QueryParams(list(request.query_params.multi_items()))

        async def one(client: UpstreamClient) -> httpx.Response | Exception:
            try:
                return await client.get(path, headers=headers, params=params)
            except httpx.HTTPError as exc:
                return exc

        answers = await asyncio.gather(*(one(c) for c in targets))
        ok = [r for r in answers if isinstance(r, httpx.Response) and r.status_code < 300]
        outcome = "ok" if ok else "upstream_5xx"
        if not ok:
            first = answers[0]
            if isinstance(first, Exception):
                f = failure_of(first)
                outcome, resp_ = f.outcome, error_response(api, f.status, f.message)
            else:
                outcome = outcome_of(first.status_code)
                resp_ = Response(
                    first.content,
                    status_code=first.status_code,
                    headers=response_headers(first.headers),
                )
            st.metrics.requests.labels(
                model=OTHER, workload="default", api="models", outcome=outcome
            ).inc()
            return resp_
        merged = _merged_models(ok)
        st.metrics.requests.labels(
            model=OTHER, workload="default", api="models", outcome="ok"
        ).inc()
        if merged is None:
            return Response(ok[0].content, status_code=200, headers=response_headers(ok[0].headers))
        if len(ok) > 1 and "last_id" in merged and merged["data"]:
            merged["last_id"] = merged["data"][-1].get("id")
        return Response(
            orjson.dumps(merged),
            status_code=200,
            media_type="application/json",
            headers={
                k: v
                for k, v in response_headers(ok[0].headers).items()
                if k.lower() not in ("content-length", "content-encoding", "content-type")
            },
        )
