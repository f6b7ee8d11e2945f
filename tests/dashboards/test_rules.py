"""Dashboards and rules: generated from one source, fresh, checked by promtool, every alert tested
firing and not firing, every alert in the runbook, every metric they name exported."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import yaml

from dashboards import mixin
from dashboards.config import ALERTS, RUNBOOK
from dashboards.panels import dashboard
from dashboards.rule_tests import STANDALONE_TARGET, cases
from dashboards.rules import alerts, rules_file
from testkit import REPO
from tests.conftest import PROMTOOL, Running, needs_promtool


def test_generated_files_are_current() -> None:
    for folder, files in mixin.outputs().items():
        for name, text in files.items():
            assert (folder / name).read_text() == text, "run: python -m dashboards.mixin"


def test_every_alert_has_a_case_and_a_runbook_entry() -> None:
    names = [a["alert"] for a in alerts()]
    assert sorted(names) == sorted(c[0] for c in cases(STANDALONE_TARGET, {})) == sorted(ALERTS)
    runbook = (REPO / "dashboards" / "runbook.md").read_text()
    for a in alerts():
        anchor = a["annotations"]["runbook_url"].split("#")[1]
        assert f"## {a['alert']}" in runbook and anchor == a["alert"].lower()


@pytest.mark.e2e
@needs_promtool
def test_promtool_check_and_test_rules() -> None:
    """The committed files, as an operator would run them."""
    generated = REPO / "dashboards" / "generated"
    for args in (["check", "rules", "rules.yaml"], ["test", "rules", "rules_test.yaml"]):
        r = subprocess.run(
            [PROMTOOL or "promtool", *args], capture_output=True, text=True, cwd=generated
        )
        assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.e2e  # promtool checks the scoped file where it is installed
def test_rules_scoped_to_a_selector(tmp_path: Path) -> None:
    """``python -m dashboards.mixin --selector ... --out DIR``: every series the rules read is
    selected by the given matchers, and the file says how it selects in its first lines."""
    mixin.main(["--selector", 'job="ceiling",namespace="llm"', "--out", str(tmp_path)])
    text = (tmp_path / "rules.yaml").read_text()
    assert 'Selection: every series matches {job="ceiling",namespace="llm"}' in text
    data = yaml.safe_load(text)
    for group in data["groups"]:
        for rule in group["rules"]:
            for name, matchers in re.findall(
                r"(?<![:\w])(llm_context_[a-z_]+|up)(\{[^}]*\})?(?![\w:])", rule["expr"]
            ):
                if name in ("llm_context_config_version",) and "absent" in rule["expr"]:
                    continue
                assert 'job="ceiling"' in matchers, (rule.get("record") or rule["alert"], name)
    head = (REPO / "dashboards" / "generated" / "rules.yaml").read_text().splitlines()[:6]
    assert any("Selection: by the sidecar's metric names" in line for line in head)
    if PROMTOOL:
        r = subprocess.run(
            [PROMTOOL, "check", "rules", str(tmp_path / "rules.yaml")],
            capture_output=True,
            text=True,
        )
        assert r.returncode == 0, r.stdout + r.stderr


def test_an_empty_panel_says_why() -> None:
    for p in dashboard()["panels"]:
        if p["type"] == "row":
            continue
        assert "is the sidecar scraped" in p["fieldConfig"]["defaults"]["noValue"], p["title"]


def _metric_names(expr: str) -> set[str]:
    names = set(re.findall(r"(?<![:\w])(llm_context_[a-z_]+|gen_ai_[a-z_]+)(?![\w:])", expr))
    labels = {
        "gen_ai_operation_name",
        "gen_ai_provider_name",
        "gen_ai_request_model",
        "gen_ai_token_type",
    }
    return names - labels


def test_every_metric_named_exists_on_metrics(
    make_sidecar: Callable[..., Running], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every family a rule or panel names is exported (the GenAI ones under both the earlier
    and the current names: the panels read either)."""
    import openai

    monkeypatch.setenv("OTEL_SEMCONV_STABILITY_OPT_IN", "gen_ai_latest_experimental/dup")
    sidecar = make_sidecar()
    client = openai.OpenAI(base_url=sidecar.url + "/v1", api_key="k", max_retries=0)
    client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    exposed = httpx.get(sidecar.url + "/metrics").text
    families = set(re.findall(r"^# TYPE (\S+) ", exposed, re.M))
    exprs = [r["expr"] for g in rules_file()["groups"] for r in g["rules"]]
    exprs += [t["expr"] for p in dashboard()["panels"] for t in p["targets"]]
    missing = set()
    for e in exprs:
        for name in _metric_names(e):
            base = re.sub(r"_(bucket|sum|count|total)$", "", name)
            if name not in families and base not in families:
                missing.add(name)
    assert not missing, f"named in rules/panels but not exported: {sorted(missing)}"


def test_dashboard_variables_declared() -> None:
    d = dashboard()
    declared = {v["name"] for v in d["templating"]["list"]}
    used = set(re.findall(r"\$(\w+)", json.dumps(d["panels"])))
    assert used - {"__rate_interval", "__all"} <= declared


def test_dashboard_imports_and_explains_itself() -> None:
    """Import asks for a data source; every panel says what it shows; the panels an alert's
    runbook points at link back to it; the heatmap reads buckets as buckets; rates follow the
    scrape interval ($__rate_interval), not a fixed window."""
    d = dashboard()
    [ds] = d["__inputs"]
    assert ds["type"] == "datasource" and ds["pluginId"] == "prometheus"
    required = {(r["type"], r["id"]) for r in d["__requires"]}
    assert {("grafana", "grafana"), ("datasource", "prometheus")} <= required
    assert {("panel", p["type"]) for p in d["panels"]} <= required
    runbook = (REPO / "dashboards" / "runbook.md").read_text()
    linked = set()
    for p in d["panels"]:
        assert len(p["description"]) > 30, p["title"]
        for link in p["links"]:
            assert link["url"].startswith(RUNBOOK + "#")
            anchor = link["url"].split("#")[1]
            assert any(f"## {a}" in runbook and a.lower() == anchor for a in ALERTS), anchor
            linked.add(anchor)
        for t in p["targets"]:
            # raw counters and buckets over the scrape-aware window; recorded series carry theirs
            assert not re.search(r"(?<!:)\b(rate|increase)\((?!model)[^)]*\[5m\]", t["expr"]), t[
                "expr"
            ]
    # every alert that concerns traffic is reachable from a panel
    assert {a.lower() for a in ALERTS} - linked <= {
        "llmcontextsidecardown",
        "llmcontextsidecarabsent",
    }
    [heat] = [p for p in d["panels"] if p["type"] == "heatmap"]
    assert all(t["format"] == "heatmap" for t in heat["targets"])
    # a bar chart's categories: one row per series, at the range's end
    bars = [p for p in d["panels"] if p["type"] == "barchart"]
    assert bars and all(t["format"] == "table" and t["instant"] for p in bars for t in p["targets"])
    assert all(
        t["format"] == "time_series"
        for p in d["panels"]
        if p is not heat and p not in bars
        for t in p["targets"]
    )
    # every query is scoped to the cluster/namespace/job the viewer picked
    for p in d["panels"]:
        for t in p["targets"]:
            assert 'job=~"$job"' in t["expr"], t["expr"]


def test_rules_keep_cluster_namespace_and_job() -> None:
    """Two releases or two clusters in one Thanos/Mimir stay apart: every aggregation keeps the
    scrape target's labels, and every alert (but absent()) selects them."""
    rules = rules_file()
    for g in rules["groups"]:
        for r in g["rules"]:
            for by in re.findall(r"by \(([^)]*)\)", r["expr"]):
                assert {"cluster", "namespace", "job"} <= {x.strip() for x in by.split(",")}, r
    trim = next(
        r
        for g in rules["groups"]
        for r in g["rules"]
        if r.get("record") == "model_workload:llm_context_trimmed_requests:ratio_rate5m"
    )
    # the denominator counts generation requests only (not /v1/models, not count_tokens)
    found = re.search(r'api=~"([^"]+)"', trim["expr"])
    assert found is not None
    apis = set(found.group(1).split("|"))
    assert "openai_chat" in apis and "anthropic_messages" in apis
    assert not apis & {"models", "anthropic_count_tokens", "gemini_count_tokens", "passthrough"}
