from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import anthropic
import httpx
import httpx2
import openai
import pytest

from context_ceiling.sidecar.app import create_app
from context_ceiling.sidecar.config import Settings
from context_ceiling.sidecar.observability.metrics import Metrics
from context_ceiling.sidecar.state import SidecarState
from testkit.doubles.hosted_provider import HostedProviderDouble
from testkit.serving import serve

MODELS: list[dict[str, Any]] = [
    {
        "match": "gpt-4o",
        "window": 128000,
        "max_output_tokens": 16384,
        "tokenizer": {"kind": "tiktoken", "encoding": "o200k_base"},
    },
    {"match": "gpt-4o-mini*", "label": "gpt-4o-mini", "window": 128000, "max_output_tokens": 16384},
    {
        "match": "claude-*",
        "label": "claude",
        "window": 200000,
        "max_output_tokens": 8192,
        "tokenizer": {"kind": "calibrated", "encoding": "cl100k_base", "factor": 1.1},
    },
]


# -- the two tiers -------------------------------------------------------------------------------

#: markers that put a test in the end-to-end tier whatever else it says
E2E_IMPLIED = ("slow", "real_model", "helm", "image")


class NotInProcess(RuntimeError):
    """A test of the in-process tier opened a network socket or started a process."""


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--in-process",
        action="store_true",
        help="the in-process tier only (make test-fast): tests marked e2e are left out, and a "
        "test that opens a network socket or starts a process fails, naming the tier it "
        "belongs in",
    )


#: fixtures that serve something on loopback: a test that uses one is end to end
E2E_FIXTURES = frozenset({"double", "bedrock_double", "make_bedrock"})
#: fixtures that serve the sidecar unless the test's module runs in process
SIDECAR_FIXTURES = frozenset({"make_sidecar", "sidecar"})


def _start_order(item: pytest.Item) -> int:
    """The longest tests start first, so that ``make test``'s workers finish together: the
    demo's sweep, the real model's other tests, then the other slow ones, then the rest (in
    collection order)."""
    group = item.get_closest_marker("xdist_group")
    if group is not None and group.args == ("demo",):
        return 0
    if item.get_closest_marker("real_model"):
        return 1
    return 2 if item.get_closest_marker("slow") else 3


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=_start_order)
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        if (
            any(item.get_closest_marker(m) for m in E2E_IMPLIED)
            or E2E_FIXTURES & used
            or (
                SIDECAR_FIXTURES & used
                and not getattr(getattr(item, "module", None), "IN_PROCESS", False)
            )
        ):
            item.add_marker(pytest.mark.e2e)
    if config.getoption("--in-process"):
        kept = [i for i in items if i.get_closest_marker("e2e") is None]
        config.hook.pytest_deselected(items=[i for i in items if i not in kept])
        items[:] = kept


def _refuse(what: str) -> Any:
    def refuse(*_args: Any, **_kwargs: Any) -> Any:
        raise NotInProcess(
            f"this test {what}: it belongs in the end-to-end tier (mark it "
            "pytest.mark.e2e), or should reach the sidecar and its upstream in process "
            "(create_app(..., transport=httpx.ASGITransport(double.app())))"
        )

    return refuse


@pytest.fixture(autouse=True)
def _in_process_only(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """In the in-process tier, network sockets and child processes are refused (a Unix socket
    pair, which the event loop uses to wake itself, is not a network socket)."""
    if not request.config.getoption("--in-process"):
        return
    inet = (socket.AF_INET, socket.AF_INET6)
    connect, bind = socket.socket.connect, socket.socket.bind

    def guarded(original: Any, what: str) -> Any:
        def call(self: socket.socket, *args: Any) -> Any:
            if self.family in inet:
                _refuse(what)()
            return original(self, *args)

        return call

    monkeypatch.setattr(socket.socket, "connect", guarded(connect, "connects to a network socket"))
    monkeypatch.setattr(
        socket.socket,
        "connect_ex",
        guarded(socket.socket.connect_ex, "connects to a network socket"),
    )
    monkeypatch.setattr(socket.socket, "bind", guarded(bind, "listens on a network socket"))
    monkeypatch.setattr(subprocess.Popen, "__init__", _refuse("starts a process"))


#: promtool (the Debian package prometheus; .ci/run installs it) for the rule tests
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None,
    reason="promtool comes from the Debian package prometheus (.ci/run installs it)",
)


def request_log_line(caplog: pytest.LogCaptureFixture, request_id: str) -> dict[str, Any]:
    """The request's JSON log line (its fields), once it is written: a sampled request's comes
    when its count lands, after its answer."""
    from context_ceiling.sidecar.observability.logs import REQUEST_LOGGER

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for r in caplog.records:
            f = getattr(r, "fields", None)
            if r.name == REQUEST_LOGGER and f and f["request_id"] == request_id:
                return dict(f)
        time.sleep(0.005)
    raise AssertionError(f"no log line for {request_id}")


@dataclass
class Running:
    """A sidecar in front of the hosted-provider double: served on loopback (``make_sidecar``),
    or in process (``make_inprocess``: the test client calls the ASGI app, the sidecar reaches
    the double's ASGI app through its injected transport). ``http`` is a client whose base URL
    is the sidecar's, in either case: a test written against it (and SDK clients given it as
    their ``http_client``) runs in either tier."""

    url: str
    state: SidecarState
    double: HostedProviderDouble
    double_url: str
    #: httpx2's client: the official SDKs' transport type, and the test client's
    http: httpx2.Client

    def openai(self, **kw: Any) -> openai.OpenAI:
        """The official OpenAI SDK pointed at this sidecar, over :attr:`http`."""
        args: dict[str, Any] = {"base_url": self.url + "/v1", "api_key": "k", "max_retries": 0}
        return openai.OpenAI(**(args | kw), http_client=self.http)

    def anthropic(self, **kw: Any) -> anthropic.Anthropic:
        """The official Anthropic SDK pointed at this sidecar, over :attr:`http`."""
        args: dict[str, Any] = {"base_url": self.url, "api_key": "k", "max_retries": 0}
        return anthropic.Anthropic(**(args | kw), http_client=self.http)

    @property
    def metrics(self) -> Metrics:
        return self.state.metrics

    def sample(self, name: str, **labels: str) -> float | None:
        return self.metrics.registry.get_sample_value(name, labels)


@pytest.fixture
def double() -> Iterator[tuple[HostedProviderDouble, str]]:
    d = HostedProviderDouble()
    with serve(d.app()) as url:
        yield d, url


def sidecar_config(upstream_url: str, **overrides: Any) -> dict[str, Any]:
    """The test sidecar's settings: OpenAI and Anthropic upstreams at ``upstream_url``."""
    cfg: dict[str, Any] = {
        "upstreams": {
            "openai": {
                "base_url": upstream_url + "/v1",
                "timeouts": {"connect": 2, "read": 5, "total": 10},
            },
            "anthropic": {
                "base_url": upstream_url,
                "timeouts": {"connect": 2, "read": 5, "total": 10},
            },
        },
        "models": MODELS,
        "workloads": ["default", "rag", "agent"],
    }
    cfg.update(overrides)
    return cfg


def _served(stack: ExitStack, d: HostedProviderDouble, durl: str) -> Callable[..., Running]:
    def make(**overrides: Any) -> Running:
        app = create_app(Settings(**sidecar_config(durl, **overrides)))
        url = stack.enter_context(serve(app))
        http = stack.enter_context(httpx2.Client(base_url=url, timeout=30))
        return Running(url, app.state.sidecar, d, durl, http)

    return make


#: the in-process sidecar's and upstream's addresses (names only: nothing listens on them)
SIDECAR_URL = "http://sidecar.test"
UPSTREAM_URL = "http://upstream.test"


def _in_process(stack: ExitStack) -> Callable[..., Running]:
    from starlette.testclient import TestClient

    d = HostedProviderDouble()
    upstream = httpx.ASGITransport(app=d.app())

    def make(**overrides: Any) -> Running:
        app = create_app(Settings(**sidecar_config(UPSTREAM_URL, **overrides)), upstream)
        http = stack.enter_context(TestClient(app, base_url=SIDECAR_URL))
        return Running(SIDECAR_URL, app.state.sidecar, d, UPSTREAM_URL, http)

    return make


def in_process(item: pytest.Item | pytest.FixtureRequest) -> bool:
    """Whether a test runs its sidecars in process: its module says so (``IN_PROCESS = True``)
    and the test is not marked end to end."""
    node = item.node if isinstance(item, pytest.FixtureRequest) else item
    module = getattr(node, "module", None)
    return bool(getattr(module, "IN_PROCESS", False)) and node.get_closest_marker("e2e") is None


@pytest.fixture
def make_sidecar(request: pytest.FixtureRequest) -> Iterator[Callable[..., Running]]:
    """Sidecars in front of the hosted-provider double: in process where the test's module
    runs in process (``IN_PROCESS = True``, the test not marked e2e): the test client runs the
    app with its lifespan, the double is reached through the injected ASGI transport (which
    hands a stream over whole once it ends: timing and disconnects stay end to end); else both
    served on loopback (the end-to-end tier)."""
    with ExitStack() as stack:
        if in_process(request):
            yield _in_process(stack)
        else:
            d, durl = request.getfixturevalue("double")
            yield _served(stack, d, durl)


@pytest.fixture
def make_inprocess() -> Iterator[Callable[..., Running]]:
    """Sidecars in process, whatever the module says."""
    with ExitStack() as stack:
        yield _in_process(stack)


@pytest.fixture
def sidecar(make_sidecar: Callable[..., Running]) -> Running:
    return make_sidecar()
