"""One source for the Grafana dashboard, the recording rules and the alerts (the mixin pattern).

``python -m dashboards.mixin`` writes ``dashboards/generated/context-ceiling.json`` and
``dashboards/generated/rules.yaml``; both are committed and a test fails when they are stale.
Every alert links its entry in ``dashboards/runbook.md`` and has a ``promtool test rules`` case in
``dashboards/tests/rules_test.yaml``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
GENERATED = HERE / "generated"

CONFIG = {
    "selector": 'job=~"context-ceiling.*"',
    "runbook": "https://github.com/context-ceiling/context-ceiling/blob/main/dashboards/runbook.md",
    "near_ceiling": 0.9,  # p95 of input / ceiling that pages
    "trim_ratio": 0.2,  # share of requests trimmed
    "ceiling_max_age_s": 30 * 86400,
    "estimate_error": 0.1,  # |median (estimate - reported) / reported|
}
# Annotations template only labels, never $value: the numbers are on the dashboard, and the
# promtool tests can then state exactly what each alert says.

MW = "model, workload"


def recording_rules() -> list[dict[str, Any]]:
    rules = []
    for q in ("50", "90", "99"):
        rules.append(
            {
                "record": f"model_workload:llm_context_utilization_ratio:p{q}_5m",
                "expr": f"histogram_quantile(0.{q}, sum by ({MW}, le) (rate(llm_context_utilization_ratio_bucket[5m])))",
            }
        )
    for w in ("5m", "1h"):
        rules.append(
            {
                "record": f"model_workload:llm_context_ceiling_utilization_ratio:p95_{w}",
                "expr": f"histogram_quantile(0.95, sum by ({MW}, le) (rate(llm_context_ceiling_utilization_ratio_bucket[{w}])))",
            }
        )
        rules.append(
            {
                "record": f"model_workload:llm_context_trimmed_requests:ratio_rate{w}",
                "expr": (
                    f'sum by ({MW}) (rate(llm_context_over_ceiling_total{{action="trimmed"}}[{w}]))'
                    f" / sum by ({MW}) (rate(llm_context_requests_total[{w}]))"
                ),
            }
        )
    rules += [
        {
            "record": "model_workload_action:llm_context_over_ceiling:rate5m",
            "expr": f"sum by ({MW}, action) (rate(llm_context_over_ceiling_total[5m]))",
        },
        {
            "record": "model_workload:llm_context_requests:rate5m",
            "expr": f"sum by ({MW}) (rate(llm_context_requests_total[5m]))",
        },
        {
            "record": "model:llm_context_token_estimate_error_ratio:p50_1h",
            "expr": "histogram_quantile(0.5, sum by (model, le) (rate(llm_context_token_estimate_error_ratio_bucket[1h])))",
        },
    ]
    return rules


def alerts() -> list[dict[str, Any]]:
    c = CONFIG

    def alert(
        name: str, expr: str, for_: str, severity: str, summary: str, description: str
    ) -> dict[str, Any]:
        return {
            "alert": name,
            "expr": expr,
            "for": for_,
            "labels": {"severity": severity},
            "annotations": {
                "summary": summary,
                "description": description,
                "runbook_url": f"{c['runbook']}#{name.lower()}",
            },
        }

    return [
        alert(
            "LLMContextUtilizationNearCeiling",
            f"model_workload:llm_context_ceiling_utilization_ratio:p95_1h > {c['near_ceiling']}\n"
            f"and model_workload:llm_context_ceiling_utilization_ratio:p95_5m > {c['near_ceiling']}",
            "15m",
            "warning",
            "Traffic for {{ $labels.model }}/{{ $labels.workload }} runs close to its context ceiling",
            "p95 of input tokens / ceiling has been above the threshold over the last hour and the last 5 minutes.",
        ),
        alert(
            "LLMContextTrimRateRising",
            f"model_workload:llm_context_trimmed_requests:ratio_rate1h > {c['trim_ratio']}\n"
            f"and model_workload:llm_context_trimmed_requests:ratio_rate5m > {c['trim_ratio']}",
            "15m",
            "warning",
            "Many requests to {{ $labels.model }}/{{ $labels.workload }} are trimmed",
            "More than the threshold share of requests were trimmed to fit the ceiling, over 1h and 5m.",
        ),
        alert(
            "LLMContextRequestsRejected",
            'sum by (model, workload) (rate(llm_context_over_ceiling_total{action="rejected"}[10m])) > 0',
            "5m",
            "critical",
            "Requests to {{ $labels.model }}/{{ $labels.workload }} are rejected as too long",
            "Requests that could not be trimmed under the ceiling are being rejected with a context-length error.",
        ),
        alert(
            "LLMContextCeilingStale",
            "max by (model, workload, reason) (llm_context_ceiling_stale) == 1",
            "30m",
            "warning",
            "The ceiling of {{ $labels.model }}/{{ $labels.workload }} is stale ({{ $labels.reason }})",
            "Live traffic no longer looks like what the ceiling was measured on: re-sweep.",
        ),
        alert(
            "LLMContextCeilingOld",
            f"max by (model, workload) (llm_context_ceiling_age_seconds) > {c['ceiling_max_age_s']}",
            "1h",
            "info",
            "The ceiling of {{ $labels.model }}/{{ $labels.workload }} is old",
            "The running ceiling was derived longer ago than the configured maximum age: re-sweep.",
        ),
        alert(
            "LLMContextConfigReloadFailing",
            'sum by (job, instance, source) (increase(llm_context_config_reloads_total{result="failure"}[15m])) > 0',
            "0m",
            "warning",
            "A ceilings reload failed on {{ $labels.instance }}",
            "A ceilings document from {{ $labels.source }} was rejected; the previous ceilings stay in force.",
        ),
        alert(
            "LLMContextTokenEstimateDrift",
            f"abs(model:llm_context_token_estimate_error_ratio:p50_1h) > {c['estimate_error']}",
            "1h",
            "warning",
            "Token estimates for {{ $labels.model }} drift from the provider's counts",
            "The median estimate error exceeds the threshold: refit the calibration or fix the tokenizer.",
        ),
        alert(
            "LLMContextUpstreamDown",
            "max by (job, instance, upstream) (llm_context_upstream_up) == 0",
            "5m",
            "critical",
            "The {{ $labels.upstream }} upstream is unreachable from {{ $labels.instance }}",
            "The sidecar's background probe cannot open a connection to the provider: requests get "
            "a 502 each (the replica stays ready, so nothing else hides the outage).",
        ),
        alert(
            "LLMContextSidecarDown",
            f"up{{{c['selector']}}} == 0",
            "5m",
            "critical",
            "The context-ceiling sidecar {{ $labels.instance }} is down",
            "Prometheus cannot scrape the sidecar: requests through it fail or bypass measurement.",
        ),
    ]


def rules_file() -> dict[str, Any]:
    return {
        "groups": [
            {"name": "context-ceiling.rules", "interval": "30s", "rules": recording_rules()},
            {"name": "context-ceiling.alerts", "rules": alerts()},
        ]
    }


def _panel(
    pid: int,
    title: str,
    kind: str,
    targets: list[tuple[str, str]],
    x: int,
    y: int,
    w: int = 12,
    h: int = 8,
    unit: str | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    p: dict[str, Any] = {
        "id": pid,
        "title": title,
        "type": kind,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"x": x, "y": y, "w": w, "h": h},
        "targets": [
            {
                "refId": chr(65 + i),
                "expr": e,
                "legendFormat": leg,
                "datasource": {"type": "prometheus", "uid": "${datasource}"},
            }
            for i, (e, leg) in enumerate(targets)
        ],
        "fieldConfig": {"defaults": {"unit": unit} if unit else {}, "overrides": []},
    }
    p.update(extra or {})
    return p


SEL = 'model=~"$model", workload=~"$workload"'


def panels() -> list[dict[str, Any]]:
    return [
        _panel(
            1,
            "Utilization percentiles vs ceiling",
            "timeseries",
            [
                (
                    f"model_workload:llm_context_utilization_ratio:p50_5m{{{SEL}}}",
                    "p50 {{model}}/{{workload}}",
                ),
                (
                    f"model_workload:llm_context_utilization_ratio:p90_5m{{{SEL}}}",
                    "p90 {{model}}/{{workload}}",
                ),
                (
                    f"model_workload:llm_context_utilization_ratio:p99_5m{{{SEL}}}",
                    "p99 {{model}}/{{workload}}",
                ),
                (
                    f"llm_context_ceiling_tokens{{{SEL}}} / on (model) group_left llm_context_window_tokens",
                    "ceiling {{model}}/{{workload}}",
                ),
            ],
            0,
            0,
            unit="percentunit",
        ),
        _panel(
            2,
            "Input / ceiling, p95 (drift toward the ceiling)",
            "timeseries",
            [
                (
                    f"model_workload:llm_context_ceiling_utilization_ratio:p95_5m{{{SEL}}}",
                    "5m {{model}}/{{workload}}",
                ),
                (
                    f"model_workload:llm_context_ceiling_utilization_ratio:p95_1h{{{SEL}}}",
                    "1h {{model}}/{{workload}}",
                ),
            ],
            12,
            0,
            unit="percentunit",
        ),
        _panel(
            3,
            "Utilization heatmap",
            "heatmap",
            [
                (
                    f"sum by (le) (increase(llm_context_utilization_ratio_bucket{{{SEL}}}[$__rate_interval]))",
                    "{{le}}",
                ),
            ],
            0,
            8,
            extra={"options": {"calculate": False, "yAxis": {"unit": "percentunit"}}},
        ),
        _panel(
            4,
            "Share of requests over the ceiling, by action",
            "timeseries",
            [
                (
                    f"sum by (action) (model_workload_action:llm_context_over_ceiling:rate5m{{{SEL}}}) / scalar(sum(model_workload:llm_context_requests:rate5m{{{SEL}}}))",
                    "{{action}}",
                ),
            ],
            12,
            8,
            unit="percentunit",
        ),
        _panel(
            5,
            "Trimmed tokens by kind",
            "timeseries",
            [
                (
                    f"sum by (kind) (rate(llm_context_trimmed_tokens_total{{{SEL}}}[5m]))",
                    "trimmed {{kind}}",
                ),
                (
                    f"sum by (kind) (rate(llm_context_would_trim_tokens_total{{{SEL}}}[5m]))",
                    "would trim {{kind}} (observe)",
                ),
            ],
            0,
            16,
        ),
        _panel(
            6,
            "Input tokens by component (mean per request)",
            "timeseries",
            [
                (
                    f"sum by (component) (rate(llm_context_input_tokens_sum{{{SEL}}}[5m])) / sum by (component) (rate(llm_context_input_tokens_count{{{SEL}}}[5m]))",
                    "{{component}}",
                ),
            ],
            12,
            16,
            extra={
                "fieldConfig": {
                    "defaults": {"custom": {"stacking": {"mode": "normal"}}},
                    "overrides": [],
                }
            },
        ),
        _panel(
            7,
            "Token estimate error (median, 1h)",
            "timeseries",
            [
                (
                    'model:llm_context_token_estimate_error_ratio:p50_1h{model=~"$model"}',
                    "{{model}}",
                ),
            ],
            0,
            24,
            unit="percentunit",
        ),
        _panel(
            8,
            "Ceiling version and age",
            "stat",
            [
                ("max(llm_context_config_version)", "version"),
                (
                    f"max by (model, workload) (llm_context_ceiling_age_seconds{{{SEL}}})",
                    "age {{model}}/{{workload}}",
                ),
            ],
            12,
            24,
            w=6,
            unit="s",
        ),
        _panel(
            9,
            "Ceiling reloads by result",
            "timeseries",
            [
                (
                    "sum by (source, result) (increase(llm_context_config_reloads_total[1h]))",
                    "{{source}} {{result}}",
                ),
            ],
            18,
            24,
            w=6,
        ),
        _panel(
            10,
            "Stale ceilings by reason",
            "table",
            [
                (
                    f"max by (model, workload, reason) (llm_context_ceiling_stale{{{SEL}}})",
                    "{{reason}}",
                ),
            ],
            0,
            32,
            extra={"options": {"showHeader": True}},
        ),
        _panel(
            11,
            "Upstream latency p50 / p99",
            "timeseries",
            [
                (
                    'histogram_quantile(0.5, sum by (model, le) (rate(llm_context_upstream_duration_seconds_bucket{model=~"$model"}[5m])))',
                    "p50 {{model}}",
                ),
                (
                    'histogram_quantile(0.99, sum by (model, le) (rate(llm_context_upstream_duration_seconds_bucket{model=~"$model"}[5m])))',
                    "p99 {{model}}",
                ),
            ],
            12,
            32,
            unit="s",
        ),
        _panel(
            12,
            "Requests by outcome",
            "timeseries",
            [
                (
                    f"sum by (outcome) (rate(llm_context_requests_total{{{SEL}}}[5m]))",
                    "{{outcome}}",
                ),
            ],
            0,
            40,
        ),
        _panel(
            13,
            "Token usage (GenAI semconv)",
            "timeseries",
            [
                (
                    'sum by (gen_ai_token_type) (rate(gen_ai_client_token_usage_sum{gen_ai_request_model=~"$model"}[5m]))',
                    "{{gen_ai_token_type}}",
                ),
            ],
            12,
            40,
        ),
    ]


def dashboard() -> dict[str, Any]:
    def var(name: str, query: str) -> dict[str, Any]:
        return {
            "name": name,
            "label": name,
            "type": "query",
            "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "query": {"query": query, "refId": name},
            "definition": query,
            "includeAll": True,
            "multi": True,
            "allValue": ".*",
            "current": {"text": "All", "value": "$__all"},
            "refresh": 2,
            "sort": 1,
        }

    return {
        "uid": "context-ceiling",
        "title": "context-ceiling: context utilization and ceilings",
        "tags": ["llm", "context-ceiling"],
        "timezone": "browser",
        "schemaVersion": 39,
        "version": 1,
        "time": {"from": "now-6h", "to": "now"},
        "refresh": "1m",
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "datasource",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {},
                    "hide": 0,
                },
                var("model", "label_values(llm_context_requests_total, model)"),
                var(
                    "workload",
                    'label_values(llm_context_requests_total{model=~"$model"}, workload)',
                ),
            ]
        },
        "panels": panels(),
    }


def render() -> dict[str, str]:
    return {
        "context-ceiling.json": json.dumps(dashboard(), indent=2) + "\n",
        "rules.yaml": "# generated by `python -m dashboards.mixin`: edit dashboards/mixin.py, not this file\n"
        + yaml.safe_dump(rules_file(), sort_keys=False, width=120),
    }


#: The Helm chart packages the same files (a chart cannot read outside its directory).
CHART_FILES = HERE.parent / "helm" / "context-ceiling" / "files"


def main() -> None:
    for folder in (GENERATED, CHART_FILES):
        folder.mkdir(parents=True, exist_ok=True)
        for name, text in render().items():
            (folder / name).write_text(text)


if __name__ == "__main__":
    main()
