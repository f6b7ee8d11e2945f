"""Latency at concurrency 1 measured in tight pairs: the instrument for a sub-millisecond claim.

The main table visits every target once a round, so two targets' c=1 figures are taken tens of
seconds apart, and on a shared 2-core machine the p50 of one target drifts by ±0.5 ms between
hours. A claim like "within 0.5 ms of the bare pass-through" cannot be judged from three such
rounds. Here the compared targets run back to back, in alternating order, for many short rounds;
each round gives one difference (p50, and CPU per request), and the figure is their median with
the min-max. Drift slower than a round cancels out.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks import targets as tg
from benchmarks.load import spread, wrk


def measure(
    started: dict[str, tg.Target],
    names: list[str],
    body: Path,
    rounds: int,
    seconds: float,
    wrk_bin: str,
) -> dict[str, Any]:
    """``rounds`` rounds of ``names`` at c=1, back to back, the order reversed every other
    round; per target the p50 and the CPU per request of each round, and per target after the
    first (the baseline) the paired differences against it."""
    per: dict[str, list[tuple[float, float]]] = {n: [] for n in names}
    errors = dict.fromkeys(names, 0)
    for n in names:  # warm: connections, caches
        wrk(wrk_bin, started[n].url, body, 1, 1)
    for r in range(rounds):
        for n in names if r % 2 == 0 else names[::-1]:
            t = started[n]
            cpu0 = t.cpu_seconds()
            load = wrk(wrk_bin, t.url, body, 1, seconds)
            cpu = t.cpu_seconds() - cpu0
            per[n].append((load.p50 * 1e3, cpu / max(1, load.requests) * 1e3))
            errors[n] += load.errors
    base = names[0]
    out: dict[str, Any] = {"baseline": base, "rounds": rounds, "seconds": seconds, "targets": {}}
    for n in names:
        row: dict[str, Any] = {
            "p50_ms": spread([p for p, _ in per[n]]),
            "cpu_ms_per_request": spread([c for _, c in per[n]]),
            "errors": errors[n],
        }
        if n != base:
            pairs = list(zip(per[base], per[n], strict=True))
            row["added_p50_ms"] = spread([b[0] - a[0] for a, b in pairs])
            row["added_cpu_ms"] = spread([b[1] - a[1] for a, b in pairs])
        out["targets"][n] = row
    return out
