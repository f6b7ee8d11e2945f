"""A ``promtool test rules`` case per alert: the series that must make it fire (and the ones
that must not, such as a short burst, one over-long request, another scrape job), rendered to
``generated/rules_test.yaml`` so plain ``promtool test rules rules_test.yaml`` runs them.

The same cases run against the chart's rendered PrometheusRule with the labels the chart's own
ServiceMonitor gives its series (``tests/deploy/test_helm.py``): :func:`promtool_tests` takes the scrape
target's labels and the rules' selector."""

from __future__ import annotations

import re
from typing import Any

from dashboards.config import SELECTOR
from dashboards.rules import alerts

#: the labels of one scrape of the standalone rules' default target: what `helm install ceiling`
#: gives its series (job = the Service's name), in a cluster labelled by the Prometheus
#: a scrape job named as a user might (no "context-ceiling" in it): the standalone rules take it
STANDALONE_TARGET = {"cluster": "c1", "namespace": "llm", "job": "ceiling"}
#: another scrape job in the same Prometheus: none of its series may fire an alert
FOREIGN = 'cluster="c1",namespace="llm",job="billing-api"'
UTIL_LES = ["0.5", "0.9", "0.95", "0.98", "1.0", "1.05", "+Inf"]
ERR_LES = ["-0.1", "0.0", "0.01", "0.1", "0.25", "0.5", "+Inf"]
GEN = 'api="openai_chat"'

# what must be quiet early on (the "not firing" half of each case besides the other series)
QUIET = {
    "LLMContextUtilizationNearCeiling": "10m",
    "LLMContextTrimRateRising": "10m",
    "LLMContextRequestsRejected": "3m",
    "LLMContextCeilingStale": "20m",
    "LLMContextNoCeiling": "40m",
    "LLMContextCeilingOld": "30m",
    "LLMContextConfigReloadFailing": "30m",
    "LLMContextTokenEstimateDrift": "30m",
    "LLMContextAnswerSignalAboveCeiling": "20m",
    "LLMContextUpstreamDown": "3m",
    "LLMContextSidecarDown": "3m",
    "LLMContextSidecarAbsent": "10m",
}

Case = tuple[str, list[dict[str, str]], str, list[dict[str, str]]]


def _labels(d: dict[str, str]) -> str:
    return ",".join(f'{k}="{v}"' for k, v in d.items())


def _buckets(
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


def cases(target: dict[str, str], absent_labels: dict[str, str]) -> list[Case]:
    """(alert, input series, eval time, the label sets that fire then: exactly these).

    ``target``: the labels the scrape gives every series of the sidecar; ``absent_labels``: the
    labels ``absent()`` of the rules' selector carries (its equality matchers)."""
    t = _labels(target)
    m_ = {**target, "model": "m", "workload": "w"}
    M = _labels(m_)
    COLD = _labels({**target, "model": "m2", "workload": "w"})
    ONCE = _labels({**target, "model": "m3", "workload": "w"})

    def inst(i: str) -> dict[str, str]:
        return {**target, "instance": i}

    return [
        (
            "LLMContextUtilizationNearCeiling",
            _buckets("llm_context_ceiling_utilization_ratio", M, UTIL_LES, "0.98", "0+10x200")
            + _buckets("llm_context_ceiling_utilization_ratio", COLD, UTIL_LES, "0.5", "0+10x200")
            # the same traffic from another job: not ours
            + _buckets(
                "llm_context_ceiling_utilization_ratio",
                FOREIGN + ',model="m",workload="w"',
                UTIL_LES,
                "0.98",
                "0+10x200",
            )
            # a burst: an hour under the ceiling, then 5 minutes near it: pending, not paging
            + [
                {
                    "series": f'llm_context_ceiling_utilization_ratio_bucket{{{ONCE},le="{le}"}}',
                    "values": "0+10x60 600x140" if le in ("0.5", "0.9", "0.95") else "0+10x200",
                }
                for le in UTIL_LES
            ],
            "65m",
            [m_],
        ),
        (
            "LLMContextTrimRateRising",
            [
                {
                    "series": f'llm_context_requests_total{{{M},{GEN},outcome="ok"}}',
                    "values": "0+10x120",
                },
                # token counts and model listings are not requests that could be trimmed: they
                # must not dilute the share
                {
                    "series": f'llm_context_requests_total{{{M},api="anthropic_count_tokens",outcome="ok"}}',
                    "values": "0+100x120",
                },
                {
                    "series": f'llm_context_requests_total{{{M},api="models",outcome="ok"}}',
                    "values": "0+100x120",
                },
                {
                    "series": f'llm_context_over_ceiling_total{{{M},action="trimmed"}}',
                    "values": "0+5x120",
                },
                {
                    "series": f'llm_context_requests_total{{{COLD},{GEN},outcome="ok"}}',
                    "values": "0+10x120",
                },
                {
                    "series": f'llm_context_over_ceiling_total{{{COLD},action="trimmed"}}',
                    "values": "0+1x120",
                },
            ],
            "80m",
            [m_],
        ),
        (
            "LLMContextRequestsRejected",
            [
                {
                    "series": f'llm_context_requests_total{{{M},{GEN},outcome="ok"}}',
                    "values": "0+10x60",
                },
                {
                    "series": f'llm_context_over_ceiling_total{{{M},action="rejected"}}',
                    "values": "0+1x60",
                },
                {
                    "series": f'llm_context_requests_total{{{COLD},{GEN},outcome="ok"}}',
                    "values": "0+10x60",
                },
                {
                    "series": f'llm_context_over_ceiling_total{{{COLD},action="rejected"}}',
                    "values": "0x60",
                },
                # one over-long request at minute 5: pending for the 10 minutes it is in the
                # window, never firing
                {
                    "series": f'llm_context_requests_total{{{ONCE},{GEN},outcome="ok"}}',
                    "values": "0+1x60",
                },
                {
                    "series": f'llm_context_over_ceiling_total{{{ONCE},action="rejected"}}',
                    "values": "0x5 1x55",
                },
            ],
            "30m",
            [m_],
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
                # no ceiling is its own, info-level signal, not staleness
                {
                    "series": f'llm_context_ceiling_stale{{{COLD},reason="no_ceiling"}}',
                    "values": "1x60",
                },
            ],
            "40m",
            [{**m_, "reason": "system_prompt"}],
        ),
        (
            "LLMContextNoCeiling",
            [
                {
                    "series": f'llm_context_ceiling_stale{{{M},reason="no_ceiling"}}',
                    "values": "1x90",
                },
                {
                    "series": f'llm_context_ceiling_stale{{{COLD},reason="no_ceiling"}}',
                    "values": "0x90",
                },
                # unregistered models (the catch-all `other`) have no ceiling by definition
                {
                    "series": f'llm_context_ceiling_stale{{{t},model="other",workload="w",reason="no_ceiling"}}',
                    "values": "1x90",
                },
            ],
            "70m",
            [m_],
        ),
        (
            "LLMContextCeilingOld",
            [
                {"series": f"llm_context_ceiling_age_seconds{{{M}}}", "values": "2600000+60x120"},
                {"series": f"llm_context_ceiling_age_seconds{{{COLD}}}", "values": "1000+60x120"},
            ],
            "70m",
            [m_],
        ),
        (
            "LLMContextConfigReloadFailing",
            [
                {
                    "series": f'llm_context_config_reloads_total{{{_labels(inst("a"))},source="file",result="failure"}}',
                    "values": "0 0 0 " + " ".join(["1"] * 32),
                },
                {
                    "series": f'llm_context_config_reloads_total{{{_labels(inst("b"))},source="file",result="failure"}}',
                    "values": "0x34",
                },
            ],
            "5m",
            [{**inst("a"), "source": "file"}],
        ),
        (
            "LLMContextTokenEstimateDrift",
            _buckets(
                "llm_context_token_estimate_error_ratio",
                _labels({**target, "model": "m"}),
                ERR_LES,
                "0.25",
                "0+10x200",
            )
            + _buckets(
                "llm_context_token_estimate_error_ratio",
                _labels({**target, "model": "m2"}),
                ERR_LES,
                "0.01",
                "0+10x200",
            ),
            "130m",
            [{**target, "model": "m"}],
        ),
        (
            "LLMContextAnswerSignalAboveCeiling",
            [
                # m/w: 300 answers an hour above the ceiling, 600 below
                {
                    "series": f'llm_context_answers_total{{{M},fill="0.9-1.0",side="above"}}',
                    "values": "0+5x100",
                },
                {
                    "series": f'llm_context_answers_total{{{M},fill="0.1-0.2",side="below"}}',
                    "values": "0+10x100",
                },
                # truncated: 20% above, 2% below (> 2 x)
                {
                    "series": f'llm_context_answer_signals_total{{{M},fill="0.9-1.0",side="above",signal="truncated"}}',
                    "values": "0+1x100",
                },
                {
                    "series": f'llm_context_answer_signals_total{{{M},fill="0.1-0.2",side="below",signal="truncated"}}',
                    "values": "0+0.2x100",
                },
                # repetition: 10% above and never below (no series there at all)
                {
                    "series": f'llm_context_answer_signals_total{{{M},fill="0.9-1.0",side="above",signal="repetition"}}',
                    "values": "0+0.5x100",
                },
                # empty: 3% above, 2% below: under the factor
                {
                    "series": f'llm_context_answer_signals_total{{{M},fill="0.9-1.0",side="above",signal="empty"}}',
                    "values": "0+0.15x100",
                },
                {
                    "series": f'llm_context_answer_signals_total{{{M},fill="0.1-0.2",side="below",signal="empty"}}',
                    "values": "0+0.2x100",
                },
                # a normal stop is not a failure, however its rates differ
                {
                    "series": f'llm_context_answer_signals_total{{{M},fill="0.9-1.0",side="above",signal="stop"}}',
                    "values": "0+4x100",
                },
                # m2/w: every answer above truncated, but only 60 answers an hour above
                {
                    "series": f'llm_context_answers_total{{{COLD},fill="0.9-1.0",side="above"}}',
                    "values": "0+1x100",
                },
                {
                    "series": f'llm_context_answers_total{{{COLD},fill="0.1-0.2",side="below"}}',
                    "values": "0+10x100",
                },
                {
                    "series": f'llm_context_answer_signals_total{{{COLD},fill="0.9-1.0",side="above",signal="truncated"}}',
                    "values": "0+1x100",
                },
                # the same traffic from another job: not ours
                {
                    "series": f'llm_context_answers_total{{{FOREIGN},model="m",workload="w",fill="0.9-1.0",side="above"}}',
                    "values": "0+5x100",
                },
                {
                    "series": f'llm_context_answers_total{{{FOREIGN},model="m",workload="w",fill="0.1-0.2",side="below"}}',
                    "values": "0+10x100",
                },
                {
                    "series": f'llm_context_answer_signals_total{{{FOREIGN},model="m",workload="w",fill="0.9-1.0",side="above",signal="truncated"}}',
                    "values": "0+1x100",
                },
            ],
            "75m",
            [{**m_, "signal": "repetition"}, {**m_, "signal": "truncated"}],
        ),
        (
            "LLMContextUpstreamDown",
            [
                {
                    "series": f'llm_context_upstream_up{{{_labels(inst("a"))},upstream="openai"}}',
                    "values": "0x20",
                },
                {
                    "series": f'llm_context_upstream_up{{{_labels(inst("a"))},upstream="anthropic"}}',
                    "values": "1x20",
                },
            ],
            "10m",
            [{**inst("a"), "upstream": "openai"}],
        ),
        (
            "LLMContextSidecarDown",
            [
                {"series": f"up{{{_labels(inst('a'))}}}", "values": "0x20"},
                {"series": f"up{{{_labels(inst('b'))}}}", "values": "1x20"},
                # the job is a sidecar's: its other instance exports the sidecar's metrics
                {"series": f"llm_context_config_version{{{_labels(inst('b'))}}}", "values": "3x20"},
                {"series": f'up{{{FOREIGN},instance="z"}}', "values": "0x20"},
            ],
            "10m",
            [inst("a")],
        ),
        (
            "LLMContextSidecarAbsent",
            # the sidecar's target is scraped for 5 minutes, then disappears; another job stays
            [
                {"series": f"up{{{_labels(inst('a'))}}}", "values": "1x5 _x40"},
                {
                    "series": f"llm_context_config_version{{{_labels(inst('a'))}}}",
                    "values": "3x5 _x40",
                },
                {"series": f'up{{{FOREIGN},instance="z"}}', "values": "1x45"},
            ],
            "30m",
            [absent_labels],
        ),
    ]


def _render(template: str, labels: dict[str, str]) -> str:
    return re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels.get(m.group(1), ""), template)


def equality_matchers(selector: str) -> dict[str, str]:
    """The labels ``absent(up{selector})`` carries: its ``name="value"`` matchers."""
    return dict(re.findall(r'(\w+)="([^"]*)"', selector))


def promtool_tests(
    rules_files: str | list[str] = "rules.yaml",
    target: dict[str, str] | None = None,
    selector: str = SELECTOR,
    rules: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The ``promtool test rules`` file: each alert quiet early on, then firing for exactly the
    series it should (``rules_files`` are relative to the test file, as promtool reads them;
    ``rules``: the alerts as deployed, when not the defaults: a case whose alert is switched
    off there is left out)."""
    by_name = {a["alert"]: a for a in (rules if rules is not None else alerts())}
    tests = []
    for name, every, at, firing in cases(target or STANDALONE_TARGET, equality_matchers(selector)):
        if name not in by_name:
            continue
        # rules scoped to a job (the chart's) must ignore another job's sidecar metrics; the
        # standalone rules take every job that exports them for a sidecar's, so there another
        # job is one that exports none of them (only its ``up``)
        series = (
            every
            if "job" in selector
            else [
                s for s in every if not (FOREIGN in s["series"] and s["series"].startswith("llm_"))
            ]
        )
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
    files = [rules_files] if isinstance(rules_files, str) else rules_files
    return {"rule_files": files, "evaluation_interval": "1m", "tests": tests}
