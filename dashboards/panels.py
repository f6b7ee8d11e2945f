"""The Grafana dashboard: its panels and the dashboard around them (rendered to
``generated/context-ceiling.json`` and the chart's dashboard ConfigMap)."""

from __future__ import annotations

from typing import Any

from dashboards.config import JOB_SEL, RUNBOOK, SEL, WATCHED_SIGNALS

#: the dashboard's query variables, each with its "All" value
VARIABLES = ("cluster", "namespace", "job", "model", "workload")


def with_all(expr: str, rate_interval: str) -> str:
    """A panel query as Grafana sends it with every variable at "All" (for drawing the panels
    without Grafana, and for testing every query against a live Prometheus)."""
    for v in VARIABLES:
        expr = expr.replace(f"${v}", ".*")
    return expr.replace("$__rate_interval", rate_interval)


#: what an empty panel shows: most often the sidecar is not scraped, or the job variable
#: does not match the scrape job's name
NO_DATA = (
    "No data: is the sidecar scraped (its /metrics), and does the job variable match the "
    "scrape job's name? Some panels fill only once their feature is used."
)


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
    description: str = "",
    runbook: tuple[str, ...] = (),
    target_format: str = "time_series",
) -> dict[str, Any]:
    """One panel; ``runbook``: the alerts it explains, linked from the panel."""
    p: dict[str, Any] = {
        "id": pid,
        "title": title,
        "description": description,
        "type": kind,
        "links": [
            {"title": f"Runbook: {a}", "url": f"{RUNBOOK}#{a.lower()}", "targetBlank": True}
            for a in runbook
        ],
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"x": x, "y": y, "w": w, "h": h},
        "targets": [
            {
                "refId": chr(65 + i),
                "expr": e,
                "legendFormat": leg,
                "format": target_format,
                # a table is one row per series at the range's end (the bar chart's categories)
                **({"instant": True, "range": False} if target_format == "table" else {}),
                "datasource": {"type": "prometheus", "uid": "${datasource}"},
            }
            for i, (e, leg) in enumerate(targets)
        ],
        "fieldConfig": {
            # an empty panel says why it may be empty, instead of a bare "No data"
            "defaults": ({"unit": unit} if unit else {}) | {"noValue": NO_DATA},
            "overrides": [],
        },
    }
    p.update(extra or {})
    return p


def panels() -> list[dict[str, Any]]:
    r = "[$__rate_interval]"
    return [
        _panel(
            1,
            "Utilization percentiles vs ceiling",
            "timeseries",
            [
                (
                    f"model_workload:llm_context_utilization_ratio:p{q}_5m{{{SEL}}}",
                    f"p{q} {{{{model}}}}/{{{{workload}}}}",
                )
                for q in ("50", "90", "99")
            ]
            + [
                (
                    f"llm_context_ceiling_tokens{{{SEL}}} / on (cluster, namespace, job, model) "
                    f"group_left max by (cluster, namespace, job, model) (llm_context_window_tokens{{{JOB_SEL}}})",
                    "ceiling {{model}}/{{workload}}",
                ),
            ],
            0,
            0,
            unit="percentunit",
            description="Input tokens / the model's context window per request (before "
            "trimming), with the measured ceiling as a share of the window: the distance "
            "between the p99 and the ceiling line is the headroom.",
            runbook=("LLMContextUtilizationNearCeiling",),
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
            description="p95 of input tokens / ceiling: 1.0 is the ceiling. The alert fires "
            "when both the 5m and the 1h lines stay above its threshold.",
            runbook=("LLMContextUtilizationNearCeiling",),
        ),
        _panel(
            3,
            "Utilization heatmap",
            "heatmap",
            [
                (
                    f"sum by (le) (increase(llm_context_utilization_ratio_bucket{{{SEL}}}{r}))",
                    "{{le}}",
                ),
            ],
            0,
            8,
            extra={"options": {"calculate": False, "yAxis": {"unit": "percentunit"}}},
            target_format="heatmap",
            description="Requests per utilization bucket over time (the histogram's buckets, "
            "de-accumulated by Grafana: the target's format is heatmap).",
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
            description="Of the generation requests (not model listings or token counts): "
            "trimmed to fit, rejected as too long, or would have been trimmed (observe mode).",
            runbook=("LLMContextTrimRateRising", "LLMContextRequestsRejected"),
        ),
        _panel(
            5,
            "Trimmed tokens by kind",
            "timeseries",
            [
                (
                    f"sum by (kind) (rate(llm_context_trimmed_tokens_total{{{SEL}}}{r}))",
                    "trimmed {{kind}}",
                ),
                (
                    f"sum by (kind) (rate(llm_context_would_trim_tokens_total{{{SEL}}}{r}))",
                    "would trim {{kind}} (observe)",
                ),
            ],
            0,
            16,
            description="Tokens removed per second by what was removed (tool results, "
            "retrieved chunks, history), and what observe mode would remove.",
            runbook=("LLMContextTrimRateRising",),
        ),
        _panel(
            6,
            "Input tokens by component (mean per request)",
            "timeseries",
            [
                (
                    f"sum by (component) (rate(llm_context_input_tokens_sum{{{SEL}}}{r})) / sum by (component) (rate(llm_context_input_tokens_count{{{SEL}}}{r}))",
                    "{{component}}",
                ),
            ],
            12,
            16,
            extra={
                "fieldConfig": {
                    "defaults": {"custom": {"stacking": {"mode": "normal"}}, "noValue": NO_DATA},
                    "overrides": [],
                }
            },
            description="What the input is made of: the component that grows is the one to "
            "cap in the application.",
            runbook=("LLMContextUtilizationNearCeiling",),
        ),
        _panel(
            7,
            "Token estimate error (median, 1h)",
            "timeseries",
            [
                (
                    f'model:llm_context_token_estimate_error_ratio:p50_1h{{{JOB_SEL}, model=~"$model"}}',
                    "{{model}}",
                ),
            ],
            0,
            24,
            unit="percentunit",
            description="(estimated - provider-reported input tokens) / reported: how far the "
            "sidecar's count is from the provider's own.",
            runbook=("LLMContextTokenEstimateDrift",),
        ),
        _panel(
            8,
            "Ceiling version and age",
            "stat",
            [
                (f"max(llm_context_config_version{{{JOB_SEL}}})", "version"),
                (
                    f"max by (model, workload) (llm_context_ceiling_age_seconds{{{SEL}}})",
                    "age {{model}}/{{workload}}",
                ),
            ],
            12,
            24,
            w=6,
            unit="s",
            description="The running ceilings document's version, and how long ago each "
            "ceiling was derived.",
            runbook=("LLMContextCeilingOld",),
        ),
        _panel(
            9,
            "Ceiling reloads by result",
            "timeseries",
            [
                (
                    f"sum by (source, result) (increase(llm_context_config_reloads_total{{{JOB_SEL}}}[1h]))",
                    "{{source}} {{result}}",
                ),
                (
                    f"max(llm_context_ceilings_unused_entries{{{JOB_SEL}}})",
                    "entries enforcing nothing",
                ),
            ],
            18,
            24,
            w=6,
            description="Ceilings documents applied or rejected in the last hour, by where they "
            "came from (file, admin API, signal), and the running document's entries that "
            "enforce nothing (no model label or workload matches them: a typo in a push).",
            runbook=("LLMContextConfigReloadFailing",),
        ),
        _panel(
            10,
            "Stale ceilings by reason",
            "table",
            [
                (
                    f"max by (model, workload, reason) (llm_context_ceiling_stale{{{SEL}}}) == 1",
                    "{{reason}}",
                ),
            ],
            0,
            32,
            extra={"options": {"showHeader": True}},
            description="Model/workload pairs whose live traffic no longer looks like what "
            "their ceiling was measured on, and those with traffic but no ceiling (no_ceiling).",
            runbook=("LLMContextCeilingStale", "LLMContextNoCeiling"),
        ),
        _panel(
            11,
            "Upstream latency p50 / p99",
            "timeseries",
            [
                (
                    f'histogram_quantile({q}, sum by (model, le) (rate(llm_context_upstream_duration_seconds_bucket{{{JOB_SEL}, model=~"$model"}}{r})))',
                    f"{name} {{{{model}}}}",
                )
                for q, name in (("0.5", "p50"), ("0.99", "p99"))
            ],
            12,
            32,
            unit="s",
            description="From forwarding to the last byte of the provider's response.",
            runbook=("LLMContextUpstreamDown",),
        ),
        _panel(
            12,
            "Requests by outcome",
            "timeseries",
            [
                (
                    f"sum by (outcome) (rate(llm_context_requests_total{{{SEL}}}{r}))",
                    "{{outcome}}",
                ),
            ],
            0,
            40,
            description="Every proxied request by outcome (ok, upstream errors, rejected, "
            "timeouts, truncated streams...).",
            runbook=("LLMContextRequestsRejected",),
        ),
        _panel(
            13,
            "Token usage (GenAI semconv)",
            "timeseries",
            [
                (
                    # whichever names the sidecar emits (OTEL_SEMCONV_STABILITY_OPT_IN): the
                    # earlier histogram by token type, else the current usage counters; with
                    # both emitted, ``or`` keeps the first and counts nothing twice
                    f'sum by (gen_ai_token_type) (rate(gen_ai_client_token_usage_sum{{{JOB_SEL}, model=~"$model"}}{r}))\n'
                    + "\n".join(
                        f"or label_replace(sum(rate(gen_ai_client_inference_usage_{kind}_total"
                        f'{{{JOB_SEL}, model=~"$model"}}{r})), "gen_ai_token_type", "{kind.split("_")[0]}", "", "")'
                        for kind in ("input_tokens", "output_tokens")
                    ),
                    "{{gen_ai_token_type}}",
                ),
            ],
            12,
            40,
            description="Tokens per second as the provider reported them (input, output), "
            "from the OpenTelemetry GenAI client metrics: gen_ai.client.token.usage, or "
            "gen_ai.client.inference.usage.* with OTEL_SEMCONV_STABILITY_OPT_IN="
            "gen_ai_latest_experimental.",
        ),
        _panel(
            14,
            "Answer signals by fill bucket (1h)",
            "barchart",
            [
                (
                    f'sum by (fill, signal) (rate(llm_context_answer_signals_total{{{SEL}, signal=~"{WATCHED_SIGNALS}"}}[1h]))\n'
                    f"/ on (fill) group_left sum by (fill) (rate(llm_context_answers_total{{{SEL}}}[1h]))",
                    "{{signal}}",
                ),
                (
                    "label_replace(sum by (fill) (rate(llm_context_answers_total{"
                    + SEL
                    + ', side="above"}[1h]))\n'
                    f"/ on (fill) group_left sum by (fill) (rate(llm_context_answers_total{{{SEL}}}[1h])), "
                    '"signal", "above the ceiling", "", "")',
                    "{{signal}}",
                ),
            ],
            0,
            48,
            unit="percentunit",
            target_format="table",
            extra={
                "transformations": [
                    {"id": "merge", "options": {}},
                    {
                        "id": "groupingToMatrix",
                        "options": {
                            "columnField": "signal",
                            "rowField": "fill",
                            "valueField": "Value",
                        },
                    },
                ],
                "options": {"xField": "fill\\signal", "stacking": "none", "showValue": "never"},
            },
            description="Each answer signal's share of the answers in each fill bucket (input "
            "tokens / window), over the last hour: the live counterpart of the sweep's curve, "
            "whose levels are named by the same buckets. 'above the ceiling' is the share of each "
            "bucket's answers whose input was above the running ceiling: where it turns to 1 is "
            "the ceiling. A rate, not a judgement of any one answer.",
            runbook=("LLMContextAnswerSignalAboveCeiling",),
        ),
        _panel(
            15,
            "Answer signals above vs below the ceiling (1h)",
            "timeseries",
            [
                (
                    f'model_workload_side_signal:llm_context_answer_signals:ratio_rate1h{{{SEL}, side!="none", signal=~"{WATCHED_SIGNALS}"}}',
                    "{{signal}} {{side}} {{model}}/{{workload}}",
                ),
            ],
            12,
            48,
            unit="percentunit",
            description="What the opt-in alert compares: each failure signal's share of the "
            "answers whose input was above the running ceiling, and of those below it.",
            runbook=("LLMContextAnswerSignalAboveCeiling",),
        ),
        _panel(
            16,
            "Context above the ceiling, $ per day",
            "timeseries",
            [
                (
                    f'sum by (model, workload) (rate(llm_context_input_cost_usd_total{{{SEL}, part="above"}}{r})) * 86400',
                    "above the ceiling {{model}}/{{workload}}",
                ),
                (
                    f'sum by (model, workload) (rate(llm_context_input_cost_usd_total{{{SEL}, part="within"}}{r})) * 86400',
                    "within the ceiling {{model}}/{{workload}}",
                ),
                (
                    f"sum by (model, workload, action) (rate(llm_context_trim_savings_usd_total{{{SEL}}}{r})) * 86400",
                    "{{action}} {{model}}/{{workload}}",
                ),
            ],
            0,
            56,
            w=24,
            unit="currencyUSD",
            description="The price of the input per day at the current rate (list prices from "
            "genai-prices, or the model's configured price): the part above the running ceiling "
            "and the part within it, and what trimming removed (trimmed, enforce mode) or would "
            "have removed (would_trim, observe mode).",
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

    kinds = sorted({p["type"] for p in panels()})
    return {
        # what Grafana's import dialog asks for (Dashboards > Import): the Prometheus data source
        "__inputs": [
            {
                "name": "DS_PROMETHEUS",
                "label": "Prometheus",
                "description": "The Prometheus (or Thanos/Mimir) that scrapes the sidecars",
                "type": "datasource",
                "pluginId": "prometheus",
                "pluginName": "Prometheus",
            }
        ],
        "__requires": [
            {"type": "grafana", "id": "grafana", "name": "Grafana", "version": "10.0.0"},
            {"type": "datasource", "id": "prometheus", "name": "Prometheus", "version": "1.0.0"},
        ]
        + [{"type": "panel", "id": k, "name": k, "version": ""} for k in kinds],
        "uid": "context-ceiling",
        "title": "context-ceiling: context utilization and ceilings",
        "description": "Context utilization per model and workload against the measured "
        "ceiling, trimming, staleness and the sidecar's health.",
        "tags": ["llm", "context-ceiling"],
        "timezone": "browser",
        "schemaVersion": 39,
        "version": 1,
        "time": {"from": "now-6h", "to": "now"},
        "refresh": "1m",
        "links": [
            {
                "title": "Runbook",
                "type": "link",
                "url": RUNBOOK,
                "targetBlank": True,
                "icon": "doc",
            }
        ],
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Data source",
                    "type": "datasource",
                    "query": "prometheus",
                    # the imported data source; provisioned (no import): the default Prometheus
                    "current": {"text": "${DS_PROMETHEUS}", "value": "${DS_PROMETHEUS}"},
                    "hide": 0,
                },
                var("cluster", "label_values(llm_context_requests_total, cluster)"),
                var(
                    "namespace",
                    'label_values(llm_context_requests_total{cluster=~"$cluster"}, namespace)',
                ),
                var(
                    "job",
                    'label_values(llm_context_requests_total{cluster=~"$cluster", namespace=~"$namespace"}, job)',
                ),
                var(
                    "model",
                    f"label_values(llm_context_requests_total{{{JOB_SEL}}}, model)",
                ),
                var(
                    "workload",
                    f'label_values(llm_context_requests_total{{{JOB_SEL}, model=~"$model"}}, workload)',
                ),
            ]
        },
        "panels": panels(),
    }
