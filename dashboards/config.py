"""What the dashboards, rules and alerts share: thresholds and selectors, in one place (change a
threshold here and regenerate: ``python -m dashboards.mixin``)."""

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

#: the labels every per-ceiling series carries
MW = "model, workload"

#: the dashboard's template variables, applied to every panel query
SEL = 'model=~"$model", workload=~"$workload"'
