"""The reduced regression sweep: is a stored ceiling still right after a change?

Few items, three levels (the reference, the baseline's ceiling level and the first level that
failed above it), three repeats, paired item by item against the baseline run. At every level the accuracy
now is compared with the baseline's on the same items (paired, item-clustered bootstrap CI). The
verdict is "ceiling moved" when any level changed by more than the tolerance with its whole 95%
CI beyond it (a real drop, or a real gain that would allow a higher ceiling), else "ceiling
holds", with that evidence per level.
"""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import asdict, dataclass
from statistics import mean
from typing import Any

from sweep.analysis import Analysis, _boot, graded
from sweep.taskset import Item


def reduced_levels(baseline: Analysis) -> list[float]:
    levels = [s.level for s in baseline.levels]
    if baseline.ceiling_level is None:
        return levels[:3]
    above = [lv for lv in levels if lv > baseline.ceiling_level]
    chosen = {levels[0], baseline.ceiling_level, *(above[:1] or levels[-1:])}
    return sorted(chosen)


@dataclass
class LevelEvidence:
    level: float
    baseline_accuracy: float
    accuracy: float
    change: float
    change_ci: tuple[float, float]


@dataclass
class Verdict:
    holds: bool
    baseline_ceiling_level: float | None
    ceiling_level: float | None
    levels: list[LevelEvidence]
    tolerance: float = 0.05

    def moved(self) -> list[LevelEvidence]:
        t = self.tolerance
        return [e for e in self.levels if e.change_ci[1] < -t or e.change_ci[0] > t]

    @property
    def text(self) -> str:
        if self.holds:
            return (
                f"ceiling holds: no level's accuracy moved beyond the tolerance ({self.tolerance:.0%}) "
                f"against the baseline (baseline ceiling level {self.baseline_ceiling_level})"
            )
        what = "; ".join(
            f"level {e.level:g}: {e.baseline_accuracy:.0%} -> {e.accuracy:.0%}"
            for e in self.moved()
        )
        return f"ceiling moved: {what}; re-sweep before trusting the stored ceiling"

    def to_json(self) -> dict[str, Any]:
        return asdict(self) | {"verdict": self.text}


def compare(
    baseline: Analysis,
    reduced: Analysis,
    base_records: list[dict[str, Any]],
    new_records: list[dict[str, Any]],
    items: dict[str, Item],
    seed: int = 0,
    tolerance: float | None = None,
) -> Verdict:
    def per_item(records: list[dict[str, Any]]) -> dict[float, dict[str, float]]:
        acc: dict[float, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
        for r in graded(records, items):
            if not r["control"]:
                acc[float(r["level"])][r["item"]].append(int(r["correct"]))
        return {lv: {k: mean(v) for k, v in d.items()} for lv, d in acc.items()}

    then, now = per_item(base_records), per_item(new_records)
    rng = random.Random(seed)
    evidence = []
    for lv in sorted(now):
        common = [k for k in now[lv] if k in then.get(lv, {})]
        if not common:
            continue
        diffs = {k: now[lv][k] - then[lv][k] for k in common}
        evidence.append(
            LevelEvidence(
                level=lv,
                baseline_accuracy=mean(then[lv][k] for k in common),
                accuracy=mean(now[lv][k] for k in common),
                change=mean(diffs.values()),
                change_ci=_boot(diffs, rng, 2000),
            )
        )
    tol = baseline.tolerance if tolerance is None else tolerance
    v = Verdict(True, baseline.ceiling_level, reduced.ceiling_level, evidence, tol)
    v.holds = not v.moved()
    return v
