"""A ``promtool test rules`` case per alert: the series that must make it fire (and the ones
that must not, such as a short burst), rendered to ``generated/rules_test.yaml`` so plain
``promtool test rules dashboards/generated/rules_test.yaml`` runs them."""

from __future__ import annotations

import re
from typing import Any

from dashboards.rules import alerts

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


def promtool_tests(rules_file: str = "rules.yaml") -> dict[str, Any]:
    """The ``promtool test rules`` file: each alert quiet early on, then firing for exactly the
    series it should (``rules_file`` is relative to the test file, as promtool reads it)."""
    by_name = {a["alert"]: a for a in alerts()}
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
    return {"rule_files": [rules_file], "evaluation_interval": "1m", "tests": tests}
