"""From an analysed run to a ceilings entry (the shared schema), with provenance and fingerprint."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime
from typing import Any

from context_ceiling.core.ceilings import (
    CeilingEntry,
    CeilingsDocument,
    Provenance,
    TrafficFingerprint,
)
from context_ceiling.sweep.analysis import Analysis


class DeriveError(ValueError):
    pass


def entry_from(
    analysis: Analysis,
    plan: dict[str, Any],
    records: list[dict[str, Any]],
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
    versions = Counter(r.get("model_reported") for r in records if r.get("model_reported"))
    docs = sum(r["n_docs"] for r in at) / len(at) if at else 0.0
    return CeilingEntry(
        model=model,
        workload=workload,
        ceiling_tokens=analysis.ceiling_tokens,
        ceiling_utilization=round(analysis.ceiling_tokens / analysis.window, 6),
        window=analysis.window,
        output_reservation=int(plan["max_tokens"]),
        metric="accuracy",
        tolerance=analysis.tolerance,
        margin=analysis.margin,
        created_at=datetime.now(UTC),
        provenance=Provenance(
            sweep_run_id=plan["run_id"],
            task_set=plan["taskset"]["name"],
            task_set_hash=plan["taskset"]["hash"],
            prompt_skeleton_hash=plan["taskset"]["skeleton_hash"],
            corpus_hash=plan["taskset"]["corpus_hash"],
            retrieval={
                "documents_per_prompt": round(docs, 1),
                "shared_haystack": plan["shared_haystack"],
            },
            model_version=versions.most_common(1)[0][0] if versions else None,
            note=f"level {analysis.ceiling_level} measured at utilization "
            f"{next(s.utilization for s in analysis.levels if s.level == analysis.ceiling_level)}"
            + ("" if analysis.resolved else "; UNRESOLVED")
            + ("; REFUSED, written with --force" if analysis.blocking(True) else ""),
            decision=_decision(analysis),
        ),
        fingerprint=TrafficFingerprint(
            system_tokens=float(plan["system_tokens"]),
            tool_definition_tokens=0.0,
            retrieved_chunks=round(docs, 2),
            retrieved_chunk_tokens=float(plan["mean_doc_tokens"]),
        ),
    )


def _decision(a: Analysis) -> dict[str, Any]:
    """How firmly the number stands: the deciding level and its interval."""
    d = a.level(a.deciding_level)
    return {
        "resolved": a.resolved,
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
