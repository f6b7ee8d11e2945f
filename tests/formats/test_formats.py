"""The wire-format registry: every registered format answers its own routes and only those,
renders its errors, and counts, trims and reads its own traffic the same way the sidecar does;
and a provider added as one module (Anthropic on Vertex AI) works end to end through its official
SDK client. The upstream is the loopback double standing in for the hosted APIs."""

from __future__ import annotations

import json
import re
from typing import Any

import anthropic
import orjson
import pytest

from context_ceiling.core.trim import Policy
from context_ceiling.core.vocabulary import Shape
from context_ceiling.formats import (
    API_FORMATS,
    FORMATS,
    GENERATION_APIS,
    MODULES,
    ROUTES,
    client_api_of,
    count,
    fit,
    route_for,
)
from context_ceiling.formats.base import Route
from testkit.traffic.agent_loops import Loop, pairs, provider_valid
from tests.conftest import Running


def _example_path(route: Route) -> str:
    """A request path of a route matched by pattern: its documented path with its
    placeholders filled in."""
    path = route.path
    for name, value in (
        ("{version}", "v1beta"),
        ("{model}", "some-model"),
        ("{deployment}", "dep-1"),
        ("{project}", "proj"),
        ("{region}", "us-east5"),
    ):
        path = path.replace(name, value)
    return path


@pytest.mark.parametrize("route", ROUTES, ids=lambda r: f"{r.metric_api}:{r.path}")
def test_every_route_answers_its_own_paths(route: Route) -> None:
    paths = route.paths or (_example_path(route),)
    for path in paths:
        assert route_for(path) is route, path
        assert route.answers(path)
    assert route.metric_api in GENERATION_APIS or route.count_only


def test_no_path_is_claimed_by_two_routes() -> None:
    exact = [p for r in ROUTES for p in r.paths]
    assert len(exact) == len(set(exact))
    for r in ROUTES:
        for path in r.paths or (_example_path(r),):
            assert [o for o in ROUTES if o.answers(path)] == [r], path
    # paths that are not measured routes pass through
    for path in ("/v1/embeddings", "/v1/messages/batches", "/openai/deployments/d/embeddings"):
        assert route_for(path) is None


def test_every_module_is_registered_with_its_routes() -> None:
    for module in MODULES:
        assert module.ROUTES, module.__name__
        assert all(r in ROUTES for r in module.ROUTES)
    assert set(FORMATS) == {r.shape for r in ROUTES}


@pytest.mark.parametrize("api", list(API_FORMATS))
@pytest.mark.parametrize("status", [400, 401, 404, 413, 429, 500, 502, 504])
def test_every_api_renders_its_errors_as_json_naming_the_problem(api: str, status: int) -> None:
    body = json.loads(API_FORMATS[api].error_body(status, "too long: 9 > 8", None))
    assert "too long: 9 > 8" in json.dumps(body)


@pytest.mark.parametrize("shape", list(FORMATS))
def test_every_format_counts_fits_and_stays_valid(shape: Shape) -> None:
    """The shared contract, run for every registered format over an agent loop of its own
    traffic: the count's parts add up to its total, a fit lands within its budget (the fixed
    part allowing), its report is a recount of what it returned, no call loses its result, the
    newest calls are the last to go, and the request asked for its output the way the format
    says."""
    for n, body in enumerate(Loop(shape, rounds=24, output_words=(300, 900)).turns(), 1):
        c = count(body, shape=shape)
        assert sum(p.tokens for p in c.parts) == c.total
        assert sum(c.components.values()) == c.total
        budget = max(2000, c.total // 2)
        out, report = fit(body, shape=shape, budget=budget, policy=Policy(keep=2))
        assert report.after == count(out, shape=shape).total, f"turn {n}"
        assert report.fits or report.after > budget
        if n > 12:
            assert report.fits, f"turn {n}: {report.after} > {budget}"
        assert provider_valid(shape, out), f"turn {n}"
        sent, kept = pairs(shape, body)[0], pairs(shape, out)[0]
        # the call the model answers now stays, and the newest go last: no call kept is older
        # than one dropped
        assert sent[-1:] == kept[-1:], f"turn {n}"
        gone = [k for k, c in enumerate(sent) if c not in kept]
        assert not gone or kept == sent[max(gone) + 1 :], f"turn {n}"
    fmt = FORMATS[shape]
    asked: dict[str, dict[str, Any]] = {
        "openai": {"max_completion_tokens": 77},
        "responses": {"max_output_tokens": 77},
        "anthropic": {"max_tokens": 77},
        "gemini": {"generationConfig": {"maxOutputTokens": 77}},
        "converse": {"inferenceConfig": {"maxTokens": 77}},
    }
    assert fmt.requested_output(asked[shape]) == 77


@pytest.mark.parametrize("shape", list(FORMATS))
def test_every_format_refuses_a_malformed_body_with_the_field_named(shape: Shape) -> None:
    key = FORMATS[shape].trim.items_key
    with pytest.raises(ValueError, match=re.escape(key) + r"|\[0\]"):
        count({key: [17]}, shape=shape)


# -- a provider added as one module: Anthropic on Vertex AI ------------------------------------


def _vertex(sc: Running) -> anthropic.AnthropicVertex:
    return anthropic.AnthropicVertex(
        region="us-east5",
        project_id="proj-1",
        access_token="ya29.SECRET-token",
        base_url=sc.url + "/v1",
        max_retries=0,
    )


MESSAGES: list[Any] = [{"role": "user", "content": "Which contract has the lowest fee?"}]


def test_anthropic_on_vertex_is_measured_through_its_sdk(sidecar: Running) -> None:
    client = _vertex(sidecar)
    raw = client.messages.with_raw_response.create(
        model="claude-sonnet-4@20250514", max_tokens=64, messages=MESSAGES
    )
    assert raw.parse().content[0].text == "The answer is 42."  # type: ignore[union-attr]
    got = sidecar.double.received[-1]
    assert got.path == (
        "/v1/projects/proj-1/locations/us-east5/publishers/anthropic/models/"
        "claude-sonnet-4@20250514:rawPredict"
    )
    assert got.headers["authorization"] == "Bearer ya29.SECRET-token"
    assert got.json["anthropic_version"] and "model" not in got.json
    spec = sidecar.state.registry.resolve("claude-sonnet-4@20250514")
    assert spec is not None
    counter = sidecar.state.registry.counter(spec)
    expected = count({"messages": MESSAGES}, shape="anthropic", counter=counter).total
    assert int(raw.headers["x-ceiling-input-tokens"]) == expected
    labels = {"model": "claude", "workload": "default", "outcome": "ok"}
    assert (
        sidecar.sample("llm_context_requests_total", api="vertex_anthropic_messages", **labels) == 1
    )

    with client.messages.stream(
        model="claude-sonnet-4@20250514", max_tokens=64, messages=MESSAGES
    ) as stream:
        assert "".join(stream.text_stream) == "tok0 tok1 tok2 tok3 tok4 "
    assert sidecar.double.received[-1].path.endswith(":streamRawPredict")
    assert (
        sidecar.sample("llm_context_requests_total", api="vertex_anthropic_messages", **labels) == 2
    )

    n = client.messages.count_tokens(model="claude-sonnet-4@20250514", messages=MESSAGES)
    assert n.input_tokens == sidecar.double.prompt_tokens
    assert sidecar.double.received[-1].path.endswith("/models/count-tokens:rawPredict")
    assert (
        sidecar.sample("llm_context_requests_total", api="vertex_anthropic_count_tokens", **labels)
        == 1
    )


def test_anthropic_on_vertex_is_trimmed_and_refused_in_anthropics_words(
    make_sidecar: Any,
) -> None:
    sc = make_sidecar(
        enforcement={"mode": "enforce"},
        models=[{"match": "claude*", "window": 3000, "max_output_tokens": 256}],
    )
    client = _vertex(sc)
    docs = "\n".join(
        f'<document id="{i}">' + f"clause {i} of the agreement. " * 30 + "</document>"
        for i in range(30)
    )
    client.messages.create(
        model="claude-sonnet-4@20250514",
        max_tokens=256,
        messages=[{"role": "user", "content": docs + "\nWhich clause?"}],
    )
    sent = orjson.loads(sc.double.received[-1].body)
    kept = sent["messages"][0]["content"]
    assert kept.endswith("Which clause?") and kept.count("<document") < 30  # chunks dropped
    with pytest.raises(anthropic.BadRequestError, match="prompt is too long"):
        client.messages.create(
            model="claude-sonnet-4@20250514",
            max_tokens=256,
            messages=[{"role": "user", "content": "word " * 4000}],
        )


def test_every_api_says_how_its_clients_and_other_routes_are_known() -> None:
    """Pass-through reads the registry: which API a client speaks (its SDK's headers, its
    routes' paths; the OpenAI style when nothing says) and the bounded route label of each
    provider's other routes."""
    assert client_api_of({"anthropic-version": "2023-06-01"}, "/v1/models") == "anthropic"
    assert client_api_of({"x-goog-api-key": "k"}, "/v1/models") == "gemini"
    assert client_api_of({}, "/v1beta/cachedContents") == "gemini"
    assert client_api_of({"authorization": "Bearer k"}, "/v1/embeddings") == "openai"
    for api, fmt in API_FORMATS.items():
        assert fmt.passthrough_routes, api
        assert all(re.fullmatch(r"[a-z_]+", label) for label in fmt.passthrough_routes.values())
