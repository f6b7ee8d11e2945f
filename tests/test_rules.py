"""Dashboards and rules: generated from one source, fresh, checked by promtool, every alert tested
firing and not firing, every alert in the runbook, every metric they name exported."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from dashboards import mixin
from tests.conftest import Running

ROOT = Path(__file__).resolve().parent.parent
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None,
    reason="promtool comes from the Debian package prometheus (.ci/run installs it)",
)

M = 'model="m",workload="w"'
COLD = 'model="m2",workload="w"'


def buckets(
    metric: str, labels: str, les: list[str], hot: str, values: str
) -> list[dict[str, str]]:
    """Cumulative bucket series: every bucket from ``hot`` upward grows by ``values``."""
    out = []
    seen = False
    for le in les:
        seen = seen or le == hot
        out.append(
            {
                "series": f'{metric}_bucket{{{labels},le="{le}"}}',
                "values": values if seen else "0x200",
            }
        )
    return out


UTIL_LES = ["0.5", "0.9", "0.95", "0.98", "1.0", "1.05", "+Inf"]
ERR_LES = ["-0.1", "0.0", "0.01", "0.1", "0.25", "0.5", "+Inf"]

# (alert, input series, eval time, expected label sets: each firing; any other series must not)
CASES: list[tuple[str, list[dict[str, str]], str, list[dict[str, str]]]] = [
    (
        "LLMContextUtilizationNearCeiling",
        buckets("llm_context_ceiling_utilization_ratio", M, UTIL_LES, "0.98", "0+10x200")
        + buckets("llm_context_ceiling_utilization_ratio", COLD, UTIL_LES, "0.5", "0+10x200")
        # a burst: an hour under the ceiling, then 5 minutes near it: pending, not paging
        + [
            {
                "series": f'llm_context_ceiling_utilization_ratio_bucket{{model="m3",workload="w",le="{le}"}}',
                "values": "0+10x60 600x140" if le in ("0.5", "0.9", "0.95") else "0+10x200",
            }
            for le in UTIL_LES
        ],
        "65m",
        [{"model": "m", "workload": "w"}],
    ),
    (
        "LLMContextTrimRateRising",
        [
            {
                "series": f'llm_context_requests_total{{{M},api="openai_chat",outcome="ok"}}',
                "values": "0+10x120",
            },
            {
                "series": f'llm_context_over_ceiling_total{{{M},action="trimmed"}}',
                "values": "0+5x120",
            },
            {
                "series": f'llm_context_requests_total{{{COLD},api="openai_chat",outcome="ok"}}',
                "values": "0+10x120",
            },
            {
                "series": f'llm_context_over_ceiling_total{{{COLD},action="trimmed"}}',
                "values": "0+1x120",
            },
        ],
        "80m",
        [{"model": "m", "workload": "w"}],
    ),
    (
        "LLMContextRequestsRejected",
        [
            {
                "series": f'llm_context_over_ceiling_total{{{M},action="rejected"}}',
                "values": "0+1x60",
            },
            {
                "series": f'llm_context_over_ceiling_total{{{COLD},action="rejected"}}',
                "values": "0x60",
            },
        ],
        "30m",
        [{"model": "m", "workload": "w"}],
    ),
    (
        "LLMContextCeilingStale",
        [
            {
                "series": f'llm_context_ceiling_stale{{{M},reason="system_prompt"}}',
                "values": "1x60",
            },
            {
                "series": f'llm_context_ceiling_stale{{{COLD},reason="system_prompt"}}',
                "values": "0x60",
            },
        ],
        "40m",
        [{"model": "m", "workload": "w", "reason": "system_prompt"}],
    ),
    (
        "LLMContextCeilingOld",
        [
            {"series": f"llm_context_ceiling_age_seconds{{{M}}}", "values": "2600000+60x120"},
            {"series": f"llm_context_ceiling_age_seconds{{{COLD}}}", "values": "1000+60x120"},
        ],
        "70m",
        [{"model": "m", "workload": "w"}],
    ),
    (
        "LLMContextConfigReloadFailing",
        [
            {
                "series": 'llm_context_config_reloads_total{job="context-ceiling",instance="a",source="file",result="failure"}',
                "values": "0 0 0 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1",
            },
            {
                "series": 'llm_context_config_reloads_total{job="context-ceiling",instance="b",source="file",result="failure"}',
                "values": "0x34",
            },
        ],
        "5m",
        [{"job": "context-ceiling", "instance": "a", "source": "file"}],
    ),
    (
        "LLMContextTokenEstimateDrift",
        buckets("llm_context_token_estimate_error_ratio", 'model="m"', ERR_LES, "0.25", "0+10x200")
        + buckets(
            "llm_context_token_estimate_error_ratio", 'model="m2"', ERR_LES, "0.01", "0+10x200"
        ),
        "130m",
        [{"model": "m"}],
    ),
    (
        "LLMContextUpstreamDown",
        [
            {
                "series": 'llm_context_upstream_up{job="context-ceiling",instance="a",upstream="openai"}',
                "values": "0x20",
            },
            {
                "series": 'llm_context_upstream_up{job="context-ceiling",instance="a",upstream="anthropic"}',
                "values": "1x20",
            },
        ],
        "10m",
        [{"job": "context-ceiling", "instance": "a", "upstream": "openai"}],
    ),
    (
        "LLMContextSidecarDown",
        [
            {"series": 'up{job="context-ceiling",instance="a"}', "values": "0x20"},
            {"series": 'up{job="context-ceiling",instance="b"}', "values": "1x20"},
        ],
        "10m",
        [{"job": "context-ceiling", "instance": "a"}],
    ),
]
# times at which nothing may fire (the "not firing" half of each case besides the other series)
QUIET = {
    "LLMContextUtilizationNearCeiling": "10m",
    "LLMContextTrimRateRising": "10m",
    "LLMContextRequestsRejected": "3m",
    "LLMContextCeilingStale": "20m",
    "LLMContextCeilingOld": "30m",
    "LLMContextConfigReloadFailing": "30m",
    "LLMContextTokenEstimateDrift": "30m",
    "LLMContextUpstreamDown": "3m",
    "LLMContextSidecarDown": "3m",
}


def _render(template: str, labels: dict[str, str]) -> str:
    return re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels.get(m.group(1), ""), template)


def promtool_tests(rules_path: Path) -> dict[str, Any]:
    by_name = {a["alert"]: a for a in mixin.alerts()}
    tests = []
    for name, series, at, firing in CASES:
        a = by_name[name]
        exp = [
            {
                "exp_labels": {**f, **a["labels"]},
                "exp_annotations": {k: _render(v, f) for k, v in a["annotations"].items()},
            }
            for f in firing
        ]
        tests.append(
            {
                "interval": "1m",
                "input_series": series,
                "alert_rule_test": [
                    {"eval_time": QUIET[name], "alertname": name, "exp_alerts": []},
                    {"eval_time": at, "alertname": name, "exp_alerts": exp},
                ],
            }
        )
    return {"rule_files": [str(rules_path)], "evaluation_interval": "1m", "tests": tests}


def test_generated_files_are_current() -> None:
    for folder in (ROOT / "dashboards" / "generated", ROOT / "helm" / "context-ceiling" / "files"):
        for name, text in mixin.render().items():
            assert (folder / name).read_text() == text, "run: python -m dashboards.mixin"


def test_every_alert_has_a_case_and_a_runbook_entry() -> None:
    names = [a["alert"] for a in mixin.alerts()]
    assert sorted(names) == sorted(c[0] for c in CASES)
    runbook = (ROOT / "dashboards" / "runbook.md").read_text()
    for a in mixin.alerts():
        anchor = a["annotations"]["runbook_url"].split("#")[1]
        assert f"## {a['alert']}" in runbook and anchor == a["alert"].lower()


@needs_promtool
def test_promtool_check_and_test_rules(tmp_path: Path) -> None:
    rules = ROOT / "dashboards" / "generated" / "rules.yaml"
    r = subprocess.run(
        [PROMTOOL or "promtool", "check", "rules", str(rules)], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stdout + r.stderr
    (tmp_path / "rules_test.yaml").write_text(
        yaml.safe_dump(promtool_tests(rules), sort_keys=False)
    )
    r = subprocess.run(
        [PROMTOOL or "promtool", "test", "rules", str(tmp_path / "rules_test.yaml")],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def _metric_names(expr: str) -> set[str]:
    names = set(re.findall(r"(?<![:\w])(llm_context_[a-z_]+|gen_ai_[a-z_]+)(?![\w:])", expr))
    labels = {
        "gen_ai_operation_name",
        "gen_ai_provider_name",
        "gen_ai_request_model",
        "gen_ai_token_type",
    }
    return names - labels


def test_every_metric_named_exists_on_metrics(sidecar: Running) -> None:
    import openai

    client = openai.OpenAI(base_url=sidecar.url + "/v1", api_key="k", max_retries=0)
    client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    exposed = httpx.get(sidecar.url + "/metrics").text
    families = set(re.findall(r"^# TYPE (\S+) ", exposed, re.M))
    exprs = [r["expr"] for g in mixin.rules_file()["groups"] for r in g["rules"]]
    exprs += [t["expr"] for p in mixin.dashboard()["panels"] for t in p["targets"]]
    missing = set()
    for e in exprs:
        for name in _metric_names(e):
            base = re.sub(r"_(bucket|sum|count|total)$", "", name)
            if name not in families and base not in families:
                missing.add(name)
    assert not missing, f"named in rules/panels but not exported: {sorted(missing)}"


def test_dashboard_variables_declared() -> None:
    d = mixin.dashboard()
    declared = {v["name"] for v in d["templating"]["list"]}
    used = set(re.findall(r"\$(\w+)", json.dumps(d["panels"])))
    assert used - {"__rate_interval", "__all"} <= declared
