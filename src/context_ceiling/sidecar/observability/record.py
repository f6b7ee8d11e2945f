"""How an exchange is recorded: response headers, the Prometheus metrics, the staleness tracker,
the OpenTelemetry span and the JSON log line all come from the same :class:`Exchange`, once per
request, through one call (:meth:`Recorder.finish`); under load in batches
(:mod:`~context_ceiling.sidecar.observability.batching`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol

from context_ceiling.ceilings.document import CeilingEntry
from context_ceiling.core.utilization import UNKNOWN_FILL, Component, fill_bucket
from context_ceiling.core.vocabulary import STAGE_COMPONENT
from context_ceiling.formats.base import Expect, Usage
from context_ceiling.sidecar.bounded_count import Calibration, Sampler
from context_ceiling.sidecar.capture.writer import Capturer, Pending
from context_ceiling.sidecar.config import Settings
from context_ceiling.sidecar.enforce import Decision
from context_ceiling.sidecar.exchange import Exchange
from context_ceiling.sidecar.observability.answers import AnswerChecker, AnswerLabels, Job
from context_ceiling.sidecar.observability.batching import Batches
from context_ceiling.sidecar.observability.costs import InputCost, Pricing, input_cost
from context_ceiling.sidecar.observability.logs import bounded, log_request, one_write
from context_ceiling.sidecar.observability.metrics import Metrics
from context_ceiling.sidecar.observability.semconv import RequestModels
from context_ceiling.sidecar.observability.staleness import StalenessTracker
from context_ceiling.sidecar.observability.tracing import Tracing

log = logging.getLogger(__name__)


class Finished(NamedTuple):
    """An exchange waiting to be recorded, with when it finished: ``at`` on the
    :func:`time.perf_counter` clock (its durations), ``wall_ns`` in nanoseconds since the epoch
    (its span's end, its log line's and capture's time)."""

    ex: Exchange
    at: float
    wall_ns: int

    @property
    def wall(self) -> float:
        """``wall_ns`` in seconds."""
        return self.wall_ns / 1e9


class RecordDeps(Protocol):
    """Where an exchange is recorded: the metrics, the span, the staleness tracker, the capture
    and the answer checker; and what the record reads: the settings, prices, the observed bytes
    per token and the bounded request-model label; the sampler, whose credit pays for what only
    a sampled request records."""

    settings: Settings
    metrics: Metrics
    tracing: Tracing
    staleness: StalenessTracker
    capture: Capturer | None
    answers: AnswerChecker | None
    pricing: Pricing
    calibration: Calibration
    sampler: Sampler
    request_models: RequestModels


class Recorder:
    """Turns a finished exchange into its outputs, each in its own method behind one call
    (:meth:`finish`): metrics, staleness, the GenAI metrics and span, the log line; and the
    response headers and the decision's metrics while the request is still running."""

    def __init__(self, state: RecordDeps) -> None:
        self.state = state
        r = state.settings.recording
        self.batches: Batches[Finished] = Batches(self._records, r.batch_size, r.max_delay_seconds)
        # a read of the metrics records what waits first: a scrape never misses a finished request
        state.metrics.before_collect.hook = self.batches.flush_from_any_thread

    @property
    def busy(self) -> bool:
        """Whether other requests are in flight beside the one asking (the CPU credits then
        spend at most their busy burst: :meth:`CpuCredit.ok`)."""
        return self.batches.open > 1

    def opened(self) -> None:
        """An exchange started: while it runs, the ones that finish are recorded in batches."""
        self.batches.opened()

    def flush(self) -> None:
        """Record every finished exchange still waiting for its batch (shutdown)."""
        self.batches.flush()

    def headers(self, ex: Exchange) -> dict[str, str]:
        h = {"x-ceiling-request-id": ex.request_id}
        if ex.count is not None:
            h["x-ceiling-input-tokens"] = str(ex.forwarded_tokens)
        if ex.util is not None:
            h["x-ceiling-utilization"] = f"{ex.util:.4f}"
        if ex.bounded:
            h["x-ceiling-count"] = "bound"  # within budget by a bound: not counted
        d = ex.decision
        entry = (
            ex.ceilings.lookup(ex.label, ex.workload)
            if ex.count is not None or ex.bounded
            else None
        )
        h["x-ceiling-ceiling-tokens"] = str(entry.ceiling_tokens) if entry else "none"
        h["x-ceiling-trimmed-tokens"] = str(d.report.trimmed if d and d.report else 0)
        if d and d.report and d.report.cleared_tool_uses:
            h["x-ceiling-cleared-tool-uses"] = str(d.report.cleared_tool_uses)
        if d and d.report and d.report.clearing_event and d.body is not None:
            h["x-ceiling-clearing-event"] = "1"
        if d and d.native is not None:
            h["x-ceiling-context-management"] = "native"
        if ex.routed_from is not None:
            h["x-ceiling-routed-to"] = ex.model
            h["x-ceiling-routed-from"] = ex.routed_from_label or ""
            h["x-ceiling-routed-by"] = "ceiling" if ex.routed_measured else "window"
        h["x-ceiling-mode"] = (
            d.mode if d else self.state.settings.enforcement.for_workload(ex.workload)[0]
        )
        h.update(ex.extra_headers)
        return h

    def finish(self, ex: Exchange, ended: float | None = None) -> None:
        """Record a finished exchange in every output, once: now, or with the batch it joins
        while other exchanges are in flight; ``ended``: when its answer ended, when that was
        earlier than now (a sample recorded once its count landed). What the response's headers
        read (the utilization of a request a bound let through) is settled here, at once."""
        u = ex.usage
        native = u.native_edits or u.compactions  # it counted what was left after its edits
        if ex.count is None and ex.bounded and u.input_tokens and ex.spec and not native:
            # not counted (a bound proved it within budget): the provider's count is the input
            ex.util = u.input_tokens / ex.spec.window
        checker = self.state.answers
        if checker is not None and ex.answer_raw is not None and self._checked(ex) is not None:
            # held from now: memory stays bounded while answers wait for their batch
            held = checker.hold(ex.answer_raw)
            if held is None:
                ex.answer_raw, ex.answer_unread = None, "busy"
            else:
                ex.answer_held = held
        now = time.perf_counter() if ended is None else ended
        self.batches.closed(Finished(ex, now, time.time_ns()))

    @staticmethod
    def _checked(ex: Exchange) -> Expect | None:
        """What the exchange's answer is checked against, when it goes to the answer checker
        (read, or counted by its stop reason); else None."""
        return ex.answer_expect if ex.outcome == "ok" and ex.status == 200 else None

    def _records(self, batch: Sequence[Finished]) -> None:
        """Record finished exchanges, oldest first, their log lines in one write."""
        with one_write():
            for f in batch:
                self._record(f)

    def _record(self, f: Finished) -> None:
        """Record one finished exchange in every output; a failure is logged, never raised (the
        rest of its batch is still recorded)."""
        try:
            self._outputs(f)
        except Exception:
            log.exception(
                "recording an exchange failed", extra={"fields": {"request_id": f.ex.request_id}}
            )
            checker, held = self.state.answers, f.ex.answer_held
            if checker is not None and held:  # its answer never reached the checker
                checker.held.give(held)
                f.ex.answer_held = 0

    def _outputs(self, f: Finished) -> None:
        ex, now = f.ex, f.at
        est_error = self._metrics(ex, now)
        # the input and the ceiling it is judged against: the price and the answer's labels
        tokens, entry = self._input_tokens(ex), self._entry(ex)
        cost = self._cost(ex, tokens, entry)
        stale = self._staleness(ex)
        self._genai(ex, now, stale, f.wall_ns)
        self._log(ex, now, est_error, cost, f.wall)
        self._capture(ex, f.wall)
        self._answer(ex, tokens, entry)

    @staticmethod
    def _input_tokens(ex: Exchange) -> int | None:
        """The request's input as the provider reported it, else as counted (after trimming)."""
        if ex.usage.input_tokens is not None:
            return ex.usage.input_tokens
        return ex.forwarded_tokens if ex.count is not None else None

    @staticmethod
    def _entry(ex: Exchange) -> CeilingEntry | None:
        d = ex.decision
        if d is not None:
            return d.entry
        return ex.ceilings.lookup(ex.label, ex.workload) if ex.spec is not None else None

    def _answer(self, ex: Exchange, tokens: int | None, entry: CeilingEntry | None) -> None:
        """A relayed answer, to the answer checker (off this path): labelled by the fill of the
        request (``tokens``) and its side of the running ceiling (``entry``)."""
        checker, expect = self.state.answers, self._checked(ex)
        if checker is None or expect is None:
            return
        fill = (
            fill_bucket(tokens / ex.spec.window)
            if tokens is not None and ex.spec is not None
            else UNKNOWN_FILL
        )
        side = (
            "none"
            if entry is None or tokens is None
            else ("above" if tokens > entry.ceiling_tokens else "below")
        )
        u, labels = ex.usage, AnswerLabels(ex.label, ex.workload, fill, side)
        if ex.answer_raw is None:  # counted by its stop reason alone: no job to read
            checker.count_unread(
                labels, u.finish_reason, u.output_tokens, u.reasoning_tokens, ex.answer_unread
            )
            return
        checker.submit(
            Job(
                labels=labels,
                shape=ex.route.format,
                stream=ex.stream,
                expect=expect,
                raw=ex.answer_raw,
                finish=u.finish_reason,
                output_tokens=u.output_tokens,
                reasoning_tokens=u.reasoning_tokens,
                size=ex.answer_held,
            )
        )
        ex.answer_held = 0  # the job holds them now

    def _cost(
        self, ex: Exchange, tokens: int | None, entry: CeilingEntry | None
    ) -> InputCost | None:
        """The price of the request's input (``tokens``), split at its ceiling (``entry``),
        counted; None: not priced (not a generation, not answered, or a model without a
        price)."""
        if ex.route.count_only or ex.outcome != "ok" or tokens is None:
            return None
        u = ex.usage
        price = self.state.pricing.price(
            ex.spec, ex.route.price_provider, ex.model, u.response_model
        )
        if price is None:
            return None
        d = ex.decision
        removed = d.report.trimmed if d is not None and d.report is not None and not d.reject else 0
        cost = input_cost(
            price,
            tokens,
            u.cached_tokens or 0,
            entry.ceiling_tokens if entry is not None else None,
            removed,
            ex.count.total if ex.count is not None else tokens,
        )
        m = self.state.metrics
        for (part, cache), usd in cost.parts.items():
            m.child(m.input_cost, model=ex.label, workload=ex.workload, part=part, cache=cache).inc(
                usd
            )
        if cost.savings and d is not None:
            action = "trimmed" if d.body is not None else "would_trim"
            m.child(m.trim_savings, model=ex.label, workload=ex.workload, action=action).inc(
                cost.savings
            )
        return cost

    def _capture(self, ex: Exchange, wall: float) -> None:
        """A sampled exchange that succeeded, to the capture writer (off this path)."""
        cap = self.state.capture
        if cap is None or ex.capture_body is None or ex.outcome != "ok":
            return
        cap.submit(
            Pending(
                ts=wall,
                workload=ex.workload,
                model=ex.label,
                request_model=ex.model,
                api=ex.route.metric_api,
                shape=ex.route.format,
                body=ex.capture_body,
                response=ex.capture_response or b"",
                stream=ex.stream,
                usage=ex.usage,
            )
        )

    def _metrics(self, ex: Exchange, now: float) -> float | None:
        """The request counters and histograms; returns the estimate error it observed."""
        m = self.state.metrics
        m.child(
            m.requests,
            model=ex.label,
            workload=ex.workload,
            api=ex.route.metric_api,
            outcome=ex.outcome,
        ).inc()
        u = ex.usage
        if u.native_edits or u.compactions:
            m.child(m.native_edits, model=ex.label, workload=ex.workload).inc(
                u.native_edits + u.compactions
            )
        if u.native_cleared_tokens:
            m.child(m.native_cleared_tokens, model=ex.label, workload=ex.workload).inc(
                u.native_cleared_tokens
            )
        est_error: float | None = None
        if u.native_edits or u.compactions:  # it counted what was left after its own edits
            pass
        elif ex.count is not None and u.input_tokens and not ex.count.partial:
            est_error = (ex.forwarded_tokens - u.input_tokens) / u.input_tokens
            m.child(m.estimate_error, model=ex.label).observe(est_error)
        elif ex.count is not None and ex.count.partial and u.input_tokens and ex.spec:
            # the provider holds earlier turns: its reported input is the utilization
            m.child(m.utilization, model=ex.label, workload=ex.workload).observe(
                u.input_tokens / ex.spec.window
            )
        elif ex.count is None and ex.bounded and ex.util is not None and u.input_tokens:
            # not counted (a bound proved it within budget): the provider's count (settled by
            # finish) is the input
            m.child(m.utilization, model=ex.label, workload=ex.workload).observe(ex.util)
            d = ex.decision
            if d is not None and d.entry is not None:
                m.child(m.ceiling_utilization, model=ex.label, workload=ex.workload).observe(
                    u.input_tokens / d.entry.ceiling_tokens
                )
        if (
            u.input_tokens
            and ex.body_bytes
            and not ex.route.count_only
            and (ex.decision is None or ex.decision.body is None)  # what was sent is the body
            and not u.native_edits
            and not u.compactions
        ):
            self.state.calibration.observe(ex.label, ex.body_bytes, u.input_tokens)
        if ex.upstream_started is not None:
            m.child(m.upstream_duration, model=ex.label, api=ex.route.metric_api).observe(
                now - ex.upstream_started
            )
        if u.output_tokens is not None and not ex.route.count_only:
            m.child(m.output_tokens, model=ex.label, workload=ex.workload).observe(u.output_tokens)
        return est_error

    def _staleness(self, ex: Exchange) -> frozenset[str]:
        """Compare the traffic with the ceiling's fingerprint; the reasons it is stale. A
        sample's check is paid from the sampler's credit (only a counted request is checked)."""
        c = ex.count
        if c is None or ex.outcome != "ok" or ex.route.count_only:
            return frozenset()
        cpu = time.thread_time() if ex.sampled else 0.0
        stale = self.state.staleness.observe(
            ex.label, ex.workload, c, ex.usage.response_model, ex.ceilings
        )
        if ex.sampled:
            self.state.sampler.spend(time.thread_time() - cpu)
        return stale

    def _log(
        self,
        ex: Exchange,
        now: float,
        est_error: float | None,
        cost: InputCost | None,
        wall: float,
    ) -> None:
        """The one JSON line per request (no prompt text, bounded fields)."""
        c, u, d = ex.count, ex.usage, ex.decision
        r = d.report if d else None
        log_request(
            {
                "request_id": ex.request_id,
                "api": ex.route.metric_api,
                "upstream": ex.upstream or None,
                "model": bounded(ex.model),
                "model_label": ex.label,
                "workload": ex.workload,
                "stream": ex.stream,
                "input_tokens_estimated": ex.forwarded_tokens if c else None,
                # sampled: forwarded on a bound, counted beside the call as a sample
                "counted": ("sampled" if ex.bounded else "exact")
                if c
                else ("bound" if ex.bounded else None),
                "input_tokens_before_trim": c.total if c else None,
                "input_tokens_exact": c.exact if c else None,
                "input_tokens_partial": c.partial if c else None,
                "tokenizer": c.counter if c else None,
                "input_tokens_reported": u.input_tokens,
                "cached_tokens": u.cached_tokens,
                "estimate_error": round(est_error, 5) if est_error is not None else None,
                "window": ex.spec.window if ex.spec else None,
                "utilization": round(ex.util, 5) if ex.util is not None else None,
                "components": {k.value: v for k, v in c.components.items()} if c else None,
                "output_tokens": u.output_tokens,
                # the provider's compaction steps: billed on top of the answer's own usage
                "compactions": u.compactions or None,
                "compaction_input_tokens": u.compaction_input_tokens or None,
                "compaction_output_tokens": u.compaction_output_tokens or None,
                "finish_reason": u.finish_reason,
                "response_model": bounded(u.response_model),
                "mode": d.mode if d else None,
                "bypass": ex.bypass,
                "routed_from": bounded(ex.routed_from) if ex.routed_from else None,
                "routed_by": ("ceiling" if ex.routed_measured else "window")
                if ex.routed_from
                else None,
                "ceiling_tokens": d.entry.ceiling_tokens if d and d.entry else None,
                "budget": d.budget if d else None,
                "trimmed_tokens": r.trimmed if r else 0,
                "trimmed": {k: v for k, v in r.removed.items() if v} if r else None,
                "trim_actions": r.actions if r else None,
                "cache_loss_tokens": r.cache_loss_tokens if r else None,
                "cleared_tool_uses": r.cleared_tool_uses if r else None,
                "clearing_event": r.clearing_event if r else None,
                "native_context_management": bool(d and d.native is not None),
                "native_edits": u.native_edits or None,
                "native_cleared_tokens": u.native_cleared_tokens,
                "input_cost_usd": round(cost.total, 8) if cost else None,
                "input_cost_above_ceiling_usd": round(cost.above, 8) if cost else None,
                "trim_savings_usd": round(cost.savings, 8) if cost and cost.savings else None,
                "status": ex.status,
                "outcome": ex.outcome,
                "latency_ms": round((now - ex.started) * 1000, 2),
            },
            wall,
        )

    def _genai(self, ex: Exchange, now: float, stale: frozenset[str], end_ns: int) -> None:
        """GenAI semantic conventions: the client metrics under the names chosen
        (``semconv.GenAiNames``), and the span's closing attributes."""
        if ex.route.count_only:
            return
        m, u = self.state.metrics, ex.usage
        base = {
            "gen_ai_operation_name": ex.operation,
            "gen_ai_provider_name": ex.provider or ex.route.api,
            "gen_ai_request_model": self.state.request_models.name(ex.model, ex.label, ex.spec),
            "server_address": ex.server_address,
            "server_port": str(ex.server_port) if ex.server_port else "",
            "model": ex.label,
        }
        self._timings(ex, now, base)
        if m.genai_tokens is not None:
            # the conventions: "when systems report both used tokens and billable tokens,
            # instrumentation MUST report billable tokens" (a compaction step included)
            if u.billed_input is not None:
                m.child(m.genai_tokens, **base, gen_ai_token_type="input").observe(u.billed_input)
            if u.billed_output is not None:
                m.child(m.genai_tokens, **base, gen_ai_token_type="output").observe(u.billed_output)
        if m.inference_usage:
            self._inference_usage(u, base)
        if ex.span is not None:
            self._span(ex, stale, end_ns)

    def _timings(self, ex: Exchange, now: float, base: dict[str, str]) -> None:
        """The operation's duration; a stream's time to its first chunk and between chunks."""
        m, u = self.state.metrics, ex.usage
        started, first = ex.upstream_started, ex.first_chunk_at
        if started is not None:
            for family in (m.genai_duration, m.inference_duration):
                if family is not None:
                    m.child(family, **base).observe(now - started)
        if started is not None and first is not None and ex.outcome == "ok":
            for family in (m.genai_ttft, m.inference_ttfc):
                if family is not None:
                    m.child(family, **base).observe(first - started)
            if m.genai_tpot is not None and u.output_tokens and u.output_tokens > 1:
                m.child(m.genai_tpot, **base).observe((now - first) / (u.output_tokens - 1))
            if m.inference_tpoc is not None and ex.chunks > 1:
                # the stream ends with its last chunk: its end times the last one
                m.child(m.inference_tpoc, **base).observe((now - first) / (ex.chunks - 1))

    def _span(self, ex: Exchange, stale: frozenset[str], end_ns: int) -> None:
        """The span's closing attributes (under the names chosen), and its end."""
        assert ex.span is not None
        m, u, d = self.state.metrics, ex.usage, ex.decision
        started, first = ex.upstream_started, ex.first_chunk_at
        streamed = started is not None and first is not None and ex.outcome == "ok"
        attrs: dict[str, Any] = {
            "gen_ai.request.max_tokens": ex.max_tokens,
            "gen_ai.response.model": u.response_model,
            "gen_ai.response.finish_reasons": [u.finish_reason] if u.finish_reason else None,
            "gen_ai.usage.input_tokens": u.billed_input,
            "gen_ai.usage.output_tokens": u.billed_output,
            "gen_ai.usage.cache_read.input_tokens": u.cached_tokens,
            "server.address": ex.server_address or None,
            "server.port": ex.server_port or None,
            "http.response.status_code": ex.status or None,
            "ceiling.workload": ex.workload,
            "ceiling.window": ex.spec.window if ex.spec else None,
            "ceiling.ceiling_tokens": d.entry.ceiling_tokens if d and d.entry else None,
            "ceiling.input_tokens": ex.forwarded_tokens if ex.count else None,
            "ceiling.utilization": ex.util,
            "ceiling.trimmed_tokens": d.report.trimmed if d and d.report else 0,
            "ceiling.mode": d.mode if d else None,
            "ceiling.stale": sorted(stale),
        }
        names = m.genai_names
        if names.legacy:
            attrs["gen_ai.usage.cache_creation.input_tokens"] = u.cache_write_tokens
        if names.latest:
            attrs["gen_ai.usage.cache_write.input_tokens"] = u.cache_write_tokens
            attrs["gen_ai.usage.reasoning.output_tokens"] = u.reasoning_tokens
            attrs["gen_ai.request.stream"] = ex.stream
            if streamed and started is not None and first is not None:
                attrs["gen_ai.response.time_to_first_chunk"] = first - started
        if ex.count is not None:
            for comp, tokens in ex.count.components.items():
                attrs[f"ceiling.input_tokens.{comp.value}"] = tokens
        self.state.tracing.finish(
            ex.span, attrs, None if ex.outcome == "ok" else ex.outcome, end_ns
        )

    def _inference_usage(self, u: Usage, base: dict[str, str]) -> None:
        """The current conventions' usage: a counter per kind by modality (no upstream here
        breaks its usage down by modality the sidecar reads, so ``unknown``, as the conventions
        say for that case) and the per-operation histograms (no modality: percentiles across
        modalities do not add up)."""
        m = self.state.metrics
        kinds = {
            "input_tokens": u.billed_input,
            "output_tokens": u.billed_output,
            "cache_read_input_tokens": u.cached_tokens,
            "cache_write_input_tokens": u.cache_write_tokens,
            "reasoning_output_tokens": u.reasoning_tokens,
        }
        for kind, tokens in kinds.items():
            if tokens is not None:
                family = m.inference_usage[kind]
                m.child(family, **base, gen_ai_token_modality="unknown").inc(tokens)
        for kind in ("input_tokens", "output_tokens"):
            tokens = kinds[kind]
            if tokens is not None:
                m.child(m.inference_operation[kind], **base).observe(tokens)

    def record_routed(self, ex: Exchange, to_label: str) -> None:
        """A request over its ceiling sent to a fallback (before the exchange takes the
        fallback's model): counted under the model asked for and by where it went."""
        m, wl = self.state.metrics, ex.workload
        m.child(m.over_ceiling, model=ex.label, workload=wl, action="routed").inc()
        m.child(m.routed, from_model=ex.label, to_model=to_label, workload=wl).inc()

    def record_decision(self, ex: Exchange, d: Decision) -> None:
        m, model, wl = self.state.metrics, ex.label, ex.workload
        if d.entry is not None and ex.count is not None:
            m.child(m.ceiling_utilization, model=model, workload=wl).observe(
                ex.count.total / d.entry.ceiling_tokens
            )
        r = d.report
        if r is None:
            return
        action = "rejected" if d.reject else ("trimmed" if d.body is not None else "observed")
        m.child(m.over_ceiling, model=model, workload=wl, action=action).inc()
        if action == "rejected":
            return
        family = m.trimmed_tokens if action == "trimmed" else m.would_trim_tokens
        for kind, tokens in r.removed.items():
            if tokens:
                m.child(family, model=model, workload=wl, kind=kind).inc(tokens)
        if action == "trimmed" and r.cache_loss_tokens:
            m.child(m.cache_loss_tokens, model=model, workload=wl).inc(r.cache_loss_tokens)
        if action == "trimmed" and r.clearing_event:
            m.child(m.clearing_events, model=model, workload=wl).inc()

    @staticmethod
    def forwarded_components(ex: Exchange) -> dict[Component, int]:
        assert ex.count is not None
        comps = dict(ex.count.components)
        d = ex.decision
        if d is not None and d.body is not None and d.report is not None:
            for kind, comp in STAGE_COMPONENT.items():
                comps[comp] = max(0, comps[comp] - d.report.removed.get(kind, 0))
        return comps
