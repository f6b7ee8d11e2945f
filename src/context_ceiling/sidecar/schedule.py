"""When a request is counted, decided once (:func:`plan`), and the counts that run on the
counting threads; what a count turns into: the ceiling's verdict and the observed utilization.

The schedules (:class:`Schedule`): counted first on the event loop (a short body: a thread's
GIL hand-offs cost more than its count); counted first on a counting thread (a long body whose
forwarding depends on its count); counted beside the upstream call (a long body whose forwarding
cannot depend on its count); not counted (``counting.strategy: bounded``: a bound proves it
within its budget), or counted anyway as a sample, first when short, beside the call and
recorded after its answer when long. The input budget is computed once, when the schedule is
chosen; the verdict on a count starts from it.

A long request whose forwarding cannot depend on its count (``observe`` and ``off`` never trim;
in ``enforce`` the strict bound must prove it within its budget) is forwarded at once. Its count,
and the decision on it, run on a worker thread while the upstream works (tiktoken and riptoken
release the GIL while they encode; gigatoken holds it, so its count overlaps the upstream's
wait, not other requests' work), and are settled before the answer goes back: the response
headers, the log line and the metrics carry what they carry when the request is counted first.

A long request a bound let through and the sampler picked (``counting.strategy: bounded``) is
counted beside its upstream call too, but its answer never waits for that count: it is a sample
for the metrics, not something the request needs, so it is recorded once it lands
(:func:`after`), off the request's latency. (A short sample is counted first, on the event loop,
like any short request.)
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from typing import Any

from context_ceiling.core.counting import RequestCount
from context_ceiling.core.models import UpstreamSpec
from context_ceiling.core.shape_checks import RequestShapeError
from context_ceiling.core.tokenizers import TextCounter
from context_ceiling.core.utilization import utilization
from context_ceiling.formats.base import Route
from context_ceiling.sidecar.bounded_count import provably_within
from context_ceiling.sidecar.enforce import Decision, planned_decision, trim_to
from context_ceiling.sidecar.exchange import Exchange, Schedule
from context_ceiling.sidecar.observability.record import Recorder
from context_ceiling.sidecar.state import SidecarState

log = logging.getLogger(__name__)


def verdict(
    st: SidecarState,
    route: Route,
    ex: Exchange,
    obj: dict[str, Any],
    count: RequestCount,
    counter: TextCounter,
) -> Decision:
    """The ceiling's verdict on a counted request (forward, trim or reject), from the budget
    :func:`plan` computed (a new decision: the planned one is never changed)."""
    assert ex.decision is not None
    return trim_to(
        ex.decision,
        obj,
        route.format,
        count,
        ex.spec,
        counter,
        st.chunk_pattern,
    )


def plan(st: SidecarState, route: Route, ex: Exchange, obj: dict[str, Any], raw: bytes) -> Schedule:
    """When this request is counted, decided once from its size, its budget and the counting
    strategy; sets the decision it is forwarded under until a count says otherwise (its mode
    and budget: "as it is")."""
    if route.count_only:
        return Schedule.FIRST
    d = ex.decision = budget(st, route, ex, obj)
    threads = on_threads(st, route, ex, raw)
    bounded = st.settings.counting.strategy == "bounded"
    if bounded and provably_within(raw, route.shape, ex.spec, d, st.calibration, ex.label):
        if not st.sampler.due():
            return Schedule.UNCOUNTED
        # a sampled long body is counted beside the call and recorded after its answer: its
        # count costs the request no latency. A short one is counted first, on the event loop:
        # below counting.overlap_bytes a thread's GIL hand-offs cost more than the count
        # (measured: c=16 throughput 0.79-0.90x of counting it on the loop at 1k and 8k
        # tokens, and no better p50 at c=1)
        return Schedule.SAMPLE_BESIDE if threads else Schedule.SAMPLE_FIRST
    if not threads:
        return Schedule.FIRST
    # a long body: beside the upstream call when its forwarding cannot depend on the count
    # (observe and off never trim; enforce only when the strict bound proves it within)
    if d.mode != "enforce" or provably_within(raw, route.shape, ex.spec, d, None, ex.label):
        return Schedule.BESIDE
    return Schedule.ON_THREAD


def without_trimming(ex: Exchange) -> None:
    """A bypassing request is forwarded as it is, whatever its mode."""
    if ex.decision is not None:
        ex.decision = dataclasses.replace(ex.decision, mode="off", budget=None)


def observe_counted(st: SidecarState, rec: Recorder, ex: Exchange) -> None:
    """A counted request's utilization and input components, as forwarded (a partial count is
    observed from the reported usage at the end instead)."""
    assert ex.count is not None
    if ex.spec is not None:
        ex.util = utilization(ex.forwarded_tokens, ex.spec.window)
    if not ex.count.partial:
        st.metrics.observe_input(ex.label, ex.workload, ex.util, rec.forwarded_components(ex))


def on_threads(st: SidecarState, route: Route, ex: Exchange, raw: bytes) -> bool:
    """Whether the request is counted on the counting threads: a long body counted by a local
    tokenizer. Below ``counting.overlap_bytes`` a count costs less than the GIL hand-offs."""
    least = st.settings.counting.overlap_bytes
    if not least or len(raw) < least or route.count_only or st.count_pool is None:
        return False
    return ex.spec is None or not isinstance(ex.spec.tokenizer, UpstreamSpec)


def budget(st: SidecarState, route: Route, ex: Exchange, obj: dict[str, Any]) -> Decision:
    """The exchange's mode and input budget before it is counted (:func:`planned_decision` for its
    model, workload, ceilings and upstream)."""
    return planned_decision(
        obj,
        route.format,
        ex.spec,
        ex.label,
        ex.workload,
        ex.ceilings,
        st.settings.enforcement,
        native_ok=st.native_ok(route.format, ex.spec),
    )


def _work(
    st: SidecarState, route: Route, ex: Exchange, obj: dict[str, Any], counter: TextCounter
) -> asyncio.Future[tuple[RequestCount, Decision, float]]:
    """The count and the verdict on it, on a counting thread, with the thread's CPU seconds.
    The thread gets its own top-level dict: forwarding may add ``stream_options`` to this one
    meanwhile; nothing else is changed (the trimmer never mutates its input)."""
    spec, body = ex.spec, dict(obj)

    def work() -> tuple[RequestCount, Decision, float]:
        cpu = time.thread_time()
        fmt = spec.chat_format if spec else None
        count = route.count(body, counter, fmt, st.chunk_pattern, memo=st.count_cache)
        return count, verdict(st, route, ex, body, count, counter), time.thread_time() - cpu

    return asyncio.get_running_loop().run_in_executor(st.count_pool, work)


def start(
    st: SidecarState, route: Route, ex: Exchange, obj: dict[str, Any], counter: TextCounter
) -> None:
    """Start the count and the verdict on it beside the upstream call (:func:`settle` takes
    them, or :func:`after` for a sample a bound let through)."""
    ex.pending = _work(st, route, ex, obj, counter)
    if ex.schedule is Schedule.SAMPLE_BESIDE:
        st.sampler.counting(ex.pending)


async def count_on_thread(
    st: SidecarState, route: Route, ex: Exchange, obj: dict[str, Any], counter: TextCounter
) -> Decision:
    """Count a long request that must be counted before it is forwarded (``enforce`` and not
    proved within budget) on a counting thread, and take the verdict there too (trimming
    recounts what it rewrote): the event loop serves other requests meanwhile, so under load
    the count runs on another core (tiktoken and riptoken release the GIL; gigatoken holds it). Sets the count; returns the
    verdict."""
    ex.count, d, cpu = await _work(st, route, ex, obj, counter)
    if ex.sampled:
        st.sampler.spend(cpu)
    return d


async def settle(st: SidecarState, rec: Recorder, ex: Exchange) -> None:
    """The count that ran beside the upstream call, recorded as a count taken first is. Its
    decision cannot have trimmed (the request was forwarded as it is: ``enforce`` was proved
    within budget); in ``observe`` it reports what trimming would have removed."""
    pending, ex.pending = ex.pending, None
    if pending is None:
        return
    try:
        result = await pending
    except RequestShapeError:
        return  # forwarded already: the upstream judges the body; recorded uncounted
    _take(st, rec, ex, result)


def _take(
    st: SidecarState, rec: Recorder, ex: Exchange, result: tuple[RequestCount, Decision, float]
) -> None:
    ex.count, d, cpu = result
    if ex.sampled:
        st.sampler.spend(cpu)
    d.body, d.reject = None, False
    ex.decision = d
    rec.record_decision(ex, d)
    observe_counted(st, rec, ex)


def after(st: SidecarState, rec: Recorder, ex: Exchange) -> None:
    """Record a sampled exchange (a bound let it through) once its count lands: at once when the
    count is done, else from the count's completion. Its answer has gone back already, without
    its count in the headers (``x-ceiling-count: bound``); the log line (``"counted":
    "sampled"``), the metrics, the staleness check and the span carry the count."""
    pending, ex.pending = ex.pending, None
    if pending is None:
        rec.finish(ex)
        return
    ended = time.perf_counter()  # the durations and latency are the answer's, not the count's

    def land(fut: asyncio.Future[tuple[RequestCount, Decision, float]]) -> None:
        try:
            if not fut.cancelled():
                with contextlib.suppress(RequestShapeError):  # recorded uncounted
                    _take(st, rec, ex, fut.result())
            rec.finish(ex, ended)
        except Exception:  # a callback's exception would only reach asyncio's handler
            log.exception(
                "recording a sampled exchange failed",
                extra={"fields": {"request_id": ex.request_id}},
            )

    if pending.done():
        land(pending)
    else:
        pending.add_done_callback(land)


def drop(ex: Exchange) -> None:
    """A count beside an upstream call that will not be recorded (the request ended before it
    was forwarded): not waited for."""
    if ex.pending is not None:
        ex.pending.cancel()
        ex.pending = None
