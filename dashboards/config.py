"""What the dashboards, rules and alerts share: selectors, the labels kept, and each alert's
defaults (severity, ``for``, threshold), in one place. Change one here and regenerate
(``python -m dashboards.mixin``); the Helm chart's ``prometheusRule.alerts`` values default to
the same figures (a test keeps them equal) and override them per release."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from context_ceiling.formats import GENERATION_APIS
from context_ceiling.sidecar.observability.answer_signals import SIGNALS

RUNBOOK = "https://github.com/context-ceiling/context-ceiling/blob/main/dashboards/runbook.md"

#: The standalone rules (``generated/rules.yaml``) select by the product's own metric names,
#: whatever the scrape job is called (``job: ceiling``, a ServiceMonitor's ``RELEASE-...``): no
#: label matcher. The two alerts about scrape targets (``up``) select the jobs that export the
#: sidecar's metrics (:func:`dashboards.rules.alerts`). The chart's own PrometheusRule replaces
#: it with the exact job and namespace of its release (:data:`CHART_SELECTOR`).
SELECTOR = ""
#: the sidecar's metric every process exports from its start: what marks a scrape job as a
#: sidecar's for the standalone ``up`` alerts
MARKER_METRIC = "llm_context_config_version"
#: placeholders in the chart's copy of the rules, filled in per release by
#: ``templates/prometheusrule.yaml`` from the values
CHART_SELECTOR = "__SELECTOR__"
CHART_THRESHOLD = "__THRESHOLD__"

#: labels every rule keeps, so two releases or two clusters feeding one Thanos/Mimir stay apart
#: and alerts route per namespace (absent labels are simply absent)
KEEP = "cluster, namespace, job"
#: the labels every per-ceiling series carries
MW = f"{KEEP}, model, workload"
#: requests that generate (not /v1/models, not a count_tokens call): the denominator of every
#: per-request share
GENERATION = 'api=~"{}"'.format("|".join(GENERATION_APIS))

#: the dashboard's template variables: the scrape target's (every series), then the
#: per-ceiling ones
JOB_SEL = 'cluster=~"$cluster", namespace=~"$namespace", job=~"$job"'
SEL = f'{JOB_SEL}, model=~"$model", workload=~"$workload"'

Severity = Literal["critical", "warning", "info"]


@dataclass(frozen=True)
class Param:
    """A further number an alert compares with, besides its threshold: its key in the chart's
    values (camelCase; ``__KEY__`` upper-cased is its placeholder in the chart's rules)."""

    key: str
    default: float
    means: str

    @property
    def placeholder(self) -> str:
        return f"__{self.key.upper()}__"


@dataclass(frozen=True)
class AlertDefaults:
    """An alert's defaults; the chart's values override each per release."""

    severity: Severity
    for_: str
    #: the number the alert compares with (None: the alert has none)
    threshold: float | None = None
    #: what the threshold is, in the unit the values take
    threshold_means: str = ""
    #: further numbers it compares with
    params: tuple[Param, ...] = ()
    #: on unless a release turns it off; an opt-in alert is left out of the standalone
    #: ``rules.yaml`` (it is in ``rules-opt-in.yaml``) and off in the chart's values
    enabled: bool = True


ALERTS: dict[str, AlertDefaults] = {
    "LLMContextUtilizationNearCeiling": AlertDefaults(
        "warning", "15m", 0.9, "p95 of input tokens / ceiling, over 1h and over 5m"
    ),
    "LLMContextTrimRateRising": AlertDefaults(
        "warning", "15m", 0.2, "share of generation requests trimmed, over 1h and over 5m"
    ),
    "LLMContextRequestsRejected": AlertDefaults(
        "critical",
        "15m",
        0.01,
        "share of generation requests rejected as too long, over 10m (held for longer than "
        "the window: one over-long request never pages)",
    ),
    "LLMContextCeilingStale": AlertDefaults("warning", "30m"),
    "LLMContextNoCeiling": AlertDefaults("info", "1h"),
    "LLMContextCeilingOld": AlertDefaults(
        "info", "1h", 30, "days since the running ceiling was derived"
    ),
    "LLMContextConfigReloadFailing": AlertDefaults("warning", "0m"),
    "LLMContextTokenEstimateDrift": AlertDefaults(
        "warning", "1h", 0.1, "|median (estimate - reported) / reported| over 1h"
    ),
    "LLMContextAnswerSignalAboveCeiling": AlertDefaults(
        "warning",
        "30m",
        2,
        "factor: a signal's rate among answers above the ceiling over its rate below it, over 1h",
        (
            Param("minAnswers", 100, "answers on each side of the ceiling within the hour"),
            Param("minRate", 0.02, "the lowest rate below the ceiling the factor applies to"),
        ),
        enabled=False,
    ),
    "LLMContextUpstreamDown": AlertDefaults("critical", "5m"),
    "LLMContextSidecarDown": AlertDefaults("critical", "5m"),
    "LLMContextSidecarAbsent": AlertDefaults("critical", "15m"),
}
# Annotations template only labels, never $value: the numbers are on the dashboard, and the
# promtool tests can then state exactly what each alert says.


#: the answer signals the alert watches: the failures, not the stops that are normal
#: (``stop``, ``tool_calls``, ``other_stop``)
WATCHED_SIGNALS = "|".join(s for s in SIGNALS if s not in ("stop", "tool_calls", "other_stop"))


def threshold_text(value: float) -> str:
    """A threshold as PromQL reads it (``0.9``, ``30``)."""
    return f"{value:g}"
