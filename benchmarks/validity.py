"""Validity of the sweep's number: a simulation study against known truth.

It drives the sweep's own code (``context_ceiling.sweep.analysis.analyse_graded``, ``context_ceiling.sweep.design.next_step``,
``context_ceiling.sweep.regression.compare_means``, the level grid of ``context_ceiling.sweep.run``, the sample size of
``context_ceiling.sweep.statistics``) with outcomes drawn from accuracy curves that are known exactly:

- a task set of 240 items whose difficulty varies (item effects on the logit scale, SD 1), 5%
  known to the model without documents (answered right closed-book and at every fill);
- cliff-shaped drops (accuracy falls to about 15% within ~3% of fill) and gradual ones (a linear
  fall on the logit scale), knees uniform over 0.3-0.9, base accuracy uniform over 0.6-0.98;
- three repeats per item and level, correlated within the item (a repeat copies the first
  outcome with probability 0.5, as near-greedy sampling does).

The truth for a fill u is the population accuracy p(u) (Gauss-Hermite quadrature over the item
effects), and the true drop point u* the highest fill with p(u) - p(ref) >= -tolerance. Reported:
how often the enforced ceiling is at or below u*, how often the ceiling level is within 0.05
below u* (base accuracy >= 0.8), refusals, calls against a fixed 0.05-step grid of the same
items, the coverage of the 95% intervals at every item count, the regression verdicts on
unchanged and on really moved curves, and the two refusal cases (a model at 0%, a model that
answers from memory).

``python -m benchmarks.validity [--runs N] [--seed S] [--json FILE]``; ``make bench-validity``.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from context_ceiling.sweep.analysis import Analysis, Design, analyse_graded, item_means
from context_ceiling.sweep.design import batch_size, next_step
from context_ceiling.sweep.plan import levels_for
from context_ceiling.sweep.regression import compare_means, reduced_levels
from context_ceiling.sweep.statistics import accuracy_interval, difference_interval, items_for

WINDOW, RESERVATION, TOL, MARGIN, RESOLUTION, REPEATS = 8192, 100, 0.05, 0.1, 0.05, 3
TASKSET, SIGMA, KNOWN, RHO = 960, 1.0, 0.05, 0.5
NODES, WEIGHTS = np.polynomial.hermite.hermgauss(40)


def _sig(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def _logit(p: float) -> float:
    return math.log(p / (1 - p))


@dataclass(frozen=True)
class Curve:
    shape: str  # cliff | gradual
    knee: float
    base: float

    def shift(self, u: float) -> float:
        """The logit shift at fill u (0 before the knee)."""
        fall = _logit(self.base) - _logit(0.15)
        if self.shape == "cliff":
            return -fall / (1 + math.exp(-(u - self.knee - 0.015) / 0.005))
        return -fall * max(0.0, u - self.knee) / 0.3

    def p_item(self, effect: float, u: float) -> float:
        return _sig(_logit(self.base) + effect + self.shift(u))

    def p(self, u: float) -> float:
        """Population accuracy of the items not known closed-book."""
        x = _logit(self.base) + self.shift(u) + SIGMA * math.sqrt(2) * NODES
        return float(np.sum(WEIGHTS / (1 + np.exp(-x))) / math.sqrt(math.pi))

    def drop_point(self, ref: float, limit: float) -> float:
        p0 = self.p(ref)
        u = ref
        for k in range(int(ref * 1000), int(limit * 1000) + 1):
            if self.p(k / 1000) - p0 >= -TOL:
                u = k / 1000
            else:
                break
        return u


@dataclass
class Model:
    """Outcomes for one task set under one curve; ``known`` items are right without documents."""

    curve: Curve
    effects: list[float]
    known: list[bool]
    rng: random.Random

    def outcomes(self, i: int, u: float | None) -> list[int]:
        if self.known[i]:
            return [int(self.rng.random() < 0.97) for _ in range(1 if u is None else REPEATS)]
        if u is None:
            return [int(self.rng.random() < 0.02)]
        p = self.curve.p_item(self.effects[i], u)
        first = int(self.rng.random() < p)
        return [first] + [
            first if self.rng.random() < RHO else int(self.rng.random() < p)
            for _ in range(REPEATS - 1)
        ]


class SimRun:
    """One sweep as ``ceiling sweep run`` does it, with simulated calls."""

    def __init__(self, model: Model, order: list[int]) -> None:
        self.m, self.order = model, order
        self.records: list[dict[str, Any]] = []
        self.levels = levels_for("0.2,0.5,0.8,max", WINDOW, RESERVATION, 0.1)
        self.reference = 0.2
        self.planned = min(TASKSET, items_for(TOL, REPEATS))
        self.target = TASKSET
        self.drawn = max(20, -(-self.planned // 2))
        self.n_at = {lv: self.drawn for lv in self.levels}
        self.n_control = self.drawn

    def _measure(self, lv: float | None, ids: list[int]) -> None:
        for i in ids:
            for r, ok in enumerate(self.m.outcomes(i, lv)):
                self.records.append(
                    {
                        "key": f"i{i}@closed" if lv is None else f"i{i}@{lv:.4f}#{r}",
                        "item": f"i{i}",
                        "level": lv,
                        "repeat": r,
                        "control": lv is None,
                        "correct": ok,
                        "bucket": "correct" if ok else "missed",
                        "utilization": lv or 0.0,
                        "prompt_tokens": round((lv or 0.0) * WINDOW),
                        "status": "ok",
                    }
                )

    def design(self) -> Design:
        ids = [f"i{i}" for i in self.order]
        return Design(
            {lv: ids[: self.n_at[lv]] for lv in self.levels},
            REPEATS,
            ids[: self.n_control],
            self.reference,
        )

    def analyse(self) -> Analysis:
        return analyse_graded(self.records, self.records, WINDOW, TOL, MARGIN, design=self.design())

    def run(self) -> Analysis:
        self._measure(None, self.order[: self.n_control])
        for lv in self.levels:
            self._measure(lv, self.order[: self.n_at[lv]])
        while True:
            a = self.analyse()
            step = next_step(
                a,
                drawn=self.drawn,
                target_items=self.target,
                refine=True,
                adaptive=True,
                resolution=RESOLUTION,
                batch=batch_size(self.planned),
            )
            if step is None:
                return a
            if step.kind == "items":
                new = self.order[self.drawn : self.drawn + step.new_items]
                self.drawn += len(new)
                self._measure(None, new)
                self.n_control = self.drawn
                for lv in step.levels:
                    self._measure(lv, self.order[self.n_at[lv] : self.drawn])
                    self.n_at[lv] = self.drawn
            else:
                for lv in step.levels:
                    self.n_at[lv] = self.n_at[self.reference]
                    self._measure(lv, self.order[: self.n_at[lv]])
                    self.levels = sorted({*self.levels, lv})

    def grid_calls(self) -> int:
        """Calls of a fixed 0.05-step grid on the same number of items (as many as this run's
        deciding level ended with)."""
        limit = self.levels[-1]
        grid = [0.1] + [round(0.2 + 0.05 * k, 2) for k in range(int((limit - 0.2) / 0.05) + 1)]
        return self.drawn * (1 + REPEATS * len(grid))


def make_model(curve: Curve, rng: random.Random) -> Model:
    effects = [rng.gauss(0, SIGMA) for _ in range(TASKSET)]
    known = [rng.random() < KNOWN for _ in range(TASKSET)]
    return Model(curve, effects, known, rng)


def regression(
    base: SimRun, a: Analysis, curve: Curve, rng: random.Random
) -> tuple[str, str] | None:
    """(verdict on the unchanged curve, verdict on a curve whose drop really moved below the
    stored ceiling level), each from a reduced sweep as ``--reduced`` plans it."""
    if a.ceiling_level is None or a.ceiling_level == a.reference_level:
        return None
    levels = reduced_levels(a)
    n = min(base.drawn, items_for(TOL / 2**0.5, REPEATS))
    ids = base.order[:n]
    then = item_means(r for r in base.records if r["item"] in {f"i{i}" for i in ids})

    def reduced(model: Model) -> str:
        sim = SimRun(model, base.order)
        sim.levels, sim.n_at = levels, {lv: n for lv in levels}
        sim.n_control = 0
        for lv in levels:
            sim._measure(lv, ids)
        return compare_means(a, sim.analyse(), then, item_means(sim.records)).outcome

    same = reduced(Model(curve, base.m.effects, base.m.known, rng))
    ref, lv = a.reference_level or 0.2, a.ceiling_level
    for _ in range(50):
        moved = Curve(curve.shape, rng.uniform(max(0.21, lv - 0.3), lv), curve.base)
        if moved.p(lv) - moved.p(ref) < -TOL:
            return same, reduced(Model(moved, base.m.effects, base.m.known, rng))
    return same, "n/a"


def coverage(rng: random.Random, sets: int) -> dict[int, dict[str, float]]:
    """Share of data sets whose 95% intervals contain the truth, by items per level."""
    out = {}
    for n in (10, 20, 30, 60, 120, 240):
        hits = {"accuracy": 0, "difference": 0, "accuracy_n": 0, "difference_n": 0}
        lo_above = 0
        for _ in range(sets):
            curve = Curve(
                rng.choice(["cliff", "gradual"]), rng.uniform(0.3, 0.9), rng.uniform(0.6, 0.98)
            )
            m = make_model(curve, rng)
            m.known = [False] * TASKSET
            m.effects = [rng.gauss(0, SIGMA) for _ in range(n)]
            lvs = [0.2, rng.uniform(0.3, 0.95)]
            means = {lv: [sum(m.outcomes(i, lv)) / REPEATS for i in range(n)] for lv in lvs}
            for lv in lvs:
                lo, hi = accuracy_interval(means[lv])
                hits["accuracy"] += lo <= curve.p(lv) <= hi
                hits["accuracy_n"] += 1
            d = [b - a_ for a_, b in zip(means[lvs[0]], means[lvs[1]], strict=True)]
            lo, hi = difference_interval(d)
            truth = curve.p(lvs[1]) - curve.p(lvs[0])
            hits["difference"] += lo <= truth <= hi
            lo_above += lo > truth
            hits["difference_n"] += 1
        out[n] = {
            "accuracy": hits["accuracy"] / hits["accuracy_n"],
            "difference": hits["difference"] / hits["difference_n"],
            "difference_lower_above_truth": lo_above / hits["difference_n"],
        }
    return out


def refusal_cases(rng: random.Random) -> dict[str, bool]:
    """Does the analysis refuse a model at 0%, and one that answers from memory?"""
    order = list(range(TASKSET))
    zero = make_model(Curve("cliff", 0.6, 0.5), rng)
    zero.known = [False] * TASKSET
    zero.curve = Curve("cliff", 0.6, 1e-6)
    memory = make_model(Curve("cliff", 0.6, 0.5), rng)
    memory.known = [rng.random() < 0.7 for _ in range(TASKSET)]
    memory.curve = Curve("cliff", 2.0, 1e-6)  # the documents never help
    res = {}
    for name, m in (("zero_accuracy", zero), ("answers_from_memory", memory)):
        a = SimRun(m, order).run()
        res[name + "_refused"] = bool(a.blocking())
        sim = SimRun(m, order)
        sim.run()
        b = analyse_graded(
            sim.records,
            sim.records,
            WINDOW,
            TOL,
            MARGIN,
            design=sim.design(),
            include_closed_book=True,
        )
        res[name + "_refused_with_closed_book_items"] = bool(b.blocking())
    return res


def study(runs: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    rows = []
    t0 = time.perf_counter()
    for k in range(runs):
        shape = "cliff" if k % 2 == 0 else "gradual"
        curve = Curve(shape, rng.uniform(0.3, 0.9), rng.uniform(0.6, 0.98))
        m = make_model(curve, rng)
        order = list(range(TASKSET))
        rng.shuffle(order)
        sim = SimRun(m, order)
        a = sim.run()
        u_star = curve.drop_point(0.2, sim.levels[-1])
        written = not a.blocking()
        reg = regression(sim, a, curve, rng)
        rows.append(
            {
                "shape": shape,
                "knee": curve.knee,
                "base": curve.base,
                "u_star": u_star,
                "written": written,
                "resolved": a.resolved,
                "ceiling_level": a.ceiling_level,
                "ceiling_utilization": a.ceiling_utilization,
                "safe": (not written) or (a.ceiling_utilization or 0) <= u_star,
                "placed": written
                and a.ceiling_level is not None
                and u_star - 0.05 <= a.ceiling_level <= u_star,
                "calls": len(sim.records),
                "grid_calls": sim.grid_calls(),
                "items": sim.drawn,
                "regression": reg,
            }
        )
    return {
        "runs": rows,
        "coverage": coverage(rng, max(200, runs)),
        "refusals": refusal_cases(rng),
        "seconds": round(time.perf_counter() - t0, 1),
    }


def _share(rows: list[dict[str, Any]], key: str) -> str:
    return f"{sum(bool(r[key]) for r in rows) / len(rows):.1%}" if rows else "-"


def table(res: dict[str, Any]) -> str:
    lines = [
        "| drops | runs | ceiling written | enforced ceiling <= true drop point | ceiling level within 0.05 below it (base >= 0.8) | median items | calls / fixed 0.05 grid |",
        "|---|---|---|---|---|---|---|",
    ]
    for shape in ("cliff", "gradual", "all"):
        rs = [r for r in res["runs"] if shape in ("all", r["shape"])]
        hi = [r for r in rs if r["base"] >= 0.8]
        items = sorted(r["items"] for r in rs)
        ratio = sum(r["calls"] for r in rs) / sum(r["grid_calls"] for r in rs)
        lines.append(
            f"| {shape} | {len(rs)} | {_share(rs, 'written')} | {_share(rs, 'safe')} | "
            f"{_share(hi, 'placed')} | {items[len(items) // 2]} | {ratio:.2f} |"
        )
    lines += [
        "",
        "| items per level | accuracy CI covers | paired-difference CI covers | lower bound above the truth |",
        "|---|---|---|---|",
    ]
    for n, c in res["coverage"].items():
        lines.append(
            f"| {n} | {c['accuracy']:.1%} | {c['difference']:.1%} | {c['difference_lower_above_truth']:.1%} |"
        )
    regs = [r["regression"] for r in res["runs"] if r["regression"]]
    same = [s for s, _ in regs]
    moved = [m for _, m in regs if m != "n/a"]
    lines += [
        "",
        "| regression check | cases | holds | moved | inconclusive |",
        "|---|---|---|---|---|",
    ]
    for name, vs in (("curve unchanged", same), ("drop moved below the stored ceiling", moved)):
        if vs:
            lines.append(
                f"| {name} | {len(vs)} | "
                + " | ".join(
                    f"{vs.count(o) / len(vs):.1%}" for o in ("holds", "moved", "inconclusive")
                )
                + " |"
            )
    lines += ["", "| refusal case | derive refuses |", "|---|---|"]
    for k, v in res["refusals"].items():
        lines.append(f"| {k.replace('_', ' ')} | {'yes' if v else 'NO'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=300)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", help="write the raw results here")
    args = ap.parse_args(argv)
    res = study(args.runs, args.seed)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1, default=str))
    print(table(res))
    print(f"\n({args.runs} simulated sweeps, seed {args.seed}, {res['seconds']} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
