"""A real Prometheus scrapes a real sidecar under generated traffic, evaluates the generated
rules, and every dashboard panel query returns data."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from dashboards.panels import dashboard, with_all
from testkit import REPO
from testkit.serving import free_port
from testkit.traffic.ceiling_docs import doc, entry
from tests.conftest import MODELS, Running

PROMETHEUS = shutil.which("prometheus")
TOKEN = "prom-admin"
pytestmark = pytest.mark.skipif(
    PROMETHEUS is None, reason="prometheus comes from the Debian package (.ci/run installs it)"
)


@pytest.fixture(params=["", "gen_ai_latest_experimental"], ids=["genai-earlier", "genai-latest"])
def prometheus(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    make_sidecar: Callable[..., Running],
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[tuple[str, Running]]:
    """A sidecar emitting the GenAI conventions' earlier names, or (the opt-in) the current
    ones, scraped by a real Prometheus with the generated rules."""
    monkeypatch.setenv("OTEL_SEMCONV_STABILITY_OPT_IN", request.param)
    sc = make_sidecar(
        admin_token=TOKEN,
        models=MODELS,
        workloads=["default", "rag"],
        enforcement={"mode": "observe", "workloads": {"rag": {"mode": "enforce"}}},
        staleness={"window": 2, "min_requests": 2},
    )
    target = sc.url.removeprefix("http://")
    rules = tmp_path / "rules.yaml"
    # the generated rules, evaluated every second for the test
    data = yaml.safe_load((REPO / "dashboards" / "generated" / "rules.yaml").read_text())
    for g in data["groups"]:
        g["interval"] = "1s"
    rules.write_text(yaml.safe_dump(data))
    (tmp_path / "prometheus.yml").write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": [str(rules)],
                "scrape_configs": [
                    {"job_name": "context-ceiling", "static_configs": [{"targets": [target]}]}
                ],
            }
        )
    )
    port = free_port()
    proc = subprocess.Popen(
        [
            PROMETHEUS or "prometheus",
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield f"http://127.0.0.1:{port}", sc
    finally:
        proc.terminate()
        proc.wait(15)


def push(sc: Running, version: int) -> int:
    d = doc(version, entry(tokens=400, fingerprint={"system_tokens": 2000, "retrieved_chunks": 1}))
    return httpx.put(
        sc.url + "/admin/ceilings", json=d, headers={"authorization": f"Bearer {TOKEN}"}
    ).status_code


def traffic(sc: Running) -> None:
    chunk = (
        "<document id='1'>"
        + "Contract K-1 renews for 120 EUR with 90 days notice. " * 40
        + "</document>"
    )
    for workload in ("default", "rag"):
        for size in (1, 3, 6):
            body = {
                "model": "gpt-4o",
                "messages": [
                    {"role": "system", "content": "answer"},
                    {"role": "user", "content": chunk * size + "\nWhat is the fee?"},
                ],
            }
            r = httpx.post(
                sc.url + "/v1/chat/completions", json=body, headers={"x-ceiling-workload": workload}
            )
            assert r.status_code in (200, 400)
    # asked for JSON, answered in prose: an answer signal (invalid_json) for the answer panels
    r = httpx.post(
        sc.url + "/v1/chat/completions",
        json={
            "model": "gpt-4o",
            "messages": [{"role": "user", "content": "The fee, as JSON?"}],
            "response_format": {"type": "json_object"},
        },
    )
    assert r.status_code == 200


def query(prom: str, expr: str) -> list[object]:
    r = httpx.get(prom + "/api/v1/query", params={"query": expr}, timeout=10)
    assert r.status_code == 200, (expr, r.text)
    result: list[object] = r.json()["data"]["result"]
    return result


def test_every_panel_query_returns_data(prometheus: tuple[str, Running], tmp_path: Path) -> None:
    prom, sc = prometheus
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(prom + "/-/ready", timeout=1).status_code == 200:
                break
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    assert push(sc, 1) == 200
    traffic(sc)
    time.sleep(4)
    assert push(sc, 1) == 422  # a rejected reload, for the reload panel
    traffic(sc)  # two scrapes apart, so every rate() has two points
    exprs = [
        (p["title"], with_all(t["expr"], "1m")) for p in dashboard()["panels"] for t in p["targets"]
    ]
    empty: list[str] = []
    deadline = time.monotonic() + 45
    while time.monotonic() < deadline:
        empty = [f"{title}: {e}" for title, e in exprs if not query(prom, e)]
        if not empty:
            break
        time.sleep(2)
    assert not empty, "panel queries without data:\n" + "\n".join(empty)
    assert query(prom, 'up{job="context-ceiling"} == 1')
    # the same queries drawn as a picture of the dashboard (how the docs' picture is made)
    from dashboards.render import render

    png = tmp_path / "panels.png"
    assert render(prom, str(png), minutes=1, step=1) >= len(exprs) // 2
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
