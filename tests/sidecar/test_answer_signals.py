"""Answer signals by fill, end to end: the official SDKs (openai, anthropic, google-genai) ->
the sidecar -> a loopback double of each provider (:mod:`testkit.doubles.answer_provider`) that
answers with a scripted answer, as a body and as a stream, for every API. Each signal is read
back from the sidecar's registry with the labels it must carry."""

from __future__ import annotations

import json
import random
import string
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import anthropic
import httpx
import openai
import pytest
from google import genai
from google.genai import types

from context_ceiling.core.prices import lookup
from context_ceiling.core.utilization import FILL_BUCKETS
from context_ceiling.formats import format_of
from context_ceiling.formats.base import Answer, Expect
from context_ceiling.sidecar.app import create_app
from context_ceiling.sidecar.config import Settings
from context_ceiling.sidecar.cpu_credit import CpuCredit
from context_ceiling.sidecar.observability.answer_signals import (
    SIGNALS,
    expectations,
    problems,
    read_answer,
    repetition,
    stop_of,
)
from context_ceiling.sidecar.observability.answers import (
    SIDES,
    YIELD_AFTER,
    AnswerChecker,
    AnswerLabels,
    HeldBytes,
    Job,
)
from context_ceiling.sidecar.state import SidecarState
from testkit.doubles.answer_provider import AnswerProviderDouble, Script
from testkit.serving import serve, upstreams_at
from testkit.traffic.ceiling_docs import doc, entry

TOKEN = "admin-tok"
WINDOW = 10_000
CEILING = 800
SCHEMA = {
    "type": "object",
    "properties": {"a": {"type": "integer"}},
    "required": ["a"],
    "additionalProperties": False,
}
TOOL_PARAMS = {
    "type": "object",
    "properties": {"x": {"type": "string"}},
    "required": ["x"],
}
APIS = ("openai_chat", "openai_responses", "anthropic_messages", "gemini_generate")
LABEL = {
    "openai_chat": "gpt-4o",
    "openai_responses": "gpt-4o",
    "anthropic_messages": "claude",
    "gemini_generate": "gemini",
}


@dataclass
class Sidecar:
    url: str
    state: SidecarState
    double: AnswerProviderDouble

    def count(self, name: str, **labels: str) -> float:
        return self.state.metrics.registry.get_sample_value(name, labels) or 0.0

    def settle(self) -> None:
        """Until every exchange so far is recorded and its answer counted. A request whose
        count a bound let through is recorded once its sampled count lands, which can be after
        the client has its answer (under load, well after): wait for those counts first."""
        assert self.state.answers is not None
        deadline = time.monotonic() + 10
        while self.state.sampler.inflight and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(0.005)  # the record runs just after the count's landing, on the loop
        self.state.answers.join()

    def settled(self, metric: str, before: float, **labels: str) -> None:
        """:meth:`settle`, until ``metric`` with ``labels`` has moved past ``before``."""
        deadline = time.monotonic() + 10
        self.settle()
        while self.count(metric, **labels) <= before and time.monotonic() < deadline:
            time.sleep(0.01)
            self.settle()


def _settings(durl: str, **over: Any) -> Settings:
    cfg: dict[str, Any] = {
        "upstreams": upstreams_at(durl),
        "models": [
            {"match": "gpt-4o", "window": WINDOW, "max_output_tokens": 1000},
            {"match": "claude-*", "label": "claude", "window": WINDOW, "max_output_tokens": 1000},
            {"match": "gemini-*", "label": "gemini", "window": WINDOW, "max_output_tokens": 1000},
        ],
        "workloads": ["default", "rag"],
        "admin_token": TOKEN,
        "enforcement": {"mode": "observe", "default_output_reservation": 100},
    }
    cfg.update(over)
    return Settings(**cfg)


@pytest.fixture(scope="module")
def sidecar() -> Iterator[Sidecar]:
    d = AnswerProviderDouble()
    with serve(d.app()) as durl:
        app = create_app(_settings(durl))
        with serve(app) as url:
            ceilings = doc(
                1,
                entry(model="gpt-4o", window=WINDOW, tokens=CEILING),
                entry(model="claude", window=WINDOW, tokens=CEILING),
                entry(model="gemini", window=WINDOW, tokens=CEILING),
            )
            r = httpx.put(
                url + "/admin/ceilings",
                json=ceilings,
                headers={"authorization": f"Bearer {TOKEN}"},
            )
            assert r.status_code == 200, r.text
            yield Sidecar(url, app.state.sidecar, d)


@dataclass
class Ask:
    """What the request asks for: JSON with the schema, and the tool ``get_weather``."""

    json: bool = False
    tools: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


def call(sc: Sidecar, api: str, stream: bool, ask: Ask) -> None:
    """One request through the sidecar with the API's official SDK, read to its end."""
    question = "What is the answer? Answer in JSON." if ask.json else "What is the answer?"
    if api == "openai_chat":
        c = openai.OpenAI(base_url=sc.url + "/v1", api_key="k", max_retries=0)
        kw: dict[str, Any] = {}
        if ask.json:
            kw["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "answer", "schema": SCHEMA},
            }
        if ask.tools:
            kw["tools"] = [
                {
                    "type": "function",
                    "function": {"name": "get_weather", "parameters": TOOL_PARAMS},
                }
            ]
        msgs: Any = [{"role": "user", "content": question}]
        if stream:
            for _ in c.chat.completions.create(model="gpt-4o", messages=msgs, stream=True, **kw):
                pass
        else:
            c.chat.completions.create(model="gpt-4o", messages=msgs, **kw)
    elif api == "openai_responses":
        c = openai.OpenAI(base_url=sc.url + "/v1", api_key="k", max_retries=0)
        kw = {}
        if ask.json:
            kw["text"] = {"format": {"type": "json_schema", "name": "answer", "schema": SCHEMA}}
        if ask.tools:
            kw["tools"] = [{"type": "function", "name": "get_weather", "parameters": TOOL_PARAMS}]
        if stream:
            for _ in c.responses.create(model="gpt-4o", input=question, stream=True, **kw):
                pass
        else:
            c.responses.create(model="gpt-4o", input=question, **kw)
    elif api == "anthropic_messages":
        a = anthropic.Anthropic(base_url=sc.url, api_key="k", max_retries=0)
        kw = {}
        if ask.json:
            kw["extra_body"] = {
                "output_config": {"format": {"type": "json_schema", "schema": SCHEMA}}
            }
        if ask.tools:
            kw["tools"] = [{"name": "get_weather", "input_schema": TOOL_PARAMS}]
        amsgs: Any = [{"role": "user", "content": question}]
        if stream:
            with a.messages.stream(
                model="claude-sonnet-4-5", max_tokens=100, messages=amsgs, **kw
            ) as s:
                for _ in s:
                    pass
        else:
            a.messages.create(model="claude-sonnet-4-5", max_tokens=100, messages=amsgs, **kw)
    else:
        g = genai.Client(api_key="k", http_options=types.HttpOptions(base_url=sc.url))
        config = types.GenerateContentConfig(
            response_mime_type="application/json" if ask.json else None,
            response_json_schema=SCHEMA if ask.json else None,
            tools=[
                types.Tool(
                    function_declarations=[
                        types.FunctionDeclaration(
                            name="get_weather", parameters_json_schema=TOOL_PARAMS
                        )
                    ]
                )
            ]
            if ask.tools
            else None,
        )
        if stream:
            for _ in g.models.generate_content_stream(
                model="gemini-2.5-flash", contents=question, config=config
            ):
                pass
        else:
            g.models.generate_content(model="gemini-2.5-flash", contents=question, config=config)


REPEATING = "Let me check the records. " + "I will check the records again. " * 30


def _refusal(api: str) -> tuple[str, Script, Ask, set[str]]:
    """Each API's way of declining: OpenAI's refusal field, Anthropic's refusal stop, Gemini's
    safety stop."""
    if api.startswith("openai"):
        return "refusal", Script(text="", refusal="I can't help with that."), Ask(), {"refusal"}
    if api == "anthropic_messages":
        return "refusal", Script(text="", stop="refusal"), Ask(), {"refusal"}
    return "filtered", Script(text="", stop="content_filter"), Ask(), {"content_filter"}


#: (name, the answer, what the request asks for, the signals it must give)
SCENARIOS: list[tuple[str, Script, Ask, set[str]]] = [
    ("normal", Script(), Ask(), {"stop"}),
    ("truncated", Script(stop="truncated"), Ask(), {"truncated"}),
    ("empty", Script(text=""), Ask(), {"stop", "empty"}),
    ("invalid_json", Script(text='Sure! {"a": '), Ask(json=True), {"stop", "invalid_json"}),
    ("schema_mismatch", Script(text='{"a": "x"}'), Ask(json=True), {"stop", "schema_mismatch"}),
    ("valid_json", Script(text='{"a": 1}'), Ask(json=True), {"stop"}),
    (
        "unknown_tool",
        Script(text="", stop="tool_calls", tool_calls=[("launch_rockets", "{}")]),
        Ask(tools=True),
        {"tool_calls", "unknown_tool"},
    ),
    (
        "invalid_tool_arguments",
        Script(text="", stop="tool_calls", tool_calls=[("get_weather", '{"x": ')]),
        Ask(tools=True),
        {"tool_calls", "invalid_tool_arguments"},
    ),
    (
        "tool_schema_mismatch",
        Script(text="", stop="tool_calls", tool_calls=[("get_weather", '{"x": 1}')]),
        Ask(tools=True),
        {"tool_calls", "tool_schema_mismatch"},
    ),
    (
        "good_tool_call",
        Script(text="", stop="tool_calls", tool_calls=[("get_weather", '{"x": "Paris"}')]),
        Ask(tools=True),
        {"tool_calls"},
    ),
    ("repetition", Script(text=REPEATING, stop="truncated"), Ask(), {"truncated", "repetition"}),
]


def _signals(sc: Sidecar, api: str, fill: str, side: str) -> dict[str, float]:
    labels = {"model": LABEL[api], "workload": "default", "fill": fill, "side": side}
    return {s: sc.count("llm_context_answer_signals_total", **labels, signal=s) for s in SIGNALS}


@pytest.mark.e2e
@pytest.mark.parametrize("stream", [False, True], ids=["body", "stream"])
@pytest.mark.parametrize("api", APIS)
def test_every_signal_is_read_from_every_api(sidecar: Sidecar, api: str, stream: bool) -> None:
    sc = sidecar
    sc.double.prompt_tokens = 1000  # 0.1 of the window, above the ceiling of 800
    for name, script, ask, want in [*SCENARIOS, _refusal(api)]:
        if name == "invalid_tool_arguments" and (
            api == "gemini_generate" or (api == "anthropic_messages" and not stream)
        ):
            continue  # these APIs hand tool arguments over parsed: never text that fails to parse
        sc.double.script = script
        before = _signals(sc, api, "0.1-0.2", "above")
        answers = sc.count(
            "llm_context_answers_total",
            model=LABEL[api],
            workload="default",
            fill="0.1-0.2",
            side="above",
        )
        call(sc, api, stream, ask)
        sc.settled(
            "llm_context_answers_total",
            answers,
            model=LABEL[api],
            workload="default",
            fill="0.1-0.2",
            side="above",
        )
        after = _signals(sc, api, "0.1-0.2", "above")
        got = {s for s in SIGNALS if after[s] > before[s]}
        assert got == want, (name, got)
        assert all(after[s] - before[s] == 1 for s in got), name
        assert (
            sc.count(
                "llm_context_answers_total",
                model=LABEL[api],
                workload="default",
                fill="0.1-0.2",
                side="above",
            )
            == answers + 1
        ), name
    # every byte the streams kept and the queue held was given back
    assert sc.state.answers is not None and sc.state.answers.held.held == 0


@pytest.mark.e2e
@pytest.mark.parametrize("stream", [False, True], ids=["body", "stream"])
def test_azure_openai_answers_are_read_too(stream: bool) -> None:
    d = AnswerProviderDouble()
    with serve(d.app()) as durl:
        app = create_app(
            Settings(
                upstreams={
                    "named": {"azure-eu": {"api": "openai", "base_url": durl, "azure": True}}
                },
                models=[{"match": "prod-gpt4o", "label": "gpt-4o-azure", "window": WINDOW}],
            )
        )
        with serve(app) as url:
            sc = Sidecar(url, app.state.sidecar, d)
            az = openai.AzureOpenAI(
                azure_endpoint=url, api_key="azure-key", api_version="2024-10-21", max_retries=0
            )
            labels = {
                "model": "gpt-4o-azure",
                "workload": "default",
                "fill": "0.1-0.2",
                "side": "none",
            }
            for name, script, ask, want in SCENARIOS:
                d.script = script
                before = {
                    s: sc.count("llm_context_answer_signals_total", **labels, signal=s)
                    for s in SIGNALS
                }
                kw: dict[str, Any] = {}
                if ask.json:
                    kw["response_format"] = {"type": "json_object"}
                if ask.tools:
                    kw["tools"] = [
                        {
                            "type": "function",
                            "function": {"name": "get_weather", "parameters": TOOL_PARAMS},
                        }
                    ]
                msgs: Any = [{"role": "user", "content": "What is the answer?"}]
                if stream:
                    for _ in az.chat.completions.create(
                        model="prod-gpt4o", messages=msgs, stream=True, **kw
                    ):
                        pass
                else:
                    az.chat.completions.create(model="prod-gpt4o", messages=msgs, **kw)
                sc.settle()
                got = {
                    s
                    for s in SIGNALS
                    if sc.count("llm_context_answer_signals_total", **labels, signal=s) > before[s]
                }
                # JSON mode without a schema: valid JSON of any shape is fine
                expected = want - {"schema_mismatch"} if name == "schema_mismatch" else want
                assert got == expected, (name, got)


@pytest.mark.e2e
def test_fill_bucket_and_side_follow_the_reported_input(sidecar: Sidecar) -> None:
    sc = sidecar
    sc.double.script = Script(reasoning_tokens=5)
    cases = [(500, "0.0-0.1", "below"), (2500, "0.2-0.3", "above"), (9500, "0.9-1.0", "above")]
    for tokens, fill, side in cases:
        sc.double.prompt_tokens = tokens
        labels = {"model": "gpt-4o", "workload": "rag", "fill": fill, "side": side}
        before = sc.count("llm_context_answers_total", **labels)
        out = sc.count("llm_context_answer_tokens_total", **labels, kind="output")
        reasoning = sc.count("llm_context_answer_tokens_total", **labels, kind="reasoning")
        c = openai.OpenAI(
            base_url=sc.url + "/v1",
            api_key="k",
            max_retries=0,
            default_headers={"x-ceiling-workload": "rag"},
        )
        c.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
        sc.settle()
        assert sc.count("llm_context_answers_total", **labels) == before + 1, (tokens, fill)
        assert sc.count("llm_context_answer_tokens_total", **labels, kind="output") == out + 20
        assert (
            sc.count("llm_context_answer_tokens_total", **labels, kind="reasoning") == reasoning + 5
        )
    # a model without a registry entry: no window, no ceiling
    sc.double.prompt_tokens = 1000
    labels = {"model": "other", "workload": "default", "fill": "unknown", "side": "none"}
    before = sc.count("llm_context_answers_total", **labels)
    openai.OpenAI(base_url=sc.url + "/v1", api_key="k", max_retries=0).chat.completions.create(
        model="some-private-model", messages=[{"role": "user", "content": "hi"}]
    )
    sc.settle()
    assert sc.count("llm_context_answers_total", **labels) == before + 1


@pytest.mark.e2e
def test_label_sets_stay_bounded_under_random_models_tools_and_schemas(sidecar: Sidecar) -> None:
    sc = sidecar
    rng = random.Random(7)

    def word(n: int = 8) -> str:
        return "".join(rng.choice(string.ascii_letters) for _ in range(n))

    for i in range(60):
        sc.double.prompt_tokens = rng.randint(1, 12_000)
        schema = {
            "type": "object",
            "properties": {word(): {"type": rng.choice(["string", "integer"])}},
        }
        tool = word()
        sc.double.script = Script(
            text=rng.choice(['{"a": 1}', "plain", "", word(300)]),
            stop=rng.choice(["stop", "truncated", "tool_calls", "content_filter"]),
            tool_calls=[(rng.choice([tool, word()]), rng.choice(["{}", '{"x": ', '{"k": 2}']))],
        )
        body: dict[str, Any] = {
            "model": rng.choice(["gpt-4o", word(), f"claude-{word()}", f"gpt-4o-{word()}"]),
            "messages": [{"role": "user", "content": word(20)}],
            "tools": [{"type": "function", "function": {"name": tool, "parameters": schema}}],
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": word(), "schema": schema},
            },
            "stream": i % 2 == 0,
        }
        r = httpx.post(
            sc.url + "/v1/chat/completions",
            json=body,
            headers={"authorization": "Bearer k", "x-ceiling-workload": word()},
        )
        assert r.status_code == 200, r.text
    sc.settle()
    allowed = {
        "model": {"gpt-4o", "claude", "gemini", "other"},
        "workload": {"default", "rag"},
        "fill": {*FILL_BUCKETS, "unknown"},
        "side": set(SIDES),
        "signal": set(SIGNALS),
        "kind": {"output", "reasoning"},
        "part": {"within", "above", "no_ceiling"},
        "cache": {"cached", "uncached"},
        "action": {"trimmed", "would_trim"},
        "reason": {"too_large", "busy", "cpu", "queue_full", "error"},
    }
    families = {
        "llm_context_answers",
        "llm_context_answer_signals",
        "llm_context_answer_tokens",
        "llm_context_answer_checks_skipped",
        "llm_context_input_cost_usd",
        "llm_context_trim_savings_usd",
    }
    seen = 0
    for metric in sc.state.metrics.registry.collect():
        if metric.name not in families:
            continue
        for s in metric.samples:
            for k, v in s.labels.items():
                assert v in allowed[k], (metric.name, k, v)
            seen += 1
    assert seen > 0


@pytest.mark.e2e
def test_an_answer_past_the_size_cap_counts_its_stop_only() -> None:
    d = AnswerProviderDouble(script=Script(text="x" * 5000, stop="truncated"))
    with serve(d.app()) as durl:
        app = create_app(_settings(durl, answers={"max_bytes": 1024}))
        with serve(app) as url:
            sc = Sidecar(url, app.state.sidecar, d)
            c = openai.OpenAI(base_url=url + "/v1", api_key="k", max_retries=0)
            msgs: Any = [{"role": "user", "content": "hi"}]
            c.chat.completions.create(model="gpt-4o", messages=msgs)
            for _ in c.chat.completions.create(model="gpt-4o", messages=msgs, stream=True):
                pass
            sc.settle()
            labels = {"model": "gpt-4o", "workload": "default", "fill": "0.1-0.2", "side": "none"}
            assert sc.count("llm_context_answer_checks_skipped_total", reason="too_large") == 2
            assert sc.count("llm_context_answers_total", **labels) == 2
            sig = "llm_context_answer_signals_total"
            assert sc.count(sig, **labels, signal="truncated") == 2
            # not read: the repetition in it is not judged
            assert sc.count(sig, **labels, signal="repetition") == 0


@pytest.mark.e2e
def test_held_answer_bytes_are_bounded_and_given_back() -> None:
    """Past answers.max_held_mib an answer is counted by its stop alone (``busy``); every byte
    a stream kept or an answer queued is given back."""
    d = AnswerProviderDouble(script=Script(text="The fee is 103 EUR. " * 200, stop="truncated"))
    with serve(d.app()) as durl:
        app = create_app(_settings(durl, answers={"max_held_mib": 0.002}))  # about 2 kB
        with serve(app) as url:
            sc = Sidecar(url, app.state.sidecar, d)
            c = openai.OpenAI(base_url=url + "/v1", api_key="k", max_retries=0)
            msgs: Any = [{"role": "user", "content": "hi"}]
            for _ in c.chat.completions.create(model="gpt-4o", messages=msgs, stream=True):
                pass
            c.chat.completions.create(model="gpt-4o", messages=msgs)  # a 4 kB body
            d.script = Script(text="Short.")
            c.chat.completions.create(model="gpt-4o", messages=msgs)
            sc.settle()
            assert sc.count("llm_context_answer_checks_skipped_total", reason="busy") == 2
            labels = {"model": "gpt-4o", "workload": "default", "fill": "0.1-0.2", "side": "none"}
            sig = "llm_context_answer_signals_total"
            assert sc.count(sig, **labels, signal="truncated") == 2
            assert sc.count(sig, **labels, signal="stop") == 1  # the short one read whole
            assert sc.count(sig, **labels, signal="repetition") == 0
            assert sc.state.answers is not None and sc.state.answers.held.held == 0


@pytest.mark.e2e
def test_past_the_checkers_share_of_a_core_an_answer_counts_its_stop_only() -> None:
    """answers.cpu_share: once reading answers has taken its share of a core, further answers
    (a body and a stream alike) are counted by their stop reason (``cpu``), their events not
    kept; every answer is still counted, and nothing is held."""
    d = AnswerProviderDouble(script=Script(text="The fee is 103 EUR. " * 3, stop="truncated"))
    with serve(d.app()) as durl:
        app = create_app(_settings(durl, answers={"cpu_share": 1e-9}))
        with serve(app) as url:
            sc = Sidecar(url, app.state.sidecar, d)
            assert sc.state.answers is not None and sc.state.answers.credit is not None
            c = openai.OpenAI(base_url=url + "/v1", api_key="k", max_retries=0)
            msgs: Any = [{"role": "user", "content": "hi"}]
            c.chat.completions.create(model="gpt-4o", messages=msgs)  # read: the credit is whole
            sc.settle()
            assert not sc.state.answers.reading()  # that read spent the (tiny) share
            c.chat.completions.create(model="gpt-4o", messages=msgs)
            for _ in c.chat.completions.create(model="gpt-4o", messages=msgs, stream=True):
                pass
            sc.settle()
            labels = {"model": "gpt-4o", "workload": "default", "fill": "0.1-0.2", "side": "none"}
            assert sc.count("llm_context_answers_total", **labels) == 3
            assert sc.count("llm_context_answer_checks_skipped_total", reason="cpu") == 2
            sig = "llm_context_answer_signals_total"
            assert sc.count(sig, **labels, signal="truncated") == 3
            assert sc.state.answers.held.held == 0


@pytest.mark.e2e
def test_while_others_are_in_flight_the_checker_spends_only_its_busy_burst() -> None:
    """What the checker saved up while idle (ten seconds of its share) is spent on answers that
    come one at a time; while other requests are in flight only ``answers.cpu_burst_seconds``
    of it (a second's). Half the saving spent: an answer alone is read, one beside another
    request is counted by its stop reason (``cpu``) until the busy credit is paid back."""
    d = AnswerProviderDouble()
    with serve(d.app()) as durl:
        app = create_app(_settings(durl))
        with serve(app) as url:
            sc = Sidecar(url, app.state.sidecar, d)
            assert sc.state.answers is not None and sc.state.answers.credit is not None
            credit = sc.state.answers.credit
            credit.spend(0.1)  # 0.1 of 0.2 left; the busy credit (0.02) owes 0.02
            c = openai.OpenAI(base_url=url + "/v1", api_key="k", max_retries=0)
            msgs: Any = [{"role": "user", "content": "hi"}]
            c.chat.completions.create(model="gpt-4o", messages=msgs)
            sc.settle()
            assert sc.count("llm_context_answer_checks_skipped_total", reason="cpu") == 0
            rec = app.proxy.rec
            credit.spend(0.05)  # the busy credit owes 0.02 again: a second to pay back
            rec.opened()  # another request in flight: each one asks beside it
            try:
                c.chat.completions.create(model="gpt-4o", messages=msgs)
                for _ in c.chat.completions.create(model="gpt-4o", messages=msgs, stream=True):
                    pass
            finally:
                rec.batches.open -= 1
                rec.flush()
            sc.settle()
            assert sc.count("llm_context_answer_checks_skipped_total", reason="cpu") == 2
            labels = {"model": "gpt-4o", "workload": "default", "fill": "0.1-0.2", "side": "none"}
            assert sc.count("llm_context_answers_total", **labels) == 3


class Recording:
    """The answer checker's sink, as a list of what it was told."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def answer(
        self,
        where: AnswerLabels,
        signals: list[str],
        output: int | None,
        reasoning: int | None,
        n: int = 1,
    ) -> None:
        self.calls.append(("answer", tuple(where), signals, output, reasoning, n))

    def answer_skipped(self, reason: str, n: int = 1) -> None:
        self.calls.append(("skipped", reason, n))


class Slow(Recording):
    """A sink whose every count takes ``burn`` seconds of the checker thread's CPU."""

    def __init__(self, burn: float) -> None:
        super().__init__()
        self.burn = burn

    def answer(self, *args: Any, **kwargs: Any) -> None:
        end = time.thread_time() + self.burn
        while time.thread_time() < end:
            pass
        super().answer(*args, **kwargs)


def _stopped_answers(n: int) -> list[Job]:
    """``n`` small chat answers that stopped normally, to read."""
    body = json.dumps(
        {"choices": [{"message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}]}
    ).encode()
    labels = AnswerLabels("m", "default", "0.1-0.2", "below")
    return [Job(labels, format_of("openai"), False, Expect(), body, "stop", 1) for _ in range(n)]


def test_answers_not_read_are_tallied_by_label_set() -> None:
    """An answer counted by its stop reason alone is queued as a tuple and counted once per
    label set, stop and reason on the thread: the same totals as one count each."""
    sink = Recording()
    calls = sink.calls
    checker = AnswerChecker(sink, interval=0.01)
    a = AnswerLabels("m", "default", "0.1-0.2", "below")
    b = AnswerLabels("m", "default", "0.8-0.9", "above")
    for _ in range(3):
        checker.count_unread(a, "stop", 5, None, "cpu")
    checker.count_unread(b, "length", 7, 2, "cpu")
    checker.count_unread(b, "length", None, None, "too_large")
    checker.start()
    try:
        checker.join()
    finally:
        checker.stop()
    assert sorted(c for c in calls if c[0] == "skipped") == [
        ("skipped", "cpu", 1),
        ("skipped", "cpu", 3),
        ("skipped", "too_large", 1),
    ]
    answered = sorted(c for c in calls if c[0] == "answer")
    assert answered == [
        ("answer", tuple(a), ["stop"], 15, 0, 3),
        ("answer", tuple(b), ["truncated"], 0, 0, 1),
        ("answer", tuple(b), ["truncated"], 7, 2, 1),
    ]


def test_the_cpu_share_pays_for_the_whole_thread_not_only_the_reading() -> None:
    """answers.cpu_share bounds what the checker's thread costs: everything it does around an
    answer (the counting here) is spent from the credit, not only the reading, which alone was a
    fraction of the thread's CPU under load."""
    burn = 0.05  # seconds of the thread's CPU each count takes

    spent: list[float] = []

    class Recorded(CpuCredit):
        def spend(self, seconds: float) -> None:
            spent.append(seconds)
            super().spend(seconds)

    sink = Slow(burn)
    checker = AnswerChecker(sink, interval=0.01, credit=Recorded(0.02, burst=1.0))
    for job in _stopped_answers(3):
        checker.submit(job)
    checker.start()
    try:
        checker.join()
    finally:
        checker.stop()
    assert [c[0] for c in sink.calls] == ["answer"] * 3
    assert sum(spent) >= 3 * burn
    # 0.15 s spent against 0.02 saved up: no answer is read until the share has paid it back
    assert checker.credit is not None and not checker.credit.ok()
    assert not checker.reading()


@pytest.mark.parametrize(("per_answer", "most", "least"), [(0.2, 0.34, 0.1), (2.0, 1.0, 1.0)])
def test_the_checker_hands_the_interpreter_back_once_a_slice(
    monkeypatch: pytest.MonkeyPatch, per_answer: float, most: float, least: float
) -> None:
    """The checker hands the interpreter lock back to the event loop once it has held it for
    ``YIELD_AFTER`` of its CPU: after several small answers (a hand-off per answer cost the loop
    more than the reading), and after every answer that alone takes a slice."""
    burn = per_answer * YIELD_AFTER  # thread CPU each answer's count takes
    n = 60

    handoffs: list[float] = []
    real_sleep = time.sleep

    def sleep(seconds: float) -> None:
        if seconds == 0 and threading.current_thread().name == "test-checker":
            handoffs.append(seconds)
        real_sleep(seconds)

    monkeypatch.setattr(time, "sleep", sleep)  # the module the checker calls it from
    sink = Slow(burn)
    checker = AnswerChecker(sink, interval=0.01, queue_size=n)
    for job in _stopped_answers(n):
        checker.submit(job)
    thread = threading.Thread(target=checker._drain, name="test-checker")
    thread.start()
    thread.join()
    assert [c[0] for c in sink.calls] == ["answer"] * n
    assert least * n <= len(handoffs) <= most * n


def test_a_cpu_credit_refills_at_its_share_and_saves_up_a_burst() -> None:
    now = [0.0]
    credit = CpuCredit(0.1, clock=lambda: now[0], burst=10.0)
    assert credit.ok()
    credit.spend(1.5)  # 1.0 saved up: now 0.5 in debt
    assert not credit.ok()
    now[0] += 4.0  # refills 0.4
    assert not credit.ok()
    now[0] += 1.5  # another 0.15: back above zero
    assert credit.ok()
    now[0] += 1000.0  # never more than the burst
    credit.spend(1.0)
    assert credit.ok()
    credit.spend(0.01)
    assert not credit.ok()


def test_a_busy_pod_spends_a_second_of_what_it_saved_up() -> None:
    """What an idle pod saves up (ten seconds of its share) goes to work that starts one request
    at a time; while other requests are in flight at most ``busy_burst`` seconds of it is spent
    at once, beside the traffic that came back. Work done while quiet holds busy work back no
    longer than the main credit's debt and one busy burst."""
    now = [0.0]
    credit = CpuCredit(0.02, clock=lambda: now[0], busy_burst=1.0)
    now[0] += 3600.0  # 0.2 saved up, 0.02 of it for busy work
    credit.spend(0.015)
    assert credit.ok(busy=True)  # busy credit 0.005
    credit.spend(0.01)
    assert not credit.ok(busy=True)  # busy credit -0.005: the rest of the saving is kept back
    assert credit.ok()  # one at a time, it is there (0.175)
    now[0] += 0.3  # refilled at the share: the busy credit 0.001
    assert credit.ok(busy=True)
    credit.spend(0.3)  # a long piece of work, started while the credit allowed it
    assert not credit.ok() and not credit.ok(busy=True)  # -0.119; busy owes at most 0.02
    now[0] += 6.0  # the main credit paid back (0.001), the busy one full again
    assert credit.ok(busy=True)
    assert CpuCredit(0.02, busy_burst=10.0).ok(busy=True)
    whole = CpuCredit(0.02, clock=lambda: now[0], busy_burst=10.0)
    whole.spend(0.19)
    assert whole.ok(busy=True)  # all of it, as one at a time


def test_the_busy_bursts_of_both_cpu_shares_are_settings() -> None:
    """``answers.cpu_burst_seconds`` and ``counting.sample_cpu_burst_seconds``: how much of each
    share a pod spends at once while other requests are in flight. By default a second's (0.02 s
    at 2%) of the ten it saves up; all ten when set so."""
    from context_ceiling.sidecar.state import SidecarState

    def credits(**over: Any) -> list[CpuCredit]:
        st = SidecarState.build(_settings("http://127.0.0.1:9", **over))
        assert st.answers is not None and st.answers.credit is not None
        return [st.answers.credit, st.sampler.credit]

    for credit in credits():
        credit.spend(0.025)  # 5 ms past a second's share: a quarter second to refill
        assert not credit.ok(busy=True)
        assert credit.ok()
    for credit in credits(
        answers={"cpu_burst_seconds": 10}, counting={"sample_cpu_burst_seconds": 10}
    ):
        credit.spend(0.15)
        assert credit.ok(busy=True)
        credit.spend(0.06)
        assert not credit.ok(busy=True)
    with pytest.raises(ValueError, match="cpu_burst_seconds"):
        _settings("http://127.0.0.1:9", answers={"cpu_burst_seconds": 0})


@pytest.mark.e2e
def test_answers_off_counts_nothing() -> None:
    d = AnswerProviderDouble()
    with serve(d.app()) as durl:
        app = create_app(_settings(durl, answers={"enabled": False}))
        with serve(app) as url:
            state: SidecarState = app.state.sidecar
            assert state.answers is None
            openai.OpenAI(base_url=url + "/v1", api_key="k", max_retries=0).chat.completions.create(
                model="gpt-4o", messages=[{"role": "user", "content": "hi"}]
            )
            names = {m.name for m in state.metrics.registry.collect() if m.samples}
            assert "llm_context_answers" not in names


@pytest.mark.e2e
def test_no_answer_text_reaches_the_metrics(sidecar: Sidecar) -> None:
    secret = "sk-proj-" + "Q" * 40
    sc = sidecar
    sc.double.script = Script(text=f"Your key is {secret}", tool_calls=[(secret, "{}")])
    sc.double.prompt_tokens = 1000
    call(sc, "openai_chat", True, Ask(tools=True))
    sc.settle()
    from prometheus_client import generate_latest

    assert secret.encode() not in generate_latest(sc.state.metrics.registry)


# -- the checks on their own ---------------------------------------------------------------------


def _noise(seed: int, n: int = 6000) -> str:
    rng = random.Random(seed)
    return "".join(rng.choice("abcdefgh ") for _ in range(n))


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("The answer is 42.", False),
        ("x" * 300, True),
        ("Intro. " + "I will check the records again. " * 8, True),
        ("Intro. " + "The same line again.\n" * 9, False),  # under 200 characters
        (_noise(1), False),
        (
            _noise(2) + "The same line again.\n" * 12,
            True,  # a long answer that ends in a loop
        ),
        ("| a | b |\n" + "|---|---|\n" + "".join(f"| {i} | {i * i} |\n" for i in range(40)), False),
    ],
)
def test_repetition(text: str, want: bool) -> None:
    assert repetition(text) is want


def test_expectations_of_every_shape() -> None:
    e = expectations(
        "gemini",
        {
            "generationConfig": {
                "responseMimeType": "application/json",
                "responseSchema": {
                    "type": "OBJECT",
                    "properties": {"n": {"type": "INTEGER", "nullable": True}},
                    "required": ["n"],
                },
            },
            "tools": [{"functionDeclarations": [{"name": "f", "parameters": {"type": "OBJECT"}}]}],
        },
    )
    assert e.json and e.schema == {
        "type": "object",
        "properties": {"n": {"type": ["integer", "null"]}},
        "required": ["n"],
    }
    assert e.tools == {"f": {"type": "object"}}
    assert problems(Answer(text='{"n": null}', finish="STOP"), e) == []
    assert problems(Answer(text='{"n": "one"}', finish="STOP"), e) == ["schema_mismatch"]
    a = expectations("anthropic", {"output_format": {"type": "json_schema", "schema": SCHEMA}})
    assert a.json and a.schema == SCHEMA and a.tools is None
    r = expectations("responses", {"text": {"format": {"type": "json_object"}}})
    assert r.json and r.schema is None
    o = expectations(
        "openai", {"tools": [{"type": "custom", "custom": {"name": "shell"}}], "messages": []}
    )
    assert o.free == {"shell"} and not o.json
    assert problems(Answer(tool_calls=[("shell", "ls -la")], finish="tool_calls"), o) == []


def test_a_schema_with_client_regular_expressions_is_not_run() -> None:
    evil = {"type": "object", "properties": {"a": {"type": "string", "pattern": "^(a+)+$"}}}
    e = Expect(json=True, schema=evil)
    # checked for JSON, never matched against the client's pattern
    assert problems(Answer(text='{"a": "' + "a" * 40 + '!"}', finish="stop"), e) == []
    assert problems(Answer(text="{", finish="stop"), e) == ["invalid_json"]


def test_stop_reasons_in_one_vocabulary() -> None:
    assert stop_of(Answer(finish="length")) == "truncated"
    assert stop_of(Answer(finish="max_tokens")) == "truncated"
    assert stop_of(Answer(finish="MAX_TOKENS")) == "truncated"
    assert stop_of(Answer(finish="max_output_tokens")) == "truncated"
    assert stop_of(Answer(finish="RECITATION")) == "content_filter"
    assert stop_of(Answer(finish="stop", refusal=True)) == "refusal"
    assert stop_of(Answer(finish="completed", tool_calls=[("f", "{}")])) == "tool_calls"
    assert stop_of(Answer(finish="pause_turn")) == "other_stop"
    assert stop_of(Answer(finish=None)) == "other_stop"
    malformed = Answer(finish="MALFORMED_FUNCTION_CALL", malformed_call=True)
    assert stop_of(malformed) == "tool_calls"
    assert "invalid_tool_arguments" in problems(malformed, Expect())


def test_long_context_tiers_price_the_whole_request() -> None:
    price = lookup("gemini-2.5-pro", "google")
    assert price is not None and price.tiers
    tier = price.tiers[0]
    assert price.at(tier.start - 1).input == price.input
    assert price.at(tier.start).input == tier.input > price.input


def _stream(*events: dict[str, Any]) -> bytes:
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)


def test_streamed_tool_calls_are_assembled_and_server_tools_left_out() -> None:
    # Anthropic: a server tool's input streams like a client tool's; only client tools count
    raw = _stream(
        {
            "type": "content_block_start",
            "index": 0,
            "content_block": {"type": "server_tool_use", "name": "web_search"},
        },
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "input_json_delta", "partial_json": '{"q": "x"}'},
        },
        {
            "type": "content_block_start",
            "index": 1,
            "content_block": {"type": "tool_use", "name": "get_weather", "input": {}},
        },
        {
            "type": "content_block_delta",
            "index": 1,
            "delta": {"type": "input_json_delta", "partial_json": '{"x": '},
        },
        {
            "type": "content_block_delta",
            "index": 1,
            "delta": {"type": "input_json_delta", "partial_json": '"Oslo"}'},
        },
        {
            "type": "message_delta",
            "delta": {"stop_reason": "tool_use"},
            "usage": {"output_tokens": 9},
        },
    )
    a = read_answer("anthropic", raw, stream=True)
    assert a.tool_calls == [("get_weather", '{"x": "Oslo"}')] and a.finish == "tool_use"
    # OpenAI chat: argument pieces joined by index; a delta without an index is its own call
    raw = _stream(
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {
                        "tool_calls": [{"index": 0, "function": {"name": "f", "arguments": '{"a"'}}]
                    },
                }
            ]
        },
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {"tool_calls": [{"index": 0, "function": {"arguments": ": 1}"}}]},
                }
            ]
        },
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {"tool_calls": [{"function": {"name": "g", "arguments": "{}"}}]},
                }
            ]
        },
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
    )
    a = read_answer("openai", raw, stream=True)
    assert sorted(a.tool_calls) == [("f", '{"a": 1}'), ("g", "{}")]
    assert stop_of(a) == "tool_calls"


def test_an_answer_held_before_it_is_queued_is_held_once() -> None:
    """An answer waiting for its record's batch holds its bytes from the moment its exchange
    finished (:meth:`AnswerChecker.hold`): queued, it is not held again; dropped because the
    queue is full, its bytes are given back; past the limit, it is not held at all."""
    sink = Recording()
    checker = AnswerChecker(sink, interval=0.01, queue_size=1, held=HeldBytes(1000))
    first, second = _stopped_answers(2)
    first.size = checker.hold(first.raw) or 0
    assert first.size == len(first.raw) and checker.held.held == first.size
    checker.submit(first)
    assert checker.held.held == first.size  # held once
    second.size = checker.hold(second.raw) or 0
    checker.submit(second)  # the queue is full: dropped, its bytes given back
    assert checker.held.held == first.size
    assert checker.hold(b"x" * 2000) is None and checker.held.held == first.size
    checker.start()
    try:
        checker.join()
    finally:
        checker.stop()
    assert checker.held.held == 0
    assert [c[0] for c in sink.calls].count("answer") == 1
