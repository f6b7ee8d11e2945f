"""Finished requests recorded in batches while others are in flight (``recording``): a request
that finishes alone is recorded at once; under concurrent traffic the records come in batches,
and they are the same records, metric totals and log lines, as one request at a time makes."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from context_ceiling.sidecar.config import Settings
from context_ceiling.sidecar.observability.batching import Batches
from context_ceiling.sidecar.observability.logs import REQUEST_LOGGER
from testkit.traffic.ceiling_docs import doc, entry
from testkit.traffic.rag_bodies import rag_messages
from tests.conftest import Running

#: this module's sidecars run in process (see tests/conftest.py)
IN_PROCESS = True


def test_a_request_that_finishes_alone_is_recorded_at_once() -> None:
    seen: list[str] = []
    b: Batches[str] = Batches(seen.extend, size=32, delay=10)
    b.opened()
    b.closed("a")
    assert seen == ["a"] and b.waiting == 0


def test_while_others_are_in_flight_a_finished_request_waits_for_the_last_one() -> None:
    seen: list[str] = []
    b: Batches[str] = Batches(seen.extend, size=32, delay=10)

    async def traffic() -> None:
        for _ in range(3):
            b.opened()
        b.closed("a")
        b.closed("b")
        assert seen == [] and b.waiting == 2
        b.closed("c")  # the last one in flight: the batch, oldest first, with it
        assert seen == ["a", "b", "c"] and b.waiting == 0

    asyncio.run(traffic())


def test_a_full_batch_is_recorded_without_waiting() -> None:
    seen: list[int] = []
    b: Batches[int] = Batches(seen.extend, size=4, delay=10)

    async def traffic() -> None:
        for _ in range(10):
            b.opened()
        for i in range(5):
            b.closed(i)
        assert seen == [0, 1, 2, 3] and b.waiting == 1

    asyncio.run(traffic())


def test_no_record_waits_longer_than_the_delay() -> None:
    seen: list[str] = []
    b: Batches[str] = Batches(seen.extend, size=32, delay=0.02)

    async def traffic() -> None:
        b.opened()
        b.opened()  # still in flight throughout
        b.closed("a")
        assert seen == []
        await asyncio.sleep(0.2)
        assert seen == ["a"]
        b.closed("b")  # the last one: at once, nothing else waiting
        assert seen == ["a", "b"]

    asyncio.run(traffic())


def test_batch_size_one_records_each_request_as_it_finishes() -> None:
    seen: list[str] = []
    b: Batches[str] = Batches(seen.extend, size=1, delay=10)
    b.opened()
    b.opened()
    b.closed("a")
    assert seen == ["a"]


def test_flush_records_every_waiting_request() -> None:
    seen: list[str] = []
    b: Batches[str] = Batches(seen.extend, size=32, delay=10)

    async def traffic() -> None:
        b.opened()
        b.opened()
        b.closed("a")
        b.flush()  # shutdown: the other one never finished
        assert seen == ["a"] and b.waiting == 0

    asyncio.run(traffic())


def test_the_recording_settings_are_checked() -> None:
    assert Settings().recording.batch_size == 32
    with pytest.raises(ValueError, match="batch_size"):
        Settings(recording={"batch_size": 0})
    with pytest.raises(ValueError, match="max_delay_seconds"):
        Settings(recording={"max_delay_seconds": 0})


#: (documents in the request, the upstream's delay in seconds): some over the ceiling (trimmed)
TRAFFIC = [(n, d) for n in (1, 2, 6, 9) for d in (0.0, 0.03, 0.06)]


def _totals(sc: Running) -> dict[str, float | None]:
    mw = {"model": "gpt-4o", "workload": "default"}
    return {
        "requests": sc.sample("llm_context_requests_total", **mw, api="openai_chat", outcome="ok"),
        "util_count": sc.sample("llm_context_utilization_ratio_count", **mw),
        "util_sum": sc.sample("llm_context_utilization_ratio_sum", **mw),
        "output_sum": sc.sample("llm_context_output_tokens_sum", **mw),
        "trimmed": sc.sample("llm_context_over_ceiling_total", **mw, action="trimmed"),
        "duration_count": sc.sample(
            "llm_context_upstream_duration_seconds_count", model="gpt-4o", api="openai_chat"
        ),
    }


def test_records_made_in_batches_are_the_records_made_one_at_a_time(
    make_sidecar: Callable[..., Running],
    tmp_path: Any,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same concurrent traffic (eight clients at once, answers of different delays, some
    requests trimmed) recorded one request at a time (``batch_size: 1``) and by the default:
    the same metric totals and the same log lines (by what they say of each request), every
    request's line written by the time the traffic ends; and the default did record in
    batches."""
    import yaml

    caplog.set_level("INFO", logger=REQUEST_LOGGER)
    ceilings = tmp_path / "ceilings.yaml"
    ceilings.write_text(yaml.safe_dump(doc(1, entry(tokens=600, window=128000))))
    flushed: list[int] = []
    flush = Batches.flush

    def counted_flush(self: Batches[Any]) -> None:
        flushed.append(self.waiting)
        flush(self)

    monkeypatch.setattr(Batches, "flush", counted_flush)

    def run(recording: dict[str, Any]) -> tuple[dict[str, float | None], Counter[tuple[Any, ...]]]:
        caplog.clear()
        sc = make_sidecar(
            counting={"cache_mib": 0, "strategy": "exact"},
            enforcement={"mode": "enforce"},
            ceilings_file=str(ceilings),
            recording=recording,
        )
        client = sc.openai(api_key="k", max_retries=0)
        ids: list[str] = []
        lock = threading.Lock()

        def one(n: int, delay: float) -> None:
            raw = client.chat.completions.with_raw_response.create(
                model="gpt-4o",
                messages=rag_messages(n),  # type: ignore[arg-type]
                max_tokens=50,
                extra_headers={"x-double-delay": str(delay)},
            )
            with lock:
                ids.append(raw.headers["x-ceiling-request-id"])

        def client_loop(k: int) -> None:
            for i in range(k, len(TRAFFIC) * 2, 8):
                one(*TRAFFIC[i % len(TRAFFIC)])

        threads = [threading.Thread(target=client_loop, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        lines = {
            f["request_id"]: f
            for r in caplog.records
            if r.name == REQUEST_LOGGER and (f := getattr(r, "fields", None))
        }
        assert sorted(lines) == sorted(ids), "every request's line, once the traffic ended"
        said = Counter(
            (
                f["input_tokens_estimated"],
                f["input_tokens_before_trim"],
                f["trimmed_tokens"],
                f["output_tokens"],
                f["utilization"],
                f["outcome"],
            )
            for f in lines.values()
        )
        return _totals(sc), said

    one_by_one, one_by_one_lines = run({"batch_size": 1})
    assert not any(flushed), "batch_size 1: nothing waits"
    assert one_by_one["requests"] == len(TRAFFIC) * 2 and one_by_one["trimmed"]
    batched, batched_lines = run({})
    assert max(flushed) >= 2, "the default recorded some requests together"
    assert batched == pytest.approx(one_by_one)
    assert batched_lines == one_by_one_lines


def test_a_read_of_the_metrics_records_what_waits_for_its_batch(
    make_sidecar: Callable[..., Running],
) -> None:
    """While a slow request is in flight a finished one waits for its batch (here up to
    10 s); a read of the metrics (a scrape; here from the test's thread) records it first."""
    sc = make_sidecar(recording={"max_delay_seconds": 10})
    client = sc.openai(api_key="k", max_retries=0)
    slow_done = threading.Event()

    def slow() -> None:
        client.chat.completions.create(
            model="gpt-4o",
            messages=rag_messages(1),  # type: ignore[arg-type]
            max_tokens=5,
            extra_headers={"x-double-delay": "3"},
        )
        slow_done.set()

    t = threading.Thread(target=slow)
    t.start()
    try:
        deadline = time.monotonic() + 10
        while not sc.double.received and time.monotonic() < deadline:
            time.sleep(0.01)  # until the slow one reached the upstream
        client.chat.completions.create(
            model="gpt-4o",
            messages=rag_messages(1),  # type: ignore[arg-type]
            max_tokens=5,
        )
        assert not slow_done.is_set(), "the slow request is still in flight"
        labels = {"model": "gpt-4o", "workload": "default", "api": "openai_chat"}
        assert sc.sample("llm_context_requests_total", **labels, outcome="ok") == 1
    finally:
        t.join()
    assert sc.sample("llm_context_requests_total", **labels, outcome="ok") == 2
