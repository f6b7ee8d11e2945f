"""The Prometheus recording rules and alerts (rendered to ``generated/rules.yaml`` and, with
placeholders the chart fills in per release, the chart's ``files/rules.yaml``); each alert has a
runbook entry and a promtool test (``rule_tests.py``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dashboards.config import (
    ALERTS,
    CHART_SELECTOR,
    CHART_THRESHOLD,
    GENERATION,
    KEEP,
    MARKER_METRIC,
    MW,
    RUNBOOK,
    SELECTOR,
    WATCHED_SIGNALS,
    threshold_text,
)

TRIMMED = 'action="trimmed"'
REJECTED = 'action="rejected"'
NOT_NO_CEILING = 'reason!="no_ceiling"'
NO_CEILING = 'reason="no_ceiling"'
#: the catch-all label of unregistered models: no ceiling by definition
REGISTERED = 'model!="other"'
FAILURE = 'result="failure"'


def _m(metric: str, selector: str, *matchers: str) -> str:
    """``metric{selector, matchers...}`` (``metric`` alone without any)."""
    inside = ", ".join(x for x in (selector, *matchers) if x)
    return metric + "{" + inside + "}" if inside else metric


def recording_rules(sel: str = SELECTOR) -> list[dict[str, Any]]:
    rules = []
    for q in ("50", "90", "99"):
        rules.append(
            {
                "record": f"model_workload:llm_context_utilization_ratio:p{q}_5m",
                "expr": f"histogram_quantile(0.{q}, sum by ({MW}, le) "
                f"(rate({_m('llm_context_utilization_ratio_bucket', sel)}[5m])))",
            }
        )
    for w in ("5m", "1h"):
        rules.append(
            {
                "record": f"model_workload:llm_context_ceiling_utilization_ratio:p95_{w}",
                "expr": f"histogram_quantile(0.95, sum by ({MW}, le) "
                f"(rate({_m('llm_context_ceiling_utilization_ratio_bucket', sel)}[{w}])))",
            }
        )
        rules.append(
            {
                "record": f"model_workload:llm_context_trimmed_requests:ratio_rate{w}",
                "expr": (
                    f"sum by ({MW}) (rate({_m('llm_context_over_ceiling_total', sel, TRIMMED)}[{w}]))"
                    f"\n/ sum by ({MW}) (rate({_m('llm_context_requests_total', sel, GENERATION)}[{w}]))"
                ),
            }
        )
    rules += [
        {
            "record": "model_workload_action:llm_context_over_ceiling:rate5m",
            "expr": f"sum by ({MW}, action) (rate({_m('llm_context_over_ceiling_total', sel)}[5m]))",
        },
        {
            # generation requests only: the denominator of the dashboard's shares
            "record": "model_workload:llm_context_requests:rate5m",
            "expr": f"sum by ({MW}) (rate({_m('llm_context_requests_total', sel, GENERATION)}[5m]))",
        },
        # answer signals by fill bucket (the dashboard's curve) and by side of the ceiling (the
        # alert): each signal's share of the answers, over an hour
        {
            "record": "model_workload_fill:llm_context_answers:rate1h",
            "expr": f"sum by ({MW}, fill) (rate({_m('llm_context_answers_total', sel)}[1h]))",
        },
        {
            "record": "model_workload_fill_signal:llm_context_answer_signals:ratio_rate1h",
            "expr": (
                f"sum by ({MW}, fill, signal) (rate({_m('llm_context_answer_signals_total', sel)}[1h]))"
                f"\n/ on ({MW}, fill) group_left"
                f"\nsum by ({MW}, fill) (rate({_m('llm_context_answers_total', sel)}[1h]))"
            ),
        },
        {
            "record": "model_workload_side:llm_context_answers:increase1h",
            "expr": f"sum by ({MW}, side) (increase({_m('llm_context_answers_total', sel)}[1h]))",
        },
        {
            "record": "model_workload_side_signal:llm_context_answer_signals:ratio_rate1h",
            "expr": (
                f"sum by ({MW}, side, signal) (rate({_m('llm_context_answer_signals_total', sel)}[1h]))"
                f"\n/ on ({MW}, side) group_left"
                f"\nsum by ({MW}, side) (rate({_m('llm_context_answers_total', sel)}[1h]))"
            ),
        },
        {
            "record": "model:llm_context_token_estimate_error_ratio:p50_1h",
            "expr": f"histogram_quantile(0.5, sum by ({KEEP}, model, le) "
            f"(rate({_m('llm_context_token_estimate_error_ratio_bucket', sel)}[1h])))",
        },
    ]
    return rules


def alerts(
    sel: str = SELECTOR, threshold: Callable[[str], str] | None = None, chart: bool = False
) -> list[dict[str, Any]]:
    """Every alert, with its defaults; ``threshold(name)`` gives the number each compares with
    (default: its configured default), ``chart``: every further number is its placeholder.
    Recorded series are selected too: the recording rules of another release in the same
    Prometheus write the same names, and their series are not this release's to alert on."""

    def t(name: str) -> str:
        if threshold is not None:
            return threshold(name)
        value = ALERTS[name].threshold
        assert value is not None, name
        return threshold_text(value)

    def param(name: str, key: str) -> str:
        [p] = [p for p in ALERTS[name].params if p.key == key]
        return p.placeholder if chart else threshold_text(p.default)

    def alert(name: str, expr: str, summary: str, description: str) -> dict[str, Any]:
        d = ALERTS[name]
        return {
            "alert": name,
            "expr": expr,
            "for": d.for_,
            "labels": {"severity": d.severity},
            "annotations": {
                "summary": summary,
                "description": description,
                "runbook_url": f"{RUNBOOK}#{name.lower()}",
            },
        }

    near = t("LLMContextUtilizationNearCeiling")
    trim = t("LLMContextTrimRateRising")
    return [
        alert(
            "LLMContextUtilizationNearCeiling",
            f"{_m('model_workload:llm_context_ceiling_utilization_ratio:p95_1h', sel)} > {near}\n"
            f"and {_m('model_workload:llm_context_ceiling_utilization_ratio:p95_5m', sel)} > {near}",
            "Traffic for {{ $labels.model }}/{{ $labels.workload }} runs close to its context ceiling",
            "p95 of input tokens / ceiling has been above the threshold over the last hour and the last 5 minutes.",
        ),
        alert(
            "LLMContextTrimRateRising",
            f"{_m('model_workload:llm_context_trimmed_requests:ratio_rate1h', sel)} > {trim}\n"
            f"and {_m('model_workload:llm_context_trimmed_requests:ratio_rate5m', sel)} > {trim}",
            "Many requests to {{ $labels.model }}/{{ $labels.workload }} are trimmed",
            "More than the threshold share of requests were trimmed to fit the ceiling, over 1h and 5m.",
        ),
        alert(
            "LLMContextRequestsRejected",
            f"sum by ({MW}) (rate({_m('llm_context_over_ceiling_total', sel, REJECTED)}[10m]))\n"
            f"/ sum by ({MW}) (rate({_m('llm_context_requests_total', sel, GENERATION)}[10m]))\n"
            f"> {t('LLMContextRequestsRejected')}",
            "Requests to {{ $labels.model }}/{{ $labels.workload }} are rejected as too long",
            "A sustained share of requests could not be trimmed under the ceiling and were rejected "
            "with a context-length error (a single over-long request does not fire this).",
        ),
        alert(
            "LLMContextCeilingStale",
            f"max by ({MW}, reason) ({_m('llm_context_ceiling_stale', sel, NOT_NO_CEILING)}) == 1",
            "The ceiling of {{ $labels.model }}/{{ $labels.workload }} is stale ({{ $labels.reason }})",
            "Live traffic no longer looks like what the ceiling was measured on: re-sweep.",
        ),
        alert(
            "LLMContextNoCeiling",
            f"max by ({MW}) ({_m('llm_context_ceiling_stale', sel, NO_CEILING, REGISTERED)}) == 1",
            "{{ $labels.model }}/{{ $labels.workload }} has traffic but no measured ceiling",
            "Requests are measured but nothing is enforced or judged against a ceiling: sweep this "
            "model and workload when it matters (unregistered models, `other`, are not reported).",
        ),
        alert(
            "LLMContextCeilingOld",
            f"max by ({MW}) ({_m('llm_context_ceiling_age_seconds', sel)}) > {t('LLMContextCeilingOld')} * 86400",
            "The ceiling of {{ $labels.model }}/{{ $labels.workload }} is old",
            "The running ceiling was derived longer ago than the configured maximum age: re-sweep.",
        ),
        alert(
            "LLMContextConfigReloadFailing",
            f"sum by ({KEEP}, instance, source) "
            f"(increase({_m('llm_context_config_reloads_total', sel, FAILURE)}[15m])) > 0",
            "A ceilings reload failed on {{ $labels.instance }}",
            "A ceilings document from {{ $labels.source }} was rejected; the previous ceilings stay in force.",
        ),
        alert(
            "LLMContextTokenEstimateDrift",
            f"abs({_m('model:llm_context_token_estimate_error_ratio:p50_1h', sel)}) "
            f"> {t('LLMContextTokenEstimateDrift')}",
            "Token estimates for {{ $labels.model }} drift from the provider's counts",
            "The median estimate error exceeds the threshold: refit the calibration or fix the tokenizer.",
        ),
        alert(
            "LLMContextAnswerSignalAboveCeiling",
            _answer_signal_expr(
                sel,
                t("LLMContextAnswerSignalAboveCeiling"),
                param("LLMContextAnswerSignalAboveCeiling", "minAnswers"),
                param("LLMContextAnswerSignalAboveCeiling", "minRate"),
            ),
            "{{ $labels.model }}/{{ $labels.workload }} answers above its ceiling show more "
            "{{ $labels.signal }}",
            "Over the last hour the share of answers with this signal among requests above the "
            "ceiling exceeds the share below it by the configured factor, with enough answers "
            "on both sides: the knee may sit lower than the ceiling says. Compare the dashboard's "
            "answer-signal row with the sweep's curve; re-sweep or enforce.",
        ),
        alert(
            "LLMContextUpstreamDown",
            f"max by ({KEEP}, instance, upstream) ({_m('llm_context_upstream_up', sel)}) == 0",
            "The {{ $labels.upstream }} upstream is unreachable from {{ $labels.instance }}",
            "The sidecar's background probe cannot open a connection to the provider: requests get "
            "a 502 each (the replica stays ready, so nothing else hides the outage).",
        ),
        alert(
            "LLMContextSidecarDown",
            f"{_m('up', sel)} == 0" if sel else _down_standalone(),
            "The context-ceiling sidecar {{ $labels.instance }} is down",
            "Prometheus cannot scrape the sidecar: requests through it fail or bypass measurement.",
        ),
        alert(
            "LLMContextSidecarAbsent",
            f"absent({_m('up', sel)})" if sel else f"absent({MARKER_METRIC})",
            "No context-ceiling sidecar is scraped",
            "Prometheus has no scrape target for the sidecar at all: no pods, or the ServiceMonitor "
            "(or scrape config) does not select them, so nothing here can alert.",
        ),
    ]


def _down_standalone() -> str:
    """A target that is down, in a job that exported the sidecar's metrics within the hour (any
    job name: the standalone rules have no job selector)."""
    return f"up == 0 and on ({KEEP}) max by ({KEEP}) (max_over_time({MARKER_METRIC}[1h]))"


def _answer_signal_expr(sel: str, factor: str, min_answers: str, min_rate: str) -> str:
    """A watched signal's share above the ceiling > ``factor`` x its share below (at least
    ``min_rate``), with ``min_answers`` answers on each side in the hour. A signal that never
    occurred below the ceiling has no series there: it counts as 0 (``or 0 * above``)."""
    ratio = "model_workload_side_signal:llm_context_answer_signals:ratio_rate1h"
    answers = "model_workload_side:llm_context_answers:increase1h"
    watched = f'signal=~"{WATCHED_SIGNALS}"'
    up, down = 'side="above"', 'side="below"'
    above = f"sum without (side) ({_m(ratio, sel, up, watched)})"
    below = f"sum without (side) ({_m(ratio, sel, down, watched)})"
    return (
        f"{above}\n> {factor} * clamp_min({below}\nor 0 * {above}, {min_rate})\n"
        f"and on ({KEEP}, model, workload) "
        f"(sum without (side) ({_m(answers, sel, up)}) >= {min_answers})\n"
        f"and on ({KEEP}, model, workload) "
        f"(sum without (side) ({_m(answers, sel, down)}) >= {min_answers})"
    )


def _opt_in(name: str) -> bool:
    return not ALERTS[name].enabled


def rules_file(sel: str = SELECTOR) -> dict[str, Any]:
    """The standalone rules: recording rules and the alerts that are on by default."""
    return {
        "groups": [
            {"name": "context-ceiling.rules", "interval": "30s", "rules": recording_rules(sel)},
            {
                "name": "context-ceiling.alerts",
                "rules": [a for a in alerts(sel) if not _opt_in(a["alert"])],
            },
        ]
    }


def opt_in_rules_file(sel: str = SELECTOR) -> dict[str, Any]:
    """The alerts that are off by default, to load beside ``rules.yaml`` when wanted."""
    return {
        "groups": [
            {
                "name": "context-ceiling.opt-in-alerts",
                "rules": [a for a in alerts(sel) if _opt_in(a["alert"])],
            }
        ]
    }


def chart_rules_file() -> dict[str, Any]:
    """The chart's copy: the selector and every threshold are placeholders that
    ``templates/prometheusrule.yaml`` fills in from the release and its values."""
    return {
        "groups": [
            {
                "name": "context-ceiling.rules",
                "interval": "30s",
                "rules": recording_rules(CHART_SELECTOR),
            },
            {
                "name": "context-ceiling.alerts",
                "rules": alerts(CHART_SELECTOR, lambda _name: CHART_THRESHOLD, chart=True),
            },
        ]
    }
