"""counting.overlap_bytes, with ``counting.strategy: exact`` (every request counted): a long request that the strict bound proves within its budget is
forwarded at once and counted exactly on a worker thread while the upstream call runs; the count
is settled before the answer goes back, so the client, the log line and the metrics see what
they see when it is counted first. The upstream is the hosted-provider test double; the client
the official SDK."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import openai
import pytest
import yaml

from context_ceiling.core.tokenizers import TiktokenCounter
from context_ceiling.sidecar.observability.logs import REQUEST_LOGGER
from testkit.traffic.ceiling_docs import doc, entry
from testkit.traffic.rag_bodies import CHUNK
from testkit.traffic.rag_bodies import rag_messages as _rag
from tests.conftest import Running

#: this module's sidecars run in process (see tests/conftest.py), but for tests marked e2e
IN_PROCESS = True


LONG = 200  # ~85 kB of body: over the default overlap_bytes (64 kB)


def _call(sc: Running, n: int, stream: bool = False, **headers: str) -> Any:
    client = sc.openai(api_key="k", max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model="gpt-4o",
        messages=_rag(n),  # type: ignore[arg-type]
        max_tokens=50,
        stream=stream,
        extra_headers=headers or None,
    )
    if stream:
        for _ in raw.parse():  # read the stream to its end
            pass
        # the SDK stops at [DONE]; the sidecar records the exchange once the upstream's stream
        # has ended, a moment later
        deadline = time.monotonic() + 5
        ok = {"model": "gpt-4o", "workload": "default", "api": "openai_chat", "outcome": "ok"}
        while not sc.sample("llm_context_requests_total", **ok) and time.monotonic() < deadline:
            time.sleep(0.01)
    return raw


class CountSpy:
    """Which threads counted the long texts, and whether the upstream had the request by then."""

    def __init__(self, sc: Running) -> None:
        self.sc = sc
        self.threads: set[str] = set()
        self.forwarded_first: list[bool] = []
        self.before = len(sc.double.received)  # requests the upstream had before the call

    def wrap(self, original: Callable[[TiktokenCounter, str], int]) -> Any:
        def count(counter: TiktokenCounter, text: str) -> int:
            if len(text) > 200:  # a retrieved chunk, not a role or a separator
                self.threads.add(threading.current_thread().name)
            if len(text) > 200 and not self.forwarded_first:
                # counted beside the upstream call: the upstream gets the request meanwhile
                # (counted first, it never would: this waits, then says so)
                deadline = time.monotonic() + 3
                while len(self.sc.double.received) == self.before and time.monotonic() < deadline:
                    time.sleep(0.005)
                self.forwarded_first.append(len(self.sc.double.received) > self.before)
            return original(counter, text)

        return count


@pytest.fixture
def spy(make_sidecar: Callable[..., Running], monkeypatch: pytest.MonkeyPatch) -> Any:
    made: list[CountSpy] = []

    def make(**cfg: Any) -> tuple[Running, CountSpy]:
        sc = make_sidecar(**cfg)
        s = CountSpy(sc)
        monkeypatch.setattr(TiktokenCounter, "count", s.wrap(TiktokenCounter.count))
        made.append(s)
        return sc, s

    return make


def _log_fields(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    """The request log lines, once there is one (the metrics are recorded a moment before the
    line is written, on the server's thread)."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not any(r.name == REQUEST_LOGGER for r in caplog.records):
        time.sleep(0.01)
    out = []
    for r in caplog.records:
        if r.name == REQUEST_LOGGER:
            f = dict(r.fields)  # type: ignore[attr-defined]
            for k in ("request_id", "latency_ms"):
                f.pop(k)
            out.append(f)
    return out


@pytest.mark.parametrize(
    ("stream", "mode"), [(False, "observe"), (True, "observe"), (False, "enforce")]
)
def test_a_long_request_is_counted_beside_the_upstream_call(
    spy: Any, stream: bool, mode: str, caplog: pytest.LogCaptureFixture, tmp_path: Any
) -> None:
    ceilings = tmp_path / "ceilings.yaml"  # enforce: the body's bytes are within this ceiling
    ceilings.write_text(yaml.safe_dump(doc(1, entry(tokens=100000, window=128000))))
    sc, s = spy(
        counting={"strategy": "exact", "cache_mib": 0},
        enforcement={"mode": mode},
        ceilings_file=str(ceilings),
    )
    with caplog.at_level(logging.INFO, logger=REQUEST_LOGGER):
        raw = _call(sc, LONG, stream)
        # read inside the block: the line is written a moment after the metrics _call waits
        # on, and outside it the request logger is back at its own level (INFO would be lost)
        lines = _log_fields(caplog)
    assert all(t.startswith("ceiling-count") for t in s.threads), s.threads
    assert s.forwarded_first == [True]
    # the answer still carries the exact count, and so does everything recorded
    counted = int(raw.headers["x-ceiling-input-tokens"])
    assert counted > 15000 and "x-ceiling-count" not in raw.headers
    [line] = lines
    assert line["counted"] == "exact" and line["input_tokens_estimated"] == counted
    assert line["components"]["retrieved"] > 0
    assert sc.sample(
        "llm_context_input_tokens_sum", model="gpt-4o", workload="default", component="retrieved"
    ) == pytest.approx(line["components"]["retrieved"])
    assert sc.sample(
        "llm_context_utilization_ratio_sum", model="gpt-4o", workload="default"
    ) == pytest.approx(counted / 128000)
    assert raw.headers["x-ceiling-mode"] == mode


@pytest.mark.parametrize(
    ("stream", "mode", "ceiling"),
    [
        # enforce, the strict bound (the body's bytes) within the ceiling: nothing to trim
        (False, "enforce", 100000),
        (True, "enforce", 100000),
        # observe, over its ceiling: forwarded as it is either way, and what trimming would
        # have removed is reported either way
        (False, "observe", 2000),
        (True, "observe", 2000),
    ],
)
def test_counted_beside_or_first_the_outputs_are_the_same(
    make_sidecar: Callable[..., Running],
    stream: bool,
    mode: str,
    ceiling: int,
    caplog: pytest.LogCaptureFixture,
    tmp_path: Any,
) -> None:
    ceilings = tmp_path / "ceilings.yaml"
    ceilings.write_text(yaml.safe_dump(doc(1, entry(tokens=ceiling, window=128000))))
    seen: dict[int, tuple[Any, ...]] = {}
    for overlap in (65536, 0):
        sc = make_sidecar(
            counting={"strategy": "exact", "cache_mib": 0, "overlap_bytes": overlap},
            enforcement={"mode": mode},
            ceilings_file=str(ceilings),
        )
        caplog.clear()
        with caplog.at_level(logging.INFO, logger=REQUEST_LOGGER):
            raw = _call(sc, LONG, stream)
            lines = _log_fields(caplog)  # inside the block: see above
        heads = {k: v for k, v in raw.headers.items() if k.startswith("x-ceiling-")}
        heads.pop("x-ceiling-request-id")
        samples = {
            name: sc.sample(name, model="gpt-4o", workload="default", **labels)
            for name, labels in (
                ("llm_context_input_tokens_sum", {"component": "retrieved"}),
                ("llm_context_input_tokens_sum", {"component": "system"}),
                ("llm_context_utilization_ratio_sum", {}),
                ("llm_context_ceiling_utilization_ratio_sum", {}),
                ("llm_context_over_ceiling_total", {"action": "observed"}),
                ("llm_context_would_trim_tokens_total", {"kind": "retrieved"}),
            )
        }
        seen[overlap] = (heads, lines, samples, sc.double.received[-1].body)
    assert seen[65536] == seen[0]
    if mode == "observe":  # the case is what it says: over its ceiling, reported, not trimmed
        heads, lines, samples, _ = seen[0]
        assert samples["llm_context_over_ceiling_total"] == 1
        assert samples["llm_context_would_trim_tokens_total"]
        assert lines[0]["trimmed"]


def test_over_its_budget_it_is_counted_first_and_trimmed(
    spy: Any, make_sidecar: Callable[..., Running], tmp_path: Any
) -> None:
    """The bound cannot prove it within budget: counted before forwarding (trimming needs the
    count), and, being long, on a counting thread, so the event loop serves other requests
    meanwhile; trimmed there too."""
    ceilings = tmp_path / "ceilings.yaml"
    ceilings.write_text(yaml.safe_dump(doc(1, entry(tokens=2000, window=128000))))
    sc, s = spy(
        counting={"strategy": "exact", "cache_mib": 0},
        enforcement={"mode": "enforce"},
        ceilings_file=str(ceilings),
    )
    raw = _call(sc, LONG)
    assert int(raw.headers["x-ceiling-trimmed-tokens"]) > 0
    assert s.threads and all(t.startswith("ceiling-count") for t in s.threads), s.threads
    assert s.forwarded_first and not any(s.forwarded_first)
    # what went upstream is the trimmed body, the same as counting on the event loop gives
    trimmed = sc.double.received[-1].body
    sc2 = make_sidecar(
        counting={"strategy": "exact", "cache_mib": 0, "overlap_bytes": 0},
        enforcement={"mode": "enforce"},
        ceilings_file=str(ceilings),
    )
    raw2 = _call(sc2, LONG)
    assert sc2.double.received[-1].body == trimmed
    assert raw2.headers["x-ceiling-trimmed-tokens"] == raw.headers["x-ceiling-trimmed-tokens"]
    assert raw2.headers["x-ceiling-input-tokens"] == raw.headers["x-ceiling-input-tokens"]


def test_a_long_malformed_request_counted_off_the_loop_is_refused_as_on_it(
    make_sidecar: Callable[..., Running], tmp_path: Any
) -> None:
    """Counted on a counting thread before forwarding (enforce, over its budget), a body the
    counter cannot read is refused with the same 400 in the client's error format as on the
    event loop, and nothing reaches the upstream."""

    ceilings = tmp_path / "ceilings.yaml"
    ceilings.write_text(yaml.safe_dump(doc(1, entry(tokens=2000, window=128000))))
    body = {"model": "gpt-4o", "messages": [*_rag(LONG), {"content": "no role"}]}
    answers = []
    for overlap in (65536, 0):
        sc = make_sidecar(
            counting={"strategy": "exact", "cache_mib": 0, "overlap_bytes": overlap},
            enforcement={"mode": "enforce"},
            ceilings_file=str(ceilings),
        )
        r = sc.http.post("/v1/chat/completions", json=body)
        assert r.status_code == 400, r.text
        assert "role" in r.json()["error"]["message"]
        assert not sc.double.received
        answers.append(r.json())
    assert answers[0] == answers[1]


def test_a_short_request_is_counted_first(spy: Any) -> None:
    sc, s = spy(counting={"strategy": "exact", "cache_mib": 0, "overlap_bytes": 200_000})
    raw = _call(sc, LONG)
    assert int(raw.headers["x-ceiling-input-tokens"]) > 8000
    assert s.threads and not any(t.startswith("ceiling-count") for t in s.threads)


def test_an_upstream_failure_still_records_the_count(spy: Any) -> None:
    sc, s = spy(counting={"strategy": "exact", "cache_mib": 0})
    with pytest.raises(openai.InternalServerError) as err:
        _call(sc, LONG, False, **{"x-double-status": "500"})
    assert s.forwarded_first == [True]
    assert int(err.value.response.headers["x-ceiling-input-tokens"]) > 8000
    assert (
        sc.sample(
            "llm_context_input_tokens_count",
            model="gpt-4o",
            workload="default",
            component="retrieved",
        )
        == 1
    )


def test_the_count_cache_is_shared_by_the_counting_threads() -> None:
    """Several threads counting the same long texts at once: every count right, the table's
    books balanced."""
    from concurrent.futures import ThreadPoolExecutor

    from context_ceiling.core.tokenizers import CountCache

    cache = CountCache(max_bytes=200_000, min_chars=16)
    counter = cache.wrap(TiktokenCounter("o200k_base"))
    plain = TiktokenCounter("o200k_base")
    texts = [CHUNK.format(i=i) * (1 + i % 5) for i in range(200)]
    want = [plain.count(t) for t in texts]
    with ThreadPoolExecutor(8) as pool:
        for _ in range(5):
            assert list(pool.map(counter.count, texts)) == want
    import sys

    assert cache.bytes == sum(sys.getsizeof(t) for (_, t) in cache._lru)  # type: ignore[has-type, misc]
    assert cache.bytes <= cache.max_bytes
    assert cache.hits + cache.misses == 5 * len(texts)
