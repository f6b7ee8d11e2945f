"""Turn graded calls into a curve, and the curve into a ceiling.

Per level: mean accuracy, an item-clustered bootstrap 95% CI (items resampled with all their
repeats), the min-max of accuracy across repeats, and the failure-bucket shares. Each level is
compared with the reference level (the lowest, 20% by default) paired by item.

Ceiling rule: the highest measured level whose paired difference to the reference has a lower
95% bound above ``-tolerance``, with every lower level passing too. The enforced ceiling is that
level's measured utilization times ``(1 - margin)``. Levels are never interpolated: refinement
measures new levels (geometric midpoints) where the drop is.
"""

from __future__ import annotations

import itertools
import math
import random
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from statistics import mean
from typing import Any

from sweep.grade import BUCKETS, grade
from sweep.taskset import Item


@dataclass
class LevelStats:
    level: float
    utilization: float
    n_items: int
    n_calls: int
    accuracy: float
    ci: tuple[float, float]
    repeat_min: float
    repeat_max: float
    buckets: dict[str, float]
    diff: float = 0.0
    diff_ci: tuple[float, float] = (0.0, 0.0)
    passes: bool = True
    mean_prompt_tokens: float = 0.0
    gold_position_accuracy: dict[str, float] = field(default_factory=dict)


@dataclass
class Analysis:
    levels: list[LevelStats]
    tolerance: float
    margin: float
    window: int
    ceiling_level: float | None
    ceiling_utilization: float | None
    ceiling_tokens: int | None
    closed_book_flagged: list[str]
    errors: int
    warnings: list[str]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _boot(values: dict[str, float], rng: random.Random, b: int) -> tuple[float, float]:
    keys = list(values)
    if not keys:
        return (0.0, 0.0)
    stats = []
    for _ in range(b):
        sample = [values[rng.choice(keys)] for _ in keys]
        stats.append(sum(sample) / len(sample))
    stats.sort()
    return (stats[int(0.025 * b)], stats[min(b - 1, int(0.975 * b))])


def graded(records: Iterable[dict[str, Any]], items: dict[str, Item]) -> list[dict[str, Any]]:
    """Each ok record with its grade (the scorer applied to the log; re-grading is free)."""
    out = []
    for r in records:
        if r.get("status") != "ok" or r["item"] not in items:
            continue
        g = grade(items[r["item"]], r.get("text"), r.get("finish_reason"), r.get("shown"))
        out.append(r | {"correct": g.correct, "bucket": g.bucket})
    return out


def analyse(
    records: Iterable[dict[str, Any]],
    items: dict[str, Item],
    window: int,
    tolerance: float = 0.05,
    margin: float = 0.1,
    seed: int = 0,
    bootstrap: int = 2000,
) -> Analysis:
    all_records = list(records)
    rows = graded(all_records, items)
    errors = sum(1 for r in all_records if r.get("status") != "ok")
    flagged = sorted(r["item"] for r in rows if r["control"] and r["correct"])
    by_level: dict[float, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        if not r["control"]:
            by_level[float(r["level"])].append(r)
    levels = sorted(by_level)
    rng = random.Random(seed)
    item_means: dict[float, dict[str, float]] = {}
    stats: list[LevelStats] = []
    for lv in levels:
        rs = by_level[lv]
        per_item: dict[str, list[int]] = defaultdict(list)
        per_repeat: dict[int, list[int]] = defaultdict(list)
        for r in rs:
            per_item[r["item"]].append(int(r["correct"]))
            per_repeat[int(r["repeat"])].append(int(r["correct"]))
        im = {k: mean(v) for k, v in per_item.items()}
        item_means[lv] = im
        reps = [mean(v) for v in per_repeat.values()]
        counts = Counter(r["bucket"] for r in rs)
        pos: dict[str, list[int]] = defaultdict(list)
        for r in rs:
            p = r.get("gold_position")
            if p is not None:
                pos["front" if p < 1 / 3 else "middle" if p < 2 / 3 else "back"].append(
                    int(r["correct"])
                )
        stats.append(
            LevelStats(
                level=lv,
                utilization=round(mean(r["utilization"] for r in rs), 4),
                n_items=len(im),
                n_calls=len(rs),
                accuracy=mean(int(r["correct"]) for r in rs),
                ci=_boot(im, rng, bootstrap),
                repeat_min=min(reps),
                repeat_max=max(reps),
                buckets={b: counts.get(b, 0) / len(rs) for b in BUCKETS},
                mean_prompt_tokens=round(mean(r["prompt_tokens"] for r in rs), 1),
                gold_position_accuracy={k: round(mean(v), 3) for k, v in sorted(pos.items())},
            )
        )
    warnings: list[str] = []
    ceiling_level: float | None = None
    if stats:
        ref = item_means[stats[0].level]
        for s in stats:
            common = [k for k in ref if k in item_means[s.level]]
            diffs = {k: item_means[s.level][k] - ref[k] for k in common}
            s.diff = mean(diffs.values()) if diffs else 0.0
            s.diff_ci = _boot(diffs, rng, bootstrap) if s is not stats[0] else (0.0, 0.0)
        ok = True
        for s in stats:
            s.passes = ok and s.diff_ci[0] > -tolerance
            ok = s.passes
            if s.passes:
                ceiling_level = s.level
        widths = [(s.diff_ci[1] - s.diff_ci[0]) / 2 for s in stats[1:]]
        if widths and max(widths) > tolerance:
            warnings.append(
                f"the tolerance ({tolerance:.0%}) is finer than this run can resolve: paired-difference CIs are "
                f"up to ±{max(widths):.0%} wide; add items or repeats before trusting a ceiling at this tolerance"
            )
    if flagged:
        warnings.append(
            f"{len(flagged)} item(s) answered correctly with no documents (closed-book): {', '.join(flagged[:10])}"
        )
    if errors:
        warnings.append(
            f"{errors} call(s) failed after retries and are not scored; --resume retries them"
        )
    cu = ct = None
    if ceiling_level is not None:
        level_util = next(s.utilization for s in stats if s.level == ceiling_level)
        cu = round(level_util * (1 - margin), 4)
        ct = math.floor(cu * window)
    return Analysis(
        stats, tolerance, margin, window, ceiling_level, cu, ct, flagged, errors, warnings
    )


def refinements(
    stats: list[LevelStats], tolerance: float, resolution: float, measured: set[float]
) -> list[float]:
    """Where to measure next: the geometric midpoint of the bracket that decides the ceiling (the
    highest passing level and the first failing one), when accuracy drops across it by more than
    the tolerance and the bracket is still wider than the resolution asked for. Drops between two
    failing levels cannot move the ceiling and are left alone."""
    for a, b in itertools.pairwise(stats):
        if a.passes and not b.passes:
            if a.diff - b.diff > tolerance and b.level - a.level > resolution:
                mid = round(math.sqrt(a.level * b.level), 4)
                if mid not in measured:
                    return [mid]
            return []
    return []
