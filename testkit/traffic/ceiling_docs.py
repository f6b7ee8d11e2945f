"""Helpers to build ceilings documents in tests."""

from __future__ import annotations

from typing import Any


def entry(
    model: str = "gpt-4o",
    workload: str = "default",
    tokens: int = 64000,
    window: int = 128000,
    **kw: Any,
) -> dict[str, Any]:
    e: dict[str, Any] = {
        "model": model,
        "workload": workload,
        "ceiling_tokens": tokens,
        "ceiling_utilization": round(tokens / window, 6),
        "window": window,
        "output_reservation": 4096,
        "tolerance": 0.05,
        "margin": 0.1,
        "created_at": "2026-11-01T00:00:00Z",
        "provenance": {
            "sweep_run_id": "run-1",
            "task_set_hash": "sha256:aa",
            "model_version": "gpt-4o-2024-08-06",
        },
    }
    e.update(kw)
    return e


def doc(version: int, *entries: dict[str, Any]) -> dict[str, Any]:
    return {"schema_version": 1, "version": version, "entries": list(entries) or [entry()]}
