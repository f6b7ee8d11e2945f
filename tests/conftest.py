from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

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
    url: str
    state: SidecarState
    double: HostedProviderDouble
    double_url: str

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


@pytest.fixture
def make_sidecar(double: tuple[HostedProviderDouble, str]) -> Iterator[Callable[..., Running]]:
    d, durl = double
    with ExitStack() as stack:

        def make(**overrides: Any) -> Running:
            cfg: dict[str, Any] = {
                "upstreams": {
                    "openai": {
                        "base_url": durl + "/v1",
                        "timeouts": {"connect": 2, "read": 5, "total": 10},
                    },
                    "anthropic": {
                        "base_url": durl,
                        "timeouts": {"connect": 2, "read": 5, "total": 10},
                    },
                },
                "models": MODELS,
                "workloads": ["default", "rag", "agent"],
            }
            cfg.update(overrides)
            app = create_app(Settings(**cfg))
            url = stack.enter_context(serve(app))
            return Running(url, app.state.sidecar, d, durl)

        yield make


@pytest.fixture
def sidecar(make_sidecar: Callable[..., Running]) -> Running:
    return make_sidecar()
