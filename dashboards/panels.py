"""The Grafana dashboard: its panels and the dashboard around them (rendered to
``generated/context-ceiling.json`` and the chart's dashboard ConfigMap)."""

from __future__ import annotations

from typing import Any

from dashboards.config import SEL


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
