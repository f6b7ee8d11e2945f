"""What a finished (or merged) run yields: its analysis, its report, the regression verdict,
the merge of shard runs, and the derived ceilings document. Each is one ``ceiling sweep`` command
or a step of one."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from rich.console import Console

from context_ceiling.core.ceilings import (
    CeilingsError,
    dump_document,
    load_document,
    write_atomically,
)
from context_ceiling.sweep.analysis import DEFAULT_FLOOR, Design, analyse
from context_ceiling.sweep.derive import DeriveError, entry_from, merged
from context_ceiling.sweep.regression import compare
from context_ceiling.sweep.report import write
from context_ceiling.sweep.runner import CallLog
from context_ceiling.sweep.taskset import load_taskset


class SweepUsageError(Exception):
    """One line for the user; exit status 2."""


def design_of(plan: dict[str, Any]) -> Design:
    """What the plan says was to be measured (a run of the first release: every item at every
    planned level)."""
    ids: list[str] = plan["item_ids"]
    levels = [float(x) for x in plan["levels"]]
    n_at = plan.get("n_at") or {}
    per = {lv: ids[: int(n_at.get(f"{lv:.4f}", len(ids)))] for lv in levels}
    control = ids[: int(plan.get("n_control", len(ids)))] if plan.get("control", True) else []
    chain = [lv for lv in levels if lv != plan.get("low_fill")] or levels
    return Design(per, int(plan["repeats"]), control, float(plan.get("reference") or min(chain)))


def analysis_of(
    out: Path,
    tolerance: float | None = None,
    margin: float | None = None,
    floor: float | None = None,
    include_closed_book: bool = False,
) -> tuple[Any, dict[str, Any], list[dict[str, Any]]]:
    plan = json.loads((out / "plan.json").read_text())
    ts = load_taskset(plan["taskset_arg"])
    items = {i.id: i for i in ts.items if i.id in set(plan["item_ids"])}
    records = list(CallLog(out / "calls.jsonl").records().values())
    a = analyse(
        records,
        items,
        plan["window"],
        tolerance if tolerance is not None else plan["tolerance"],
        margin if margin is not None else plan["margin"],
        design=design_of(plan),
        docs={d.id: d.text for d in ts.docs.values()},
        floor=floor if floor is not None else plan.get("min_accuracy", DEFAULT_FLOOR),
        include_closed_book=include_closed_book,
    )
    return a, plan, records


def report(out: Path, console: Console) -> int:
    a, plan, _ = analysis_of(out)
    paths = write(out, a, plan, console)
    console.print(f"report: {paths['html']}  plot: {paths['png']}  summary: {paths['json']}")
    return 0


def verdict(out: Path, baseline: Path, console: Console) -> int:
    new, plan, records = analysis_of(out)
    old, _, base_records = analysis_of(baseline)
    ts = load_taskset(plan["taskset_arg"])
    v = compare(
        old,
        new,
        base_records,
        records,
        {i.id: i for i in ts.items},
        docs={d.id: d.text for d in ts.docs.values()},
    )
    (out / "verdict.json").write_text(json.dumps(v.to_json(), indent=2))
    for e in v.levels:
        console.print(
            f"level {e.level:g}: baseline {e.baseline_accuracy:.0%} -> now {e.accuracy:.0%}; drop "
            f"from the reference {e.baseline_drop:+.0%} -> {e.drop:+.0%} (change {e.change:+.0%}, "
            f"95% CI {e.change_ci[0]:+.0%}..{e.change_ci[1]:+.0%}, {e.n_items} items)"
        )
    colour = {"holds": "[bold green]", "moved": "[bold red]"}.get(v.outcome, "[bold yellow]")
    console.print(colour + v.text)
    return v.exit_code


def merge(args: argparse.Namespace, console: Console) -> int:
    out = Path(args.out)
    plans = []
    for d in args.shards:
        p = Path(d) / "plan.json"
        if not p.exists():
            raise SweepUsageError(f"{d}: not a run directory (no plan.json)")
        plans.append(json.loads(p.read_text()))
    same = (
        "taskset",
        "model",
        "window",
        "levels",
        "repeats",
        "seed",
        "max_tokens",
        "shared_haystack",
    )
    for p in plans[1:]:
        for k in same:
            if p.get(k) != plans[0].get(k):
                raise SweepUsageError(
                    f"the shards disagree on {k}: they are not parts of one sweep"
                )
    parts = [tuple(p["shard"]) for p in plans if p.get("shard")]
    if parts:
        n = parts[0][1]
        indices = sorted(i for i, _ in parts)
        if len(parts) != len(plans) or any(m != n for _, m in parts) or indices != list(range(n)):
            raise SweepUsageError(
                f"the shards are not one whole sweep: got {', '.join(f'{i}/{m}' for i, m in parts) or 'none'}"
                f" for {len(plans)} run(s); give each of 0/{n}..{n - 1}/{n} once"
            )
    merged_plan = dict(plans[0]) | {
        "shard": None,
        "run_id": out.name,
        "merged_from": [p["run_id"] for p in plans],
        "item_ids": plans[0]["item_ids"]
        if all(p["item_ids"] == plans[0]["item_ids"] for p in plans)
        else sorted({i for p in plans for i in p["item_ids"]}),
    }
    out.mkdir(parents=True, exist_ok=True)
    log = CallLog(out / "calls.jsonl")
    have = set(log.records())
    for d in args.shards:
        for key, rec in CallLog(Path(d) / "calls.jsonl").records().items():
            if key not in have:
                log.append(rec)
                have.add(key)
    (out / "plan.json").write_text(json.dumps(merged_plan, indent=2))
    console.print(f"merged {len(args.shards)} shard(s): {len(have)} calls -> {out}")
    return report(out, console)


def derive(args: argparse.Namespace, console: Console) -> int:
    out = Path(args.run)
    if not (out / "plan.json").exists():
        raise SweepUsageError(f"{out}: not a run directory (no plan.json)")
    a, plan, records = analysis_of(
        out, args.tolerance, args.margin, args.min_accuracy, args.include_closed_book
    )
    refusals = a.blocking(args.accept_unresolved)
    if refusals and args.force and a.ceiling_level is not None:
        for why in refusals:
            console.print(f"[bold yellow]forced past:[/] {why}")
    elif refusals:
        for why in refusals:
            console.print(f"[bold red]refused:[/] {why}")
        print(
            f"ceiling sweep derive: no ceiling written for {out}: {refusals[0]}",
            file=sys.stderr,
        )
        return 1
    try:
        entry = entry_from(a, plan, records, args.model, args.workload)
        if args.mode:
            entry = entry.model_copy(update={"mode": args.mode})
        existing = load_document(args.merge) if args.merge else None
    except (DeriveError, CeilingsError) as exc:
        raise SweepUsageError(str(exc)) from exc
    doc = merged(existing, entry)
    target = Path(args.out) if args.out else out / "ceilings.yaml"
    write_atomically(target, dump_document(doc))
    if not a.resolved and not args.force:
        console.print(
            "[bold yellow]unresolved[/]: written because --accept-unresolved was given; the "
            "provenance says so"
        )
    console.print(
        f"{entry.model}/{entry.workload}: ceiling {entry.ceiling_tokens:,} tokens "
        f"({entry.ceiling_utilization:.1%} of {entry.window:,}), document version {doc.version} -> {target}"
    )
    return 0
