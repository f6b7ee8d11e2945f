"""The Prometheus recording rules and alerts (rendered to ``generated/rules.yaml`` and the chart's
PrometheusRule); each alert has a runbook entry and a promtool test (``rule_tests.py``)."""

from __future__ import annotations

from typing import Any

from dashboards.config import CONFIG, MW


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
