"""The reduced regression sweep: is a stored ceiling still right after a change?

Three levels (the reference, the baseline's ceiling level and the first level above it), three
repeats, the baseline's items (as many as the tolerance needs), paired item by item against the
baseline run. What is compared is the *drop relative to the reference*, now against then (a
difference in differences per item): a change that lowers every level alike (a new skeleton, a
weaker model) moves no ceiling, and one that steepens the drop does, even where absolute
accuracy at a level barely moved.

The burden of proof is on "holds": the verdict is ``holds`` only when the stored ceiling level
is shown within its tolerance *now* (the one the ceiling was written at: the asked one, or the
wider one a baseline that could not resolve it stated, :func:`stated`): its drop from the
reference now has a one-sided 95% lower bound above ``-tolerance`` (if the ceiling has really
become unsafe, that happens in at most 5% of checks). Two estimates of that drop, and the more
precise one (the smaller standard error) is bounded
(:func:`~context_ceiling.sweep.statistics.drop_now_lower`): the drop the baseline measured on
all its items plus the change measured on the items paired since (the baseline's own calls are
the pairing's control: an endpoint that answers the same calls the same way shows almost no
change, and the check is then nearly as sure as the baseline was, on a fraction of its calls),
and the drop measured now alone (what an endpoint that samples fresh answers needs: its change
carries the baseline's noise twice). ``moved`` when at any level the
95% interval of the change in drop lies wholly outside ``±tolerance`` (a real drop, or a real gain
that would allow a higher ceiling); otherwise ``inconclusive``: re-sweep (too few items, or a
change near the tolerance). Exit status 0, 1, 3. ``benchmarks/validity.py`` measures both rates.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from context_ceiling.sweep.analysis import analysis_of, graded, item_means
from context_ceiling.sweep.calllog import Row
from context_ceiling.sweep.curve import Analysis, mean
from context_ceiling.sweep.statistics import difference_interval, drop_now_lower
from context_ceiling.sweep.taskset import Item

EXIT = {"holds": 0, "moved": 1, "inconclusive": 3}


def reduced_levels(baseline: Analysis) -> list[float]:
    levels = [s.level for s in baseline.chain] or [s.level for s in baseline.levels]
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
    change: float  # change of the drop relative to the reference (now - then)
    change_ci: tuple[float, float]
    n_items: int = 0  # paired with the baseline
    n_items_now: int = 0  # measured now at this level and the reference
    drop_lower: float = 0.0  # one-sided 95% lower bound of the drop now (the sweep's rule)
    baseline_drop: float = 0.0
    drop: float = 0.0


@dataclass
class Verdict:
    outcome: str  # holds | moved | inconclusive
    baseline_ceiling_level: float | None
    ceiling_level: float | None
    levels: list[LevelEvidence]
    tolerance: float = 0.05
    reasons: list[str] = field(default_factory=list)

    @property
    def holds(self) -> bool:
        return self.outcome == "holds"

    @property
    def exit_code(self) -> int:
        return EXIT[self.outcome]

    def moved(self) -> list[LevelEvidence]:
        t = self.tolerance
        return [e for e in self.levels if e.change_ci[1] < -t or e.change_ci[0] > t]

    @property
    def text(self) -> str:
        if self.outcome == "holds":
            return (
                f"ceiling holds: at the stored ceiling level ({self.baseline_ceiling_level}) the "
                f"drop from the reference is within the ceiling's tolerance "
                f"({self.tolerance:.0%}) now, with 95% confidence"
            )
        if self.outcome == "moved":
            what = "; ".join(
                f"level {e.level:g}: drop {e.baseline_drop:+.0%} -> {e.drop:+.0%}"
                for e in self.moved()
            )
            return f"ceiling moved: {what}; re-sweep before trusting the stored ceiling"
        return "inconclusive: re-sweep (" + "; ".join(self.reasons) + ")"

    def to_json(self) -> dict[str, Any]:
        return asdict(self) | {"verdict": self.text, "holds": self.holds}


def compare(
    baseline: Analysis,
    reduced: Analysis,
    base_records: list[Row],
    new_records: list[Row],
    items: dict[str, Item],
    seed: int = 0,
    tolerance: float | None = None,
    docs: dict[str, str] | None = None,
) -> Verdict:
    del seed
    then = item_means(graded(base_records, items, docs))
    now = item_means(graded(new_records, items, docs))
    return compare_means(baseline, reduced, then, now, tolerance)


def stated(baseline: Analysis) -> float:
    """The tolerance a check holds the stored ceiling to: the one it was written at. A ceiling
    the baseline could resolve only at a wider tolerance than asked (a small task set, a
    budget) promised that wider one; held to the narrower, it could never be shown to hold."""
    return max(baseline.tolerance, baseline.stated_tolerance or 0.0)


def compare_means(
    baseline: Analysis,
    reduced: Analysis,
    then: dict[float, dict[str, float]],
    now: dict[float, dict[str, float]],
    tolerance: float | None = None,
) -> Verdict:
    """The verdict from per-item mean correctness by level, then and now."""
    tol = tolerance if tolerance is not None else stated(baseline)
    ref = baseline.reference_level if baseline.reference_level is not None else min(now, default=0)
    evidence = []
    for lv in sorted(now):
        if lv == ref:
            continue
        common = [
            k
            for k in now[lv]
            if k in then.get(lv, {}) and k in now.get(ref, {}) and k in then.get(ref, {})
        ]
        if not common:
            continue
        drop_then = {k: then[lv][k] - then[ref][k] for k in common}
        drop_now = {k: now[lv][k] - now[ref][k] for k in common}
        dd = [drop_now[k] - drop_then[k] for k in common]
        now_all = [now[lv][k] - now[ref][k] for k in now[lv] if k in now.get(ref, {})]
        # the drop now = the drop the baseline measured on all its items + the change measured on
        # the items paired since (the baseline's calls are the pairing's control)
        then_all = [then[lv][k] - then[ref][k] for k in then.get(lv, {}) if k in then.get(ref, {})]
        evidence.append(
            LevelEvidence(
                level=lv,
                baseline_accuracy=mean(then[lv][k] for k in common),
                accuracy=mean(now[lv][k] for k in common),
                change=mean(dd),
                change_ci=difference_interval(dd),
                drop_lower=drop_now_lower(then_all, dd, now_all),
                n_items=len(common),
                n_items_now=len(now_all),
                baseline_drop=mean(drop_then.values()),
                drop=mean(drop_now.values()),
            )
        )
    deciding = [
        e for e in evidence if baseline.ceiling_level is None or e.level >= baseline.ceiling_level
    ]
    v = Verdict("inconclusive", baseline.ceiling_level, reduced.ceiling_level, evidence, tol)
    incomplete = [s.level for s in reduced.levels if not s.complete]
    if incomplete:
        v.reasons.append(
            "incomplete level(s) " + ", ".join(f"{x:g}" for x in incomplete) + ": --resume"
        )
    if not deciding:
        v.reasons.append(
            "no level at or above the stored ceiling could be paired with the baseline"
        )
    at = [e for e in deciding if e.level == baseline.ceiling_level] or deciding[:1]
    if v.moved():
        v.outcome = "moved"
    elif at and not incomplete and all(e.drop_lower > -tol for e in at):
        v.outcome = "holds"
    elif not v.reasons:
        worst = min(at, key=lambda e: e.drop_lower)
        v.reasons.append(
            f"at the stored ceiling level {worst.level:g} the drop from the reference is now "
            f"{worst.drop:+.0%} (one-sided 95% bound {worst.drop_lower:+.0%}) on "
            f"{worst.n_items_now} items: not shown to be within the tolerance ({tol:.0%})"
        )
    return v


def verdict(out: Path, baseline: Path, console: Console) -> int:
    """A ``--reduced`` run against its baseline: ``verdict.json``, the lines, and the exit status
    (0 holds, 1 moved, 3 inconclusive)."""
    new = analysis_of(out)
    old = analysis_of(baseline)
    ts = new.taskset
    v = compare(
        old.analysis,
        new.analysis,
        old.rows,
        new.rows,
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
