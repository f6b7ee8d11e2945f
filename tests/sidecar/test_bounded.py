"""counting.strategy: bounded: a request that a bound proves within its budget is forwarded
without being counted, its utilization taken from the provider's count; anything that could be
over its budget is counted and trimmed exactly as with exact counting. The upstream is the
hosted-provider test double; the client the official SDK."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from context_ceiling.core.models import ModelSpec
from context_ceiling.sidecar.bounded_count import strict
from context_ceiling.sidecar.observability.logs import REQUEST_LOGGER
from testkit.traffic.ceiling_docs import doc, entry
from testkit.traffic.rag_bodies import rag_messages as _rag
from tests.conftest import Running, request_log_line

#: this module's sidecars run in process (see tests/conftest.py), but for tests marked e2e
IN_PROCESS = True


def _call(sc: Running, n: int) -> Any:
    client = sc.openai(api_key="k", max_retries=0)
    return client.chat.completions.with_raw_response.create(
        model="gpt-4o",
        messages=_rag(n),  # type: ignore[arg-type]
        max_tokens=50,
    )


def _line(caplog: pytest.LogCaptureFixture, request_id: str) -> dict[str, Any]:
    """The request's log line, once it is written (a sampled request's comes when its count
    lands, after its answer)."""
    return request_log_line(caplog, request_id)


def _retrieved(sc: Running) -> float | None:
    """How many requests' retrieved component the histogram has seen (the counted ones)."""
    return sc.sample(
        "llm_context_input_tokens_count", model="gpt-4o", workload="default", component="retrieved"
    )


def _counted(sc: Running, caplog: pytest.LogCaptureFixture, n: int) -> str:
    """One request of ``n`` documents; how its log line says it was counted."""
    raw = _call(sc, n)
    return str(_line(caplog, raw.headers["x-ceiling-request-id"])["counted"])


def test_within_budget_is_not_counted_and_measured_from_usage(
    make_sidecar: Callable[..., Running],
) -> None:
    sc = make_sidecar(
        counting={"strategy": "bounded", "sample_every": 1000, "cache_mib": 0},
        enforcement={"mode": "observe"},
    )
    sc.double.prompt_tokens = 640
    raw = _call(sc, 4)
    assert raw.headers["x-ceiling-count"] == "bound"
    assert "x-ceiling-input-tokens" not in raw.headers
    # the utilization comes from the provider's count: 640 / 128000
    assert sc.sample("llm_context_utilization_ratio_count", model="gpt-4o", workload="default") == 1
    assert sc.sample(
        "llm_context_utilization_ratio_sum", model="gpt-4o", workload="default"
    ) == pytest.approx(640 / 128000)
    # what was forwarded is the client's body, byte for byte
    assert sc.double.received[-1].body == raw.http_response.request.content


def test_the_strict_bound_is_above_the_exact_count() -> None:
    """The property the enforce path relies on, on request bodies of every size and script."""
    import json

    from context_ceiling.core.tokenizers import TiktokenCounter
    from context_ceiling.formats.openai_chat import count as count_openai

    spec = ModelSpec(match="gpt-4o", window=128000)
    counter = TiktokenCounter("o200k_base")
    texts = [
        "plain English text " * 50,
        "数字化转型的关键在于数据治理与模型评估。" * 40,
        "Ελληνικά κείμενα με τόνους και σημεία στίξης. " * 30,
        "".join(chr(c) for c in range(0x1F600, 0x1F650)) * 10,
        "0123456789" * 200,
        "a",
    ]
    for t in texts:
        for shape_msgs in (
            [{"role": "user", "content": t}],
            [*_rag(3), {"role": "user", "content": t}],
        ):
            body = {"model": "gpt-4o", "messages": shape_msgs}
            raw = json.dumps(body, ensure_ascii=False).encode()
            exact = count_openai(body, counter, spec.chat_format, None).total
            upper = strict(raw, "openai", spec)
            assert upper is not None and upper >= exact, (t[:20], upper, exact)
    # images are priced apart from their bytes: no bound
    img = json.dumps(
        {
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}],
                }
            ]
        }
    ).encode()
    assert strict(img, "openai", spec) is None
    for priced_apart in (
        b'{"messages":[{"role":"user","content":[{"type": "image","source":{}}]}]}',
        b'{"input":[{"role":"user","content":[{"type":"input_file","file_id":"f-1"}]}]}',
        b'{"contents":[{"parts":[{"fileData":{"fileUri":"gs://b/v.mp4"}}]}]}',
    ):
        assert strict(priced_apart, "anthropic", spec) is None, priced_apart
    assert strict(b'{"messages":[{"role":"user","content":"an image of a cat"}]}', "openai", spec)


def test_over_the_bound_is_counted_and_trimmed_exactly(
    make_sidecar: Callable[..., Running], tmp_path: Any
) -> None:
    """Enforce: the strict bound decides; a request that could be over is counted and trimmed
    exactly as with exact counting."""
    import yaml

    ceilings = tmp_path / "ceilings.yaml"
    ceilings.write_text(yaml.safe_dump(doc(1, entry(tokens=600, window=128000))))
    trimmed: dict[str, bytes] = {}
    for strategy in ("exact", "bounded"):
        sc = make_sidecar(
            counting={"strategy": strategy, "sample_every": 1000, "cache_mib": 0},
            enforcement={"mode": "enforce"},
            ceilings_file=str(ceilings),
        )
        small = _call(sc, 1)
        big = _call(sc, 12)
        assert big.headers["x-ceiling-mode"] == "enforce"
        assert int(big.headers["x-ceiling-trimmed-tokens"]) > 0
        assert "x-ceiling-count" not in big.headers  # counted
        trimmed[strategy] = sc.double.received[-1].body
        if strategy == "bounded":
            assert small.headers.get("x-ceiling-count") == "bound"
    assert trimmed["exact"] == trimmed["bounded"]


def test_sampled_requests_are_counted_and_observe_calibrates(
    make_sidecar: Callable[..., Running], tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    import yaml

    ceilings = tmp_path / "ceilings.yaml"
    # a ceiling below the bodies' bytes but far above their tokens
    ceilings.write_text(yaml.safe_dump(doc(1, entry(tokens=3000, window=128000))))
    sc = make_sidecar(
        counting={"strategy": "bounded", "sample_every": 4, "cache_mib": 0, "calibration": 3},
        enforcement={"mode": "observe"},
        ceilings_file=str(ceilings),
    )
    sc.double.prompt_tokens = 1500  # what the provider reports for these bodies
    with caplog.at_level(logging.INFO, logger=REQUEST_LOGGER):
        counted = [_counted(sc, caplog, 25) for _ in range(8)]
    # the first requests are counted (the bytes exceed the ceiling, nothing is calibrated yet);
    # once three reports calibrated bytes per token, only every 4th of those the bound lets
    # through is, as a sample (counted first: a short body)
    assert counted[:3] == ["exact"] * 3
    assert counted[3:] == ["bound", "bound", "bound", "exact", "bound"]
    assert _retrieved(sc) == 4


def test_the_sampler_counts_every_nth_within_its_cpu_share() -> None:
    """Every ``every``-th request a bound let through is due, but only while the sampled counts
    have used at most ``share`` of a core: a count's CPU is paid back before the next one."""
    from context_ceiling.sidecar.bounded_count import Sampler

    now = [0.0]
    s = Sampler(every=4, share=0.05, clock=lambda: now[0])  # saves up 10 s: 0.5 s of CPU
    assert [s.due() for _ in range(8)] == [False, False, False, True] * 2
    s.spend(0.02)
    s.spend(0.02)  # credit: 0.5 - 0.04 = 0.46 >= 0 -> still due at the next 4th
    assert [s.due() for _ in range(4)] == [False, False, False, True]
    s.spend(0.55)  # credit -0.09: 1.8 s of refill at 0.05/s
    assert [s.due() for _ in range(6)] == [False] * 6  # due, but in debt: stays due
    now[0] = 1.0
    assert not s.due()  # -0.04
    now[0] = 2.0
    assert s.due()  # +0.01, paid back: the first request after it is counted, whichever it is
    assert [s.due() for _ in range(4)] == [False, False, False, True]
    # an idle hour saves up at most ten seconds' worth
    now[0] = 3600.0
    s.due()
    s.spend(0.56)
    assert [s.due() for _ in range(4)] == [False] * 4
    # while other requests are in flight, at most a second's worth of the saving goes at once
    now[0] = 7200.0
    assert s.due(busy=True)  # the request left due in debt
    s.spend(0.04)  # the busy credit (0.05, a second's share) 0.01
    assert [s.due(busy=True) for _ in range(4)] == [False, False, False, True]
    s.spend(0.02)  # -0.01
    assert not any(s.due(busy=True) for _ in range(8))
    assert s.due()  # one at a time, the rest of the saving is there (0.44)


def test_the_sampler_holds_samples_in_flight_to_its_cap() -> None:
    """A sample's count is paid for when it lands; until then it is in flight, and at most
    ``max_inflight`` are: a request due beyond that stays due (no backlog of counts, each
    holding a body, while the credit has not noticed them)."""
    import asyncio

    from context_ceiling.sidecar.bounded_count import Sampler

    loop = asyncio.new_event_loop()
    try:
        s = Sampler(every=1, share=1.0, max_inflight=2)
        a, b = loop.create_future(), loop.create_future()
        assert s.due()
        s.counting(a)
        assert s.due()
        s.counting(b)
        assert [s.due() for _ in range(3)] == [False] * 3 and s.inflight == 2
        a.set_result(None)
        b.cancel()  # a dropped count is out of flight too
        loop.run_until_complete(asyncio.sleep(0))  # done callbacks run on the loop
        assert s.inflight == 0 and s.due()
        assert Sampler(every=1, share=1.0, max_inflight=None).due()  # no threads: no cap
    finally:
        loop.close()


def _sampling(make_sidecar: Callable[..., Running], share: float, overlap: int) -> Running:
    """A sidecar that samples every request a bound lets through, within ``share`` of a core;
    a body of ``overlap`` bytes or more is counted beside the call (1: every body)."""
    sc = make_sidecar(
        counting={
            "strategy": "bounded",
            "sample_every": 1,
            "sample_cpu": share,
            "cache_mib": 0,
            "overlap_bytes": overlap,
        },
        enforcement={"mode": "observe"},
    )
    sc.double.prompt_tokens = 640
    return sc


@pytest.mark.parametrize(("share", "counted"), [(1.0, 6), (1e-6, 1)])
def test_sampled_counts_stay_within_their_cpu_share(
    make_sidecar: Callable[..., Running],
    caplog: pytest.LogCaptureFixture,
    share: float,
    counted: int,
) -> None:
    """sample_every 1: every request a bound lets through is due. With a whole core to spend all
    six are counted; with a millionth of one, the first count puts the sampler in debt for far
    longer than the test, and the rest go through on the bound. Short bodies are counted first
    (``exact``); long ones (``overlap_bytes`` 1: every body) beside the call, recorded after
    the answer (``sampled``; each request's line is awaited before the next: a sample's CPU is
    spent when its count lands)."""
    for overlap, kind in ((65536, "exact"), (1, "sampled")):
        sc = _sampling(make_sidecar, share, overlap)
        with caplog.at_level(logging.INFO, logger=REQUEST_LOGGER):
            kinds = [_counted(sc, caplog, 4) for _ in range(6)]
        assert kinds.count(kind) == counted, kinds
        assert kinds[0] == kind
        assert kinds.count("bound") == 6 - counted


def test_beside_other_requests_a_sample_spends_only_the_busy_burst(
    make_sidecar: Callable[..., Running],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``counting.sample_cpu_burst_seconds``: of the ten seconds' share a pod saves up, a
    request that arrives while others are in flight may spend a second's. With half the saving
    spent, a request alone is still sampled, one beside others goes through on the bound until
    the busy credit is paid back."""
    from context_ceiling.sidecar.observability.record import Recorder

    sc = _sampling(make_sidecar, 0.02, 65536)
    credit = sc.state.sampler.credit
    credit.spend(0.1)  # 0.1 of 0.2 left; the busy credit (0.02) owes 0.02
    with caplog.at_level(logging.INFO, logger=REQUEST_LOGGER):
        assert _counted(sc, caplog, 4) == "exact"
        credit.spend(0.02)  # the busy credit owes 0.02 again: a second to pay back
        monkeypatch.setattr(Recorder, "busy", property(lambda self: True))
        assert [_counted(sc, caplog, 4) for _ in range(3)] == ["bound"] * 3


def test_a_sample_pays_for_all_that_only_a_counted_request_does(
    make_sidecar: Callable[..., Running],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The sampler's credit pays for a sample's whole extra cost, not its count alone: the
    verdict on the count, the decision's and the input's metrics, the staleness check. Here the
    input's metrics and the staleness check each burn 20 ms of CPU: both are charged, for a
    short body counted first and for a long one counted beside the call."""
    from context_ceiling.sidecar.bounded_count import Sampler
    from context_ceiling.sidecar.observability.metrics import Metrics
    from context_ceiling.sidecar.observability.staleness import StalenessTracker

    burn = 0.02

    def slow(real: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            end = time.thread_time() + burn
            while time.thread_time() < end:
                pass
            return real(*args, **kwargs)

        return run

    spent: list[float] = []
    real_spend = Sampler.spend

    def spend(self: Sampler, seconds: float) -> None:
        spent.append(seconds)
        real_spend(self, seconds)

    monkeypatch.setattr(Metrics, "observe_input", slow(Metrics.observe_input))
    monkeypatch.setattr(StalenessTracker, "observe", slow(StalenessTracker.observe))
    monkeypatch.setattr(Sampler, "spend", spend)
    for overlap, kind in ((65536, "exact"), (1, "sampled")):
        sc = _sampling(make_sidecar, 1.0, overlap)
        spent.clear()
        with caplog.at_level(logging.INFO, logger=REQUEST_LOGGER):
            assert _counted(sc, caplog, 4) == kind
        assert sum(spent) >= 2 * burn, (kind, spent)


@pytest.mark.parametrize("stream", [False, True])
def test_a_sample_costs_its_request_no_latency(
    make_sidecar: Callable[..., Running],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    stream: bool,
) -> None:
    """A sampled long request's answer goes back while its count is still running (here: held
    until the client has the whole answer), with the bound's headers; the count lands
    afterwards, in the log line, the components histogram and the estimate error."""
    from context_ceiling.core.tokenizers import TiktokenCounter

    sc = make_sidecar(
        counting={
            "strategy": "bounded",
            "sample_every": 1,
            "sample_cpu": 1.0,
            "cache_mib": 0,
            "overlap_bytes": 1,  # every body is long: the sample is counted beside the call
        },
        enforcement={"mode": "observe"},
    )
    sc.double.prompt_tokens = 640
    release, counting = threading.Event(), threading.Event()
    real = TiktokenCounter.count

    def held(self: TiktokenCounter, text: str) -> int:
        if threading.current_thread().name.startswith("ceiling-count"):
            counting.set()
            assert release.wait(10)
        return real(self, text)

    monkeypatch.setattr(TiktokenCounter, "count", held)
    client = sc.openai(api_key="k", max_retries=0)
    with caplog.at_level(logging.INFO, logger=REQUEST_LOGGER):
        if stream:
            with client.chat.completions.with_streaming_response.create(
                model="gpt-4o",
                messages=_rag(4),  # type: ignore[arg-type]
                max_tokens=50,
                stream=True,
            ) as resp:
                headers = resp.headers
                text = "".join(resp.iter_lines())
            assert "[DONE]" in text
        else:
            raw = client.chat.completions.with_raw_response.create(
                model="gpt-4o",
                messages=_rag(4),  # type: ignore[arg-type]
                max_tokens=50,
            )
            headers = raw.headers
            assert raw.parse().choices
        # the whole answer is here, and the count has not finished (it is held)
        assert counting.is_set() and not release.is_set()
        assert headers["x-ceiling-count"] == "bound"
        assert "x-ceiling-input-tokens" not in headers
        rid = headers["x-ceiling-request-id"]
        assert not any(getattr(r, "fields", {}).get("request_id") == rid for r in caplog.records)
        time.sleep(1.0)
        release.set()
        line = _line(caplog, rid)
    assert line["counted"] == "sampled" and line["stream"] is stream
    assert line["input_tokens_estimated"] > 0 and line["input_tokens_reported"] == 640
    assert line["estimate_error"] is not None
    assert line["latency_ms"] < 900  # the answer's, not the answer's plus the held second
    assert _retrieved(sc) == 1  # recorded before the line was written
    # the utilization is observed once, from the count (not again from the reported usage)
    assert sc.sample("llm_context_utilization_ratio_count", model="gpt-4o", workload="default") == 1


@pytest.mark.parametrize(
    ("strategy", "body", "needle"),
    [
        ("bounded", b'{"model": "gpt-4o"}', "'messages' is required"),
        ("bounded", b'{"model": "gpt-4o", "messages": [{"content": "x"}]}', "role is required"),
        (
            "bounded",
            b'{"model": "gpt-4o", "messages": [{"role": "user", "content": 5}]}',
            "messages[0].content",
        ),
        # a long body in observe is forwarded beside its count: its shape is checked first
        (
            "exact",
            b'{"model": "gpt-4o", "messages": [{"role": "user", "content": "'
            + b"word " * 20_000
            + b'"}, {"content": "x"}]}',
            "messages[1].role is required",
        ),
    ],
)
def test_a_body_forwarded_without_its_count_is_still_checked(
    make_sidecar: Callable[..., Running], strategy: str, body: bytes, needle: str
) -> None:
    """A request a bound lets through uncounted, or a long one counted beside its upstream
    call, is refused with the same 400 naming the field as a counted one, and never
    forwarded."""
    sc = make_sidecar(
        counting={"strategy": strategy, "sample_every": 1000, "cache_mib": 0},
        enforcement={"mode": "observe"},
    )
    r = sc.http.post(
        "/v1/chat/completions", content=body, headers={"content-type": "application/json"}
    )
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert needle in err["message"] and err["type"] == "invalid_request_error"
    assert sc.double.received == []


#: the traffic of the comparison: documents per request, some over the 600-token ceiling
TRAFFIC = (1, 3, 12, 2, 8, 20, 1, 5)
COMPONENTS = ("system", "tool_definitions", "history", "retrieved", "tool_results", "latest_user")


def _totals(sc: Running) -> dict[str, float | None]:
    """The metric totals a scrape shows for the comparison's traffic."""
    mw = {"model": "gpt-4o", "workload": "default"}
    out: dict[str, float | None] = {
        "utilization_count": sc.sample("llm_context_utilization_ratio_count", **mw),
        "utilization_sum": sc.sample("llm_context_utilization_ratio_sum", **mw),
        "over_ceiling_trimmed": sc.sample("llm_context_over_ceiling_total", **mw, action="trimmed"),
    }
    for c in COMPONENTS:
        out[f"input_{c}"] = sc.sample("llm_context_input_tokens_sum", **mw, component=c)
    return out


def test_the_default_trims_and_measures_as_exact_counting_does(
    make_sidecar: Callable[..., Running], tmp_path: Any
) -> None:
    """The same traffic through ``counting.strategy: exact`` (every request counted before it
    is forwarded) and through the default (``bounded``, every request the bound lets through
    sampled while 2% of a core allows): the same requests trimmed, by the same tokens, and the
    same metric totals. Then with the counting share spent (a millionth of a core, as under
    load): still the same trims, and the same utilization totals where the provider reports the
    tokens the sidecar counts; only the components are then left to the requests counted."""
    import yaml

    ceilings = tmp_path / "ceilings.yaml"
    ceilings.write_text(yaml.safe_dump(doc(1, entry(tokens=600, window=128000))))

    def run(
        counting: dict[str, Any], reported: list[int] | None = None
    ) -> tuple[list[int], list[int], dict[str, float | None], list[str]]:
        sc = make_sidecar(
            counting={"cache_mib": 0, **counting},
            enforcement={"mode": "enforce"},
            ceilings_file=str(ceilings),
        )
        trims, tokens, kinds = [], [], []
        for k, n in enumerate(TRAFFIC):
            if reported is not None:
                sc.double.prompt_tokens = reported[k]
            raw = _call(sc, n)
            trims.append(int(raw.headers["x-ceiling-trimmed-tokens"]))
            tokens.append(int(raw.headers.get("x-ceiling-input-tokens", -1)))
            kinds.append(raw.headers.get("x-ceiling-count", "exact"))
        return trims, tokens, _totals(sc), kinds

    exact_trims, exact_tokens, exact_totals, _ = run({"strategy": "exact"})
    assert any(exact_trims) and not all(exact_trims), "some requests trimmed, some not"
    default_trims, default_tokens, default_totals, kinds = run({})
    assert default_trims == exact_trims
    assert default_tokens == exact_tokens  # every response carries its exact count
    assert set(kinds) == {"exact"}
    assert default_totals == pytest.approx(exact_totals)
    # under load: the share is spent at once, the bound's requests measured by the provider
    starved_trims, _, starved, kinds = run({"sample_cpu": 1e-6}, reported=exact_tokens)
    assert starved_trims == exact_trims
    assert "bound" in kinds and kinds.count("exact") >= sum(1 for t in exact_trims if t)
    for key in ("utilization_count", "utilization_sum", "over_ceiling_trimmed"):
        assert starved[key] == pytest.approx(exact_totals[key]), key
