"""The sweep's report: a PNG plot, a self-contained HTML page, a JSON summary, a terminal table."""

from __future__ import annotations

import base64
import html
import io
import itertools
import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from context_ceiling.core.prices import lookup
from context_ceiling.core.utilization import fill_bucket
from context_ceiling.sweep import replay
from context_ceiling.sweep.analysis import RunAnalysis, analysis_of
from context_ceiling.sweep.calllog import Row
from context_ceiling.sweep.curve import Analysis, LevelStats
from context_ceiling.sweep.plan import Plan
from context_ceiling.sweep.scorer import BUCKETS, grade

COLORS = {
    "correct": "#2e7d32",
    "missed": "#9e9e9e",
    "decoyed": "#e65100",
    "reasoned_wrongly": "#6a1b9a",
    "truncated_refused": "#c62828",
}


def pass_cell(s: LevelStats) -> str:
    """The pass column: ``yes`` or ``no`` for a level the pass test walks; for one it never
    tests, what it is (``scan``: a dip-scan point that does not look low; ``probe``: a point the
    refinement measured to find a cliff), since "yes" there would read as a pass it never had."""
    if s.role == "scanned":
        return "scan"
    if s.role == "probe":
        return "probe"
    return "yes" if s.passes else "no"


def plot(
    a: Analysis, title: str, metric: str = "accuracy", rep: dict[str, Any] | None = None
) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(2, 1, figsize=(8, 7), height_ratios=[3, 2], sharex=True)
    # measured points with their intervals, never joined: a line between two levels would draw
    # the interpolation the method warns against at a cliff
    xs = [s.utilization for s in a.levels]
    ys = [s.accuracy for s in a.levels]
    ax.errorbar(
        xs,
        ys,
        yerr=[
            [y - s.ci[0] for y, s in zip(ys, a.levels, strict=True)],
            [s.ci[1] - y for y, s in zip(ys, a.levels, strict=True)],
        ],
        fmt="o",
        color="#1565c0",
        ecolor="#1565c0",
        elinewidth=2,
        capsize=5,
        label=f"{metric}, 95% CI (items as the unit)",
    )
    ax.errorbar(
        [x + 0.006 for x in xs],
        ys,
        yerr=[
            [s.accuracy - s.repeat_min for s in a.levels],
            [s.repeat_max - s.accuracy for s in a.levels],
        ],
        fmt="none",
        ecolor="#90a4ae",
        capsize=3,
        label="min-max across repeats",
    )
    for s in a.levels:
        ax.annotate(
            f"{s.mean_prompt_tokens:,.0f} tok" + (" (ref)" if s.role == "reference" else ""),
            (s.utilization, s.accuracy),
            textcoords="offset points",
            xytext=(6, 6),
            fontsize=7,
            color="#37474f",
        )
    if a.ceiling_utilization is not None and a.ceiling_level is not None:
        lv = next(s.utilization for s in a.levels if s.level == a.ceiling_level)
        ax.axvspan(
            a.ceiling_utilization, lv, color="#ffb300", alpha=0.25, label=f"margin {a.margin:.0%}"
        )
        ax.axvline(
            a.ceiling_utilization,
            color="#e65100",
            lw=2,
            label=f"ceiling {a.ceiling_utilization:.0%} = {a.ceiling_tokens:,} tokens"
            + ("" if a.resolved and not a.refusals else " (derive refuses it)"),
        )
    if rep:  # what enforcing bought: the held-out requests, forwarded whole and trimmed
        for mode, marker, color, what in (
            ("observe", "s", "#6d4c41", "held-out, forwarded whole"),
            ("enforce", "D", "#2e7d32", "held-out, trimmed to the ceiling"),
        ):
            side = rep[mode]
            x = side["input_tokens"] / a.window
            ax.errorbar(
                [x],
                [side["accuracy"]],
                yerr=[[side["accuracy"] - side["ci"][0]], [side["ci"][1] - side["accuracy"]]],
                fmt=marker,
                color=color,
                ecolor=color,
                capsize=4,
                label=f"{what} (n={side['n']})",
            )
    ax.set_ylim(0, 1.02)
    ax.set_ylabel(metric)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower left", fontsize=8, framealpha=0.9)
    width = min([b - a_ for a_, b in itertools.pairwise(xs)] or [0.1]) * 0.6
    bottom = [0.0] * len(xs)
    for b in BUCKETS:
        vals = [s.buckets.get(b, 0.0) for s in a.levels]
        bx.bar(xs, vals, width=width, bottom=bottom, color=COLORS[b], label=b.replace("_", " "))
        bottom = [x + y for x, y in zip(bottom, vals, strict=True)]
    bx.set_ylabel("share of calls")
    bx.set_xlabel("utilization (input tokens / window)")
    bx.legend(fontsize=8, ncol=5, loc="upper center", bbox_to_anchor=(0.5, -0.22), frameon=False)
    bx.set_xlim(0, 1)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def table(a: Analysis, metric: str = "accuracy") -> Table:
    t = Table(title=f"{metric} by context utilization")
    for col in (
        "level",
        "utilization",
        "fill bucket",
        "tokens",
        "items",
        "calls",
        metric,
        "95% CI",
        "repeats min-max",
        "vs ref (bounds)",
        "pass",
        "count err",
        "decoyed",
        "missed",
        "wrong",
        "trunc",
    ):
        t.add_column(col, justify="right")
    for s in a.levels:
        t.add_row(
            f"{s.level:.3f}",
            f"{s.utilization:.3f}",
            fill_bucket(s.utilization),
            f"{s.mean_prompt_tokens:,.0f}",
            str(s.n_items),
            str(s.n_calls),
            f"{s.accuracy:.0%}",
            f"{s.ci[0]:.0%}-{s.ci[1]:.0%}",
            f"{s.repeat_min:.0%}-{s.repeat_max:.0%}",
            f"{s.diff:+.0%} ({s.diff_ci[0]:+.0%}..{s.diff_ci[1]:+.0%})",
            pass_cell(s) + ("" if s.complete else " (incomplete)"),
            "-" if s.counter_error is None else f"{s.counter_error:+.1%}",
            f"{s.buckets['decoyed']:.0%}",
            f"{s.buckets['missed']:.0%}",
            f"{s.buckets['reasoned_wrongly']:.0%}",
            f"{s.buckets['truncated_refused']:.0%}",
        )
    return t


def _tolerance(a: Analysis) -> str:
    stated = a.stated_tolerance or a.tolerance
    if stated > a.tolerance + 1e-9:
        return f"{stated:.1%}, the data do not resolve the {a.tolerance:.0%} asked for"
    return f"{stated:.0%}"


def ceiling_line(a: Analysis) -> str:
    if a.ceiling_tokens is None:
        return "no ceiling: " + (a.refusals[0] if a.refusals else "no level passed")
    head = ("UNRESOLVED " if not a.resolved else "") + (
        "AT THE REFERENCE " if a.at_reference else ""
    )
    return head + (
        f"ceiling: level {a.ceiling_level} passes (tolerance {_tolerance(a)}); enforced at "
        f"{a.ceiling_utilization:.1%} of the {a.window:,}-token window = {a.ceiling_tokens:,} input tokens "
        f"(margin {a.margin:.0%})"
    )


#: what the report shows of the plan
PROVENANCE: dict[str, Any] = {
    "run_id": True,
    "created_at": True,
    "taskset": True,
    "endpoint": True,
    "levels": True,
    "counter": True,
    "spec": {"repeats", "seed", "shared_haystack"},
}


def item_lines(ra: RunAnalysis) -> list[str]:
    """Which items were labelled (graded as accuracy) and which are graded as agreement with the
    model's own evidence-only answer, and which of those agree at the reference level."""
    drawn = set(ra.plan.item_ids)
    items = [i for i in ra.taskset.items if i.id in drawn]
    labelled = [i.id for i in items if i.labelled]
    unlabelled = [i for i in items if not i.labelled]
    if not unlabelled:
        return []
    ref = next((s.level for s in ra.analysis.levels if s.role == "reference"), None)
    votes: dict[str, list[bool]] = {}
    if ref is not None:
        by_id = {i.id: i for i in items}
        for r in ra.rows:
            if r.get("level") == ref and r["item"] in by_id and r["status"] == "ok":
                g = grade(by_id[r["item"]], r.get("text"), r.get("finish_reason"))
                votes.setdefault(r["item"], []).append(g.correct)
    agree = sorted(k for k, v in votes.items() if sum(v) * 2 > len(v))
    differ = sorted(k for k, v in votes.items() if sum(v) * 2 <= len(v))
    sources = sorted({getattr(i.answer, "source", "") for i in unlabelled})
    return [
        f"labelled ({len(labelled)} items, graded as accuracy): {', '.join(labelled) or 'none'}",
        f"unlabelled ({len(unlabelled)} items, graded as agreement with the model's own answer "
        f"given only the evidence; gold from {', '.join(sources)}): "
        f"at the reference level {len(agree)} agree ({', '.join(agree) or 'none'}), "
        f"{len(differ)} do not ({', '.join(differ) or 'none'})",
    ]


def replay_rows(rep: dict[str, Any]) -> list[list[str]]:
    """The rows of the before/after table of a run's ``replay.json`` (sweep.replay)."""
    rows = []
    for mode, what in (("observe", "untrimmed"), ("enforce", "trimmed to the ceiling")):
        s = rep[mode]
        server, seconds = s.get("server_prompt_tokens"), s.get("seconds")
        rows.append(
            [
                f"{mode} ({what})",
                str(s["n"]),
                f"{s['accuracy']:.0%}",
                f"{s['ci'][0]:.0%}-{s['ci'][1]:.0%}",
                f"{s['input_tokens']:,.0f}",
                f"{s['trimmed_tokens']:,.0f}",
                f"{server:,.0f}" if server is not None else "?",
                f"{seconds:.1f}" if seconds is not None else "?",
            ]
        )
    return rows


REPLAY_HEADER = (
    "requests",
    "n",
    "accuracy",
    "95% CI",
    "input tokens (mean)",
    "tokens removed (mean)",
    "server prompt tokens (mean)",
    "seconds (mean)",
)


def replay_line(rep: dict[str, Any]) -> str:
    lo, hi = rep["difference_ci"]
    return (
        f"Enforcing the ceiling ({rep['ceiling_tokens']:,} tokens) on requests above it: accuracy "
        f"{rep['observe']['accuracy']:.0%} -> {rep['enforce']['accuracy']:.0%} (paired difference "
        f"{rep['difference']:+.0%}, 95% CI {lo:+.0%}..{hi:+.0%})."
    )


def replay_table(rep: dict[str, Any]) -> Table:
    t = Table(*REPLAY_HEADER, title="What enforcing the ceiling buys (held-out requests)")
    for row in replay_rows(rep):
        t.add_row(*row)
    return t


def _replay_html(rep: dict[str, Any] | None) -> str:
    if not rep:
        return ""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in REPLAY_HEADER)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>"
        for row in replay_rows(rep)
    )
    return (
        "<h2>What enforcing the ceiling buys</h2>"
        "<p>Held-out items asked as retrieval requests above the ceiling (the evidence ranked "
        "first), forwarded whole (observe) and trimmed to the ceiling (enforce), graded by the "
        f"same scorer.</p><p>{html.escape(replay_line(rep))}</p><table><tr>{head}</tr>{body}</table>"
    )


def spend_of(rows: list[Row], model: str) -> dict[str, Any]:
    """What the run's calls spent, from the log: calls, input tokens (as the provider reported
    them, else as counted), the part read from and written to the prompt cache, output tokens,
    and dollars at the model's list price (None when the price data set has no price)."""
    inp = sum(int(r.get("usage_prompt") or r.get("prompt_tokens") or 0) for r in rows)
    cached = sum(int(r.get("cached_tokens") or 0) for r in rows)
    written = sum(int(r.get("cache_write_tokens") or 0) for r in rows)
    out = sum(int(r.get("usage_completion") or 0) for r in rows)
    price = lookup(model)
    return {
        "calls": len(rows),
        "input_tokens": inp,
        "cached_tokens": cached,
        "cache_write_tokens": written,
        "output_tokens": out,
        "usd": round(price.cost(inp, out, cached, written), 4) if price else None,
        "price_source": price.source if price else None,
    }


def unmeasured_line(plan: Plan, a: Analysis) -> str | None:
    """The grid levels the adaptive design left unmeasured (``plan.grid_left``), and why."""
    if not plan.grid_left:
        return None
    levels = ", ".join(f"{lv:g}" for lv in plan.grid_left)
    if a.hopeless:  # refused on what was measured: nothing above could lift it
        return (
            f"grid level(s) {levels} not measured: the design stopped at a refusal no more "
            "data can lift"
        )
    return (
        f"grid level(s) {levels} not measured: the sweep ended before every level below them "
        "passed, so they could not move the ceiling (--no-adaptive measures every grid level)"
    )


def write(
    out: Path,
    a: Analysis,
    plan: Plan,
    console: Console | None = None,
    items: list[str] | None = None,
    spend: dict[str, Any] | None = None,
) -> dict[str, Path]:
    ts = plan.taskset.model_dump() if plan.taskset else {}
    metric = plan.taskset.metric if plan.taskset else "accuracy"
    title = f"{plan.spec.model} on {ts.get('name', plan.spec.taskset)} (window {a.window:,})"
    rep = replay.load(out)
    png = plot(a, title, metric, rep)
    (out / "curve.png").write_bytes(png)
    summary = {
        "run_id": plan.run_id,
        "model": plan.spec.model,
        "taskset": ts,
        "analysis": a.to_json(),
        # each level's fill bucket, as the sidecar's answer signals and the dashboard name it
        "fill_buckets": {f"{s.level:g}": fill_bucket(s.utilization) for s in a.levels},
        "unmeasured_grid_levels": list(plan.grid_left),
        "spend": spend,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    rows = "".join(
        f"<tr><td>{s.level:.3f}</td><td>{s.utilization:.3f}</td><td>{fill_bucket(s.utilization)}</td><td>{s.mean_prompt_tokens:,.0f}</td><td>{s.n_calls}</td>"
        f"<td>{s.accuracy:.1%}</td><td>{s.ci[0]:.1%} - {s.ci[1]:.1%}</td><td>{s.repeat_min:.1%} - {s.repeat_max:.1%}</td>"
        f"<td>{s.diff:+.1%} ({s.diff_ci[0]:+.1%} .. {s.diff_ci[1]:+.1%})</td><td>{pass_cell(s)}</td>"
        + "".join(f"<td>{s.buckets[b]:.0%}</td>" for b in BUCKETS[1:])
        + "</tr>"
        for s in a.levels
    )
    notes = [*a.warnings, *filter(None, [unmeasured_line(plan, a)])]
    warn = "".join(f"<li><b>refused:</b> {html.escape(w)}</li>" for w in a.refusals) + "".join(
        f"<li>{html.escape(w)}</li>" for w in notes
    )
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:system-ui,sans-serif;max-width:60rem;margin:2rem auto;color:#222}}
table{{border-collapse:collapse;font-size:.9rem}}td,th{{border:1px solid #ccc;padding:.25rem .5rem;text-align:right}}
.ceiling{{font-size:1.2rem;background:#fff3e0;padding:.75rem;border-left:4px solid #e65100}}</style></head><body>
<h1>Usable context: {html.escape(title)}</h1>
<p class="ceiling">{html.escape(ceiling_line(a))}</p>
<img alt="{metric} vs utilization" src="data:image/png;base64,{base64.b64encode(png).decode()}" width="720">
<h2>Levels</h2><table><tr><th>level</th><th>utilization</th><th>fill bucket</th><th>tokens</th><th>calls</th><th>{metric}</th><th>95% CI</th>
<th>repeats</th><th>vs reference</th><th>pass</th><th>missed</th><th>decoyed</th><th>reasoned wrongly</th><th>truncated/refused</th></tr>
{rows}</table>
{_replay_html(rep)}
<h2>Notes</h2><ul>{warn or "<li>none</li>"}</ul>
<h2>Items</h2><ul>{"".join(f"<li>{html.escape(x)}</li>" for x in items or []) or "<li>every item labelled</li>"}</ul>
<h2>Provenance</h2><pre>{html.escape(plan.model_dump_json(indent=2, include=PROVENANCE))}</pre>
</body></html>"""
    (out / "report.html").write_text(page)
    if console is not None:
        console.print(table(a, metric))
        console.print(ceiling_line(a))
        for line in items or []:
            console.print(line)
        for w in a.refusals:
            console.print(f"[bold red]derive would refuse:[/] {w}")
        for w in notes:
            console.print(f"[yellow]note:[/] {w}")
    return {"png": out / "curve.png", "html": out / "report.html", "json": out / "summary.json"}


def report(out: Path, console: Console, as_json: bool = False) -> int:
    """``ceiling sweep report``: (re)write a run's report from its plan and log; with
    ``as_json``, print the run's summary (``summary.json``) on stdout as well."""
    ra = analysis_of(out)
    paths = write(
        out, ra.analysis, ra.plan, console, item_lines(ra), spend_of(ra.rows, ra.plan.spec.model)
    )
    console.print(f"report: {paths['html']}  plot: {paths['png']}  summary: {paths['json']}")
    if as_json:
        summary = json.loads(paths["json"].read_text())
        print(
            json.dumps(
                {"run": str(out), "report": str(paths["html"]), "summary": summary}, indent=2
            )
        )
    return 0
