"""Render the dashboard's panels to one PNG from a live Prometheus (no Grafana needed).

``python -m dashboards.render --prometheus http://127.0.0.1:9090 --out panels.png [--minutes 10]``
queries every panel target over the range (``query_range``) exactly as the dashboard would, with
the variables set to "All", and draws time series as lines and the rest as their last values.
Used to keep a picture of the dashboard in the docs; also handy in CI artefacts.
"""

from __future__ import annotations

import argparse
import math
import time
from datetime import datetime
from typing import Any

import httpx

from dashboards.panels import dashboard, with_all


def _expr(e: str, step: int) -> str:
    return with_all(e, f"{max(4 * step, 60)}s")


def render(prometheus: str, out: str, minutes: float = 10, step: int = 5) -> int:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    panels = dashboard()["panels"]
    cols = 3
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, 3.2 * rows))
    end = time.time()
    start = end - minutes * 60
    drawn = 0
    with httpx.Client(timeout=30) as c:
        for ax, p in zip(axes.flat, panels, strict=False):
            ax.set_title(p["title"], fontsize=10)
            if p["type"] == "barchart":
                drawn += _bars(c, prometheus, ax, p, end)
                continue
            for t in p["targets"]:
                r = c.get(
                    prometheus.rstrip("/") + "/api/v1/query_range",
                    params={
                        "query": _expr(t["expr"], step),
                        "start": start,
                        "end": end,
                        "step": step,
                    },
                )
                result: list[dict[str, Any]] = (
                    r.json().get("data", {}).get("result", []) if r.status_code == 200 else []
                )
                for series in result[:8]:
                    label = t["legendFormat"]
                    for k, v in series["metric"].items():
                        label = label.replace("{{" + k + "}}", v)
                    xs = [datetime.fromtimestamp(float(x)) for x, _ in series["values"]]
                    ys = [float(y) for _, y in series["values"]]
                    ax.plot(xs, ys, label=label[:40])
                    drawn += 1
            ax.tick_params(labelsize=7)
            ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M"))  # type: ignore[no-untyped-call]
            if ax.lines:
                ax.legend(fontsize=6, loc="upper left")
            else:
                ax.text(
                    0.5,
                    0.5,
                    "no data",
                    ha="center",
                    va="center",
                    transform=ax.transAxes,
                    color="#999",
                )
        for ax in list(axes.flat)[len(panels) :]:
            ax.axis("off")
    fig.suptitle(dashboard()["title"], fontsize=13)
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return drawn


def _bars(c: httpx.Client, prometheus: str, ax: Any, p: dict[str, Any], at: float) -> int:
    """A bar chart panel as Grafana draws it: its instant queries at ``at``, one group of bars per
    category (the row field of its grouping: ``fill``), one bar per series in the group."""
    grouping = next(
        t["options"] for t in p.get("transformations", []) if t["id"] == "groupingToMatrix"
    )
    row, column = grouping["rowField"], grouping["columnField"]
    values: dict[str, dict[str, float]] = {}
    for t in p["targets"]:
        r = c.get(
            prometheus.rstrip("/") + "/api/v1/query",
            params={"query": with_all(t["expr"], "60s"), "time": at},
        )
        for series in r.json().get("data", {}).get("result", []) if r.status_code == 200 else []:
            labels = series["metric"]
            if row in labels and column in labels:
                values.setdefault(labels[column], {})[labels[row]] = float(series["value"][1])
    categories = sorted({k for per in values.values() for k in per})
    if not categories:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes, color="#999")
        return 0
    width = 0.8 / max(1, len(values))
    for i, (name, per) in enumerate(sorted(values.items())):
        xs = [k + i * width for k in range(len(categories))]
        ax.bar(xs, [per.get(cat, 0.0) for cat in categories], width, label=name[:30])
    ax.set_xticks([k + 0.4 - width / 2 for k in range(len(categories))], categories)
    ax.tick_params(labelsize=7)
    ax.legend(fontsize=6, loc="upper left")
    return len(values)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prometheus", required=True)
    ap.add_argument("--out", default="panels.png")
    ap.add_argument("--minutes", type=float, default=10)
    args = ap.parse_args()
    n = render(args.prometheus, args.out, args.minutes)
    print(f"{args.out}: {n} series drawn")


if __name__ == "__main__":
    main()
