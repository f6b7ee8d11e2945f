"""``ceiling sweep derive``: from an analysed run to a ceilings entry (the shared schema), with
provenance and fingerprint, or the reasons there is none (exit status 1)."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console

from context_ceiling.ceilings.document import (
    CeilingEntry,
    CeilingsDocument,
    Provenance,
    TrafficFingerprint,
    dump_document,
    load_document,
    write_atomically,
)
from context_ceiling.core.errors import CeilingError, UserError
from context_ceiling.core.vocabulary import Mode
from context_ceiling.sweep.analysis import analysis_of
from context_ceiling.sweep.calllog import Row
from context_ceiling.sweep.curve import Analysis
from context_ceiling.sweep.plan import Plan


class DeriveError(UserError, ValueError):
    pass


def entry_from(
    analysis: Analysis,
    plan: Plan,
    records: list[Row],
    model: str,
    workload: str = "default",
) -> CeilingEntry:
    if (
        analysis.ceiling_tokens is None
        or analysis.ceiling_utilization is None
        or analysis.ceiling_level is None
    ):
        raise DeriveError(
            "no level passed: even the reference level is below tolerance, so there is no ceiling to derive"
        )
    at = [
        r for r in records if r.get("status") == "ok" and r.get("level") == analysis.ceiling_level
    ]
    ts = plan.taskset
    if ts is None:
        raise DeriveError(f"{plan.run_id}: the plan was never run (no task set recorded)")
    versions = Counter(r.get("model_reported") for r in records if r.get("model_reported"))
    docs = sum(r["n_docs"] for r in at) / len(at) if at else 0.0
    return CeilingEntry(
        model=model,
        workload=workload,
        ceiling_tokens=analysis.ceiling_tokens,
        ceiling_utilization=round(analysis.ceiling_tokens / analysis.window, 6),
        window=analysis.window,
        output_reservation=plan.spec.max_tokens,
        metric=ts.metric,
        tolerance=analysis.stated_tolerance or analysis.tolerance,
        margin=analysis.margin,
        created_at=datetime.now(UTC),
        provenance=Provenance(
            sweep_run_id=plan.run_id,
            task_set=ts.name,
            task_set_hash=ts.hash,
            prompt_skeleton_hash=ts.skeleton_hash,
            corpus_hash=ts.corpus_hash,
            retrieval={
                "documents_per_prompt": round(docs, 1),
                "shared_haystack": plan.spec.shared_haystack,
            },
            model_version=versions.most_common(1)[0][0] if versions else None,
            note=f"level {analysis.ceiling_level} measured at utilization "
            f"{next(s.utilization for s in analysis.levels if s.level == analysis.ceiling_level)}"
            + ("" if analysis.resolved else "; UNRESOLVED")
            + ("; AT THE REFERENCE: no level above it held" if analysis.at_reference else "")
            + ("; REFUSED, written with --force" if analysis.blocking(True) else ""),
            decision=_decision(analysis),
        ),
        # a task set built from captured traffic: the shape of that traffic (what live traffic
        # should keep looking like); otherwise the shape of the prompts the sweep measured
        fingerprint=TrafficFingerprint(**ts.fingerprint)
        if ts.fingerprint
        else TrafficFingerprint(
            system_tokens=float(plan.system_tokens or 0),
            tool_definition_tokens=0.0,
            retrieved_chunks=round(docs, 2),
            retrieved_chunk_tokens=float(plan.mean_doc_tokens or 0.0),
        ),
    )


def _decision(a: Analysis) -> dict[str, Any]:
    """How firmly the number stands: the deciding level and its interval."""
    d = a.level(a.deciding_level)
    return {
        "outcome": a.outcome,
        "resolved": a.resolved,
        "at_reference": a.at_reference,
        "decided_by": a.decided_by,
        "stated_tolerance": a.stated_tolerance,
        "deciding_level": a.deciding_level,
        "deciding_half_width": d.half_width if d else None,
        "reference_accuracy": next((s.accuracy for s in a.levels if s.role == "reference"), None),
        "closed_book_accuracy": a.closed_book_accuracy,
        "items": max((s.n_items for s in a.levels), default=0),
        "refusals": a.refusals,
    }


def merged(
    existing: CeilingsDocument | None, entry: CeilingEntry, version: int | None = None
) -> CeilingsDocument:
    """``existing`` with ``entry`` added or replaced, and the version bumped."""
    entries = [e for e in (existing.entries if existing else []) if e.key != entry.key] + [entry]
    v = version if version is not None else (existing.version + 1 if existing else 1)
    return CeilingsDocument(version=v, updated_at=datetime.now(UTC), entries=entries)


@dataclass(frozen=True)
class DeriveOptions:
    """``ceiling sweep derive``; ``None`` takes the run's own (tolerance, margin, floor)."""

    run: str
    model: str
    workload: str = "default"
    tolerance: float | None = None
    margin: float | None = None
    merge: str | None = None  # an existing ceilings document to add the entry to (version + 1)
    min_accuracy: float | None = None
    accept_unresolved: bool = False
    force: bool = False
    include_closed_book: bool = False
    out: str | None = None
    mode: Mode | None = None
    json: bool = False  # the result as one JSON object on stdout (the console is on stderr)


def derive(opts: DeriveOptions, console: Console) -> int:
    """Write the ceilings document; or print every refusal and raise (exit status 1)."""
    out = Path(opts.run)
    ra = analysis_of(out, opts.tolerance, opts.margin, opts.min_accuracy, opts.include_closed_book)
    a = ra.analysis
    refusals = a.blocking(opts.accept_unresolved)
    if refusals and opts.force and a.ceiling_level is not None:
        for why in refusals:
            console.print(f"[bold yellow]forced past:[/] {why}")
    elif refusals:
        for why in refusals:
            console.print(f"[bold red]refused:[/] {why}")
        if opts.json:
            print(json.dumps({"ok": False, "run": str(out), "refusals": refusals}, indent=2))
        raise CeilingError(f"no ceiling written for {out}: {refusals[0]}")
    entry = entry_from(a, ra.plan, ra.rows, opts.model, opts.workload)
    if opts.mode:
        entry = entry.model_copy(update={"mode": opts.mode})
    existing = load_document(opts.merge) if opts.merge else None
    doc = merged(existing, entry)
    target = Path(opts.out) if opts.out else out / "ceilings.yaml"
    write_atomically(target, dump_document(doc))
    if not a.resolved and not opts.force:
        console.print(
            "[bold yellow]unresolved[/]: written because --accept-unresolved was given; the "
            "provenance says so"
        )
    if a.at_reference:
        console.print(
            "[bold yellow]at the reference[/]: the ceiling is the reference level itself (no "
            "level above it held); it says little about where the drop is"
        )
    console.print(
        f"{entry.model}/{entry.workload}: ceiling {entry.ceiling_tokens:,} tokens "
        f"({entry.ceiling_utilization:.1%} of {entry.window:,}), document version {doc.version} -> {target}"
    )
    if opts.json:
        result = {
            "ok": True,
            "run": str(out),
            "document": str(target),
            "version": doc.version,
            "outcome": a.outcome,
            "resolved": a.resolved,
            "at_reference": a.at_reference,
            "forced_past": refusals if opts.force else [],
            "entry": entry.model_dump(mode="json"),
        }
        print(json.dumps(result, indent=2))
    return 0
