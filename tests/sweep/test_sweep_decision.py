"""The sweep's number can be acted on: refusals, resolution, regression burden, reasoning models.

Runs the real ``ceiling sweep`` command line against the scripted model double (a stand-in for a
model whose accuracy curve is known) on loopback.
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from context_ceiling.ceilings.document import load_document
from context_ceiling.sweep.analysis import analyse_graded
from context_ceiling.sweep.calllog import Row
from context_ceiling.sweep.curve import Design
from context_ceiling.sweep.decision import SCAN_LOW, decided_by, futile
from context_ceiling.sweep.design import START_SHARE, floor_items, next_step
from context_ceiling.sweep.prompts import RenderedPrompt
from context_ceiling.sweep.scorer import grade
from context_ceiling.sweep.solver import Endpoint, request_of
from context_ceiling.sweep.statistics import (
    accuracy_interval,
    difference_interval,
    difference_lower,
    items_for,
)
from context_ceiling.sweep.taskset import ExactAnswer, Item
from testkit import REPO
from testkit.doubles.scripted_model import ScriptedModelDouble
from testkit.serving import serve
from tests.sweep.test_sweep import TS, WINDOW, common, run_cli


@pytest.fixture
def model() -> Iterator[tuple[ScriptedModelDouble, str]]:
    d = ScriptedModelDouble(TS, WINDOW, knee=0.65)
    with serve(d.app()) as url:
        yield d, url + "/v1"


def small(url: str, out: Path, *extra: str) -> list[str]:
    return common(url, out, "--levels", "0.2,0.5", "--repeats", "1", "--no-refine", *extra)


def derive(out: Path, *extra: str) -> int:
    return run_cli("derive", str(out), "--model", "m", *extra)


# -- refusals --------------------------------------------------------------------------------


@pytest.mark.e2e
def test_a_model_that_never_answers_right_gets_no_ceiling(
    model: tuple[ScriptedModelDouble, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d, url = model
    d.high = d.low = 0.0
    out = tmp_path / "wrong"
    assert run_cli(*small(url, out, "--items", "25")) == 0
    summary = json.loads((out / "summary.json").read_text())["analysis"]
    assert all(s["accuracy"] == 0 for s in summary["levels"])
    assert derive(out) == 1
    err = capsys.readouterr().err
    assert "below the floor" in err and err.count("\n") == 1
    assert not (out / "ceilings.yaml").exists()
    # --accept-unresolved does not waive the floor
    assert derive(out, "--accept-unresolved") == 1
    assert not (out / "ceilings.yaml").exists()


@pytest.mark.e2e
def test_a_model_that_answers_from_memory_gets_no_ceiling(
    model: tuple[ScriptedModelDouble, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d, url = model
    d.closed_book = True
    out = tmp_path / "memory"
    assert run_cli(*small(url, out, "--items", "25")) == 0
    summary = json.loads((out / "summary.json").read_text())["analysis"]
    assert len(summary["closed_book_flagged"]) == 25 and summary["closed_book_excluded"]
    assert derive(out) == 1  # every item left out: nothing to decide on
    capsys.readouterr()
    assert derive(out, "--include-closed-book", "--accept-unresolved") == 1
    assert "not clearly above the closed-book control" in capsys.readouterr().out


@pytest.mark.e2e
def test_missing_and_errored_calls_fail_the_level_until_resumed(
    model: tuple[ScriptedModelDouble, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d, url = model
    out = tmp_path / "cut"
    # a run killed before its last calls: the last level is incomplete and cannot pass or raise
    # anything
    assert run_cli(*small(url, out, "--items", "20", "--no-control")) == 0
    log = out / "calls.jsonl"
    lines = log.read_text().splitlines(keepends=True)
    log.write_text("".join(lines[:-10]))
    assert run_cli("report", str(out)) == 0
    summary = json.loads((out / "summary.json").read_text())["analysis"]
    top = summary["levels"][-1]
    assert top["missing_calls"] > 0 and not top["passes"]
    assert derive(out, "--accept-unresolved") == 1
    assert "incomplete" in capsys.readouterr().err
    # a non-retryable upstream error is an errored call, never silently dropped
    d.fail_first = {"400": 2}
    assert run_cli("run", "--resume", "--out", str(out), "--no-progress") == 0
    summary = json.loads((out / "summary.json").read_text())["analysis"]
    assert sum(s["errored_calls"] for s in summary["levels"]) == 2
    assert derive(out, "--accept-unresolved") == 1
    assert "errored" in capsys.readouterr().err
    assert run_cli("run", "--resume", "--out", str(out), "--no-progress") == 0
    summary = json.loads((out / "summary.json").read_text())["analysis"]
    assert all(s["missing_calls"] == s["errored_calls"] == 0 for s in summary["levels"])
    assert derive(out, "--accept-unresolved") == 0


@pytest.mark.e2e
def test_an_unresolved_ceiling_is_refused_unless_accepted(
    model: tuple[ScriptedModelDouble, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, url = model
    out = tmp_path / "few"
    # fewer items than any decision needs: no tolerance, however wide, resolves it
    assert run_cli(*common(url, out, "--items", "12", "--levels", "0.2,0.5,0.8")) == 0
    assert derive(out) == 1
    assert "unresolved" in capsys.readouterr().err
    assert derive(out, "--accept-unresolved") == 0
    [entry] = load_document(out / "ceilings.yaml").entries
    assert entry.provenance.decision["resolved"] is False
    assert "UNRESOLVED" in (entry.provenance.note or "")


@pytest.mark.e2e
def test_default_sweep_plans_adds_items_where_open_and_resolves(
    model: tuple[ScriptedModelDouble, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d, url = model
    d.shoulder = (0.6, 0.9)  # a small drop before the knee: the decision there is close
    out = tmp_path / "auto"
    args = common(url, out, "--tolerance", "0.1", "--levels", "0.2,0.5,0.8")
    assert run_cli(*args, "--dry-run") == 0
    dry = " ".join(capsys.readouterr().out.split())
    planned = items_for(0.1, 3)
    assert "the pass test's expected margin of error ±" in dry
    assert f"{planned} items are planned" in dry
    assert run_cli(*args) == 0
    plan = json.loads((out / "plan.json").read_text())
    summary = json.loads((out / "summary.json").read_text())["analysis"]
    assert plan["planned_items"] == planned and plan["adaptive"] and plan["refine"]
    assert summary["resolved"] and summary["refusals"] == []
    first = plan["batches"][0]
    assert first == -(-planned // START_SHARE) and len(plan["batches"]) > 1, "items were added"
    added = [lv for lv, n in plan["n_at"].items() if n > first]
    # the reference, the open levels between the grid's 0.5 and 0.8, and any dip-scan point
    # that read below the reference on the opening's items (it is measured on the items drawn)
    scanned = {f"{lv:.4f}" for lv in plan["scanned"]}
    assert "0.2000" in added
    assert all(0.5 <= float(lv) < 0.8 or lv in scanned for lv in added if lv != "0.2000")
    assert plan["n_at"]["0.8000"] == first, "no items added where the decision was clear"
    assert 0.1 in plan["levels"], "a low-fill control below the reference"
    ref = next(s for s in summary["levels"] if s["role"] == "reference")
    assert ref["level"] == 0.2 and ref["n_items"] >= first
    ceiling_util = next(
        s["utilization"] for s in summary["levels"] if s["level"] == summary["ceiling_level"]
    )
    assert 0.5 <= ceiling_util < 0.65, "below the knee, within the resolution of it"
    assert derive(out) == 0
    [entry] = load_document(out / "ceilings.yaml").entries
    assert entry.provenance.decision["resolved"] is True


@pytest.mark.e2e
def test_the_regression_check_needs_proof_to_say_holds(tmp_path: Path) -> None:
    """A change that really steepens the drop is 'moved' even when the level's own accuracy
    barely moved relative to the baseline's noise; too few items give 'inconclusive' (exit 3)."""
    base = tmp_path / "base"
    d = ScriptedModelDouble(TS, WINDOW, knee=0.65)
    with serve(d.app()) as url:
        args = common(url + "/v1", base, "--items", "40", "--levels", "0.2,0.5,0.8")
        assert run_cli(*args, "--no-control", "--tolerance", "0.2") == 0
    worse = ScriptedModelDouble(TS, WINDOW, knee=0.45, high=0.95, low=0.5)
    with serve(worse.app()) as url:
        code = run_cli(
            "run",
            "--reduced",
            "--baseline",
            str(base),
            "--base-url",
            url + "/v1",
            "--out",
            str(tmp_path / "r"),
            "--no-progress",
        )
    verdict = json.loads((tmp_path / "r" / "verdict.json").read_text())
    assert code == 1 and verdict["outcome"] == "moved"
    stored = json.loads((base / "summary.json").read_text())["analysis"]["ceiling_level"]
    moved = next(e for e in verdict["levels"] if e["level"] == stored)
    assert moved["drop"] < moved["baseline_drop"] - 0.2 and moved["change_ci"][1] < -0.2


# -- the pieces ------------------------------------------------------------------------------


def test_intervals_never_collapse_and_contain_the_estimate() -> None:
    for n in (1, 2, 10, 30, 300):
        lo, hi = accuracy_interval([1.0] * n)
        assert lo < 1.0 == hi
        lo, hi = difference_interval([0.0] * n)
        assert lo < 0 < hi
        assert difference_lower([0.0] * n) < 0
    lo, hi = difference_interval([-1.0] * 30)
    assert lo == -1.0 and hi > -1.0
    # the pass test's bound lies below the measured difference, and tightens with more items
    d = [0.0, -1 / 3, 1 / 3, 0.0, -2 / 3] * 20
    assert difference_lower(d) < sum(d) / len(d)
    assert difference_lower(d * 4) > difference_lower(d)


def test_incomplete_reference_fails_every_level() -> None:
    rows: list[Row] = [
        {
            "key": f"i{i}@{lv:.4f}#0",
            "item": f"i{i}",
            "level": lv,
            "repeat": 0,
            "control": False,
            "correct": True,
            "bucket": "correct",
            "utilization": lv,
            "prompt_tokens": 100,
            "status": "ok",
        }
        for i in range(30)
        for lv in (0.2, 0.5)
        if not (lv == 0.2 and i >= 25)
    ]
    ids = [f"i{i}" for i in range(30)]
    a = analyse_graded(rows, rows, 1000, 0.05, 0.1, design=Design.full([0.2, 0.5], ids, 1, False))
    assert a.ceiling_level is None and not any(s.passes for s in a.levels)
    assert any("0.2 is incomplete: 5 of 30" in r for r in a.refusals)


def test_an_answer_taken_from_a_padding_document_is_decoyed() -> None:
    item = Item(
        id="q",
        question="What is the fee of contract K-1?",
        gold=["k1"],
        answer=ExactAnswer(kind="exact", value="4,200"),
    )
    docs = {
        "k1": "Contract K-1: the fee is 4,200 EUR.",
        "k2": "Contract K-2: the fee is 6,350 EUR; notice of 90 days.",
    }
    shown = ["k2", "k1"]
    assert grade(item, "The fee is 6350.", "stop", shown, docs).bucket == "decoyed"
    assert grade(item, '{"answer": "6,350", "evidence": []}', "stop", shown, docs).bucket == (
        "decoyed"
    )
    assert grade(item, "It is 9,999.", "stop", shown, docs).bucket == "missed"
    assert grade(item, "4200", "stop", shown, docs).correct
    # a value in the gold document too is not a decoy
    assert grade(item, "K-1", "stop", shown, docs).bucket == "missed"


@pytest.mark.e2e
def test_reasoning_models_get_what_they_accept(
    model: tuple[ScriptedModelDouble, str], tmp_path: Path
) -> None:
    d, url = model
    d.reasoning_only = True
    out = tmp_path / "o"
    assert run_cli(*small(url, out, "--items", "3", "--no-control", "--low-fill", "0")) == 0
    records = [json.loads(x) for x in (out / "calls.jsonl").read_text().splitlines()]
    assert len(records) == 6 and all(r["status"] == "ok" for r in records)
    assert any(r.get("reasoning_mode") == "openai" for r in records)
    sent = [b for b in d.bodies if "max_completion_tokens" in b]
    assert sent and all("temperature" not in b and "max_tokens" not in b for b in sent)
    ep = Endpoint("http://x", api="anthropic", reasoning="anthropic", reasoning_tokens=2000)
    _, _, body = request_of(
        ep, RenderedPrompt(system="s", user="u", doc_ids=[], gold_positions={}, tokens=1, target=1)
    )
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 2000}
    assert body["max_tokens"] == 2100 and "temperature" not in body


@pytest.mark.e2e
def test_the_counter_is_reconciled_with_the_reported_prompt_tokens(
    model: tuple[ScriptedModelDouble, str], tmp_path: Path
) -> None:
    d, url = model
    d.usage_scale = 1.1  # the upstream's tokenizer counts 10% more than ours
    out = tmp_path / "c"
    assert run_cli(*small(url, out, "--items", "4", "--no-control")) == 0
    summary = json.loads((out / "summary.json").read_text())["analysis"]
    for s in summary["levels"]:
        assert s["counter_error"] == pytest.approx(1 / 1.1 - 1, abs=0.01)
    assert any("off the prompt tokens the upstream reported" in w for w in summary["warnings"])


@pytest.mark.e2e
def test_validity_benchmark_runs_the_real_code() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "benchmarks.validity", "--runs", "1", "--coverage-sets", "10"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr
    assert "enforced ceiling <= true drop point" in r.stdout
    assert "pass-test bound above the truth" in r.stdout
    assert "cost / previous" in r.stdout
    # the dry run's forecast against what each regime spent
    rows = [x for x in r.stdout.splitlines() if x.startswith("| fixed budget |")]
    row = rows[1]  # the cost table's
    forecast, within = row.strip(" |").split(" | ")[-2:]
    assert forecast.endswith("M") and within.endswith("%")
    assert "zero accuracy refused | yes" in r.stdout
    # the regimes the design must refuse write nothing, and show nothing placed
    for name in ("model below the floor", "model that knows the answers"):
        cells = next(x for x in r.stdout.splitlines() if x.startswith(f"| {name} |"))
        written, _, _, _, placed = cells.strip(" |").split(" | ")[2:7]
        assert (written, placed) == ("0.0%", "-"), cells


def test_a_regression_check_holds_a_ceiling_to_the_tolerance_it_was_written_at() -> None:
    """A baseline that could resolve its ceiling only at a wider tolerance than asked (12%, not
    5%) promised that wider one: an unchanged 8-point drop at the stored level holds at 12%, is
    not shown within 5% (inconclusive), and a drop past 12% now is never "holds"."""
    from dataclasses import replace

    from context_ceiling.sweep.curve import Analysis, LevelStats
    from context_ceiling.sweep.regression import compare_means, stated

    def stats(lv: float) -> LevelStats:
        return LevelStats(lv, lv, 600, 600, 0.9, (0.88, 0.92), 0.9, 0.9, {})

    ids = [f"i{k}" for k in range(600)]

    def means(drop_share: float) -> dict[float, dict[str, float]]:
        lost = round(drop_share * len(ids))
        return {
            0.2: dict.fromkeys(ids, 1.0),
            0.5: {k: 0.0 if j < lost else 1.0 for j, k in enumerate(ids)},
            0.8: dict.fromkeys(ids, 0.0),
        }

    levels = [stats(0.2), stats(0.5), stats(0.8)]
    asked = Analysis(levels, 0.05, 0.05, 1000, 0.5, 0.5, 500, [], 0, [], reference_level=0.2)
    wide = replace(asked, stated_tolerance=0.12)
    assert stated(asked) == 0.05 and stated(wide) == 0.12
    then = means(0.08)
    held = compare_means(wide, wide, then, means(0.08))
    assert held.outcome == "holds" and held.tolerance == 0.12 and "12%" in held.text
    assert compare_means(asked, asked, then, means(0.08)).outcome == "inconclusive"
    # an explicit tolerance is the one checked
    assert compare_means(wide, wide, then, means(0.08), tolerance=0.05).outcome != "holds"
    # the drop now past the stated tolerance: moved, never holds
    assert compare_means(wide, wide, then, means(0.3)).outcome == "moved"


def _graded(
    plan: tuple[tuple[float, int, list[str]], ...], right: Callable[[float, int], bool]
) -> list[Row]:
    """Graded calls: for each (level, repeats, items) of ``plan``, every repeat of the ``j``-th
    item right when ``right(level, j)``."""
    out: list[Row] = []
    for lv, reps, items in plan:
        for j, item in enumerate(items):
            ok = right(lv, j)
            for rep in range(reps):
                out.append(
                    {
                        "key": f"{item}@{lv:.4f}#{rep}",
                        "item": item,
                        "level": lv,
                        "repeat": rep,
                        "control": False,
                        "correct": ok,
                        "bucket": "correct" if ok else "missed",
                        "utilization": lv,
                        "prompt_tokens": 100,
                        "status": "ok",
                    }
                )
    return out


def test_a_refined_level_passes_only_on_the_items_of_its_one_test() -> None:
    """A midpoint measured on a quarter of the items planned for its test cannot pass yet: it is
    the open level (the design extends it), and the clear drop above it decides meanwhile. With
    all of them, it is tested once and passes; a grid level never waits."""
    from context_ceiling.sweep.curve import Design

    ids = [f"i{k:03d}" for k in range(400)]

    def rows(measured: int) -> list[Row]:
        plan = ((0.2, 3, ids), (0.35, 1, ids[:measured]), (0.5, 3, ids))
        # 80% right up to the cliff at 0.5
        return _graded(plan, lambda lv, j: lv < 0.5 and j % 5 != 0)

    def analysed(measured: int) -> Any:
        design = Design(
            {0.2: ids, 0.35: ids[:measured], 0.5: ids},
            3,
            [],
            0.2,
            refined=(0.35,),
            horizon=100,
            cap=400,
            level_repeats={0.35: 1},
        )
        r = rows(measured)
        return analyse_graded(r, r, 1000, 0.05, 0.05, design=design)

    early = analysed(100)
    mid = early.level(0.35)
    assert mid is not None and mid.final == 400 and mid.waiting and mid.diff_lower == -1.0
    assert early.ceiling_level == 0.2 and early.open_level == 0.35
    assert early.decided_by == "drop"  # the cliff at 0.5 decides while 0.35 waits
    assert early.level(0.5) is not None and not early.level(0.5).final  # a grid level: anytime
    done = analysed(400)
    assert done.ceiling_level == 0.35 and done.open_level is None
    assert done.level(0.35) is not None and not done.level(0.35).waiting


def test_a_waiting_midpoint_stays_open_at_the_tolerance_the_data_resolve() -> None:
    """A midpoint that misses the asked tolerance by a hair and passes a wider one leaves the
    next midpoint above it deciding while it is still short of its items: it is the open level
    (extended to its items), never refined below before its one test."""
    ids = [f"i{k:03d}" for k in range(400)]

    def analysed(lost: int) -> Any:
        plan = ((0.2, 3, ids), (0.3, 1, ids), (0.4, 1, ids[:100]), (0.5, 3, ids))
        # 80% at the reference; ``lost`` of those items wrong at 0.3; the cliff at 0.5
        out = _graded(
            plan, lambda lv, j: lv < 0.5 and j % 5 != 0 and not (lv == 0.3 and j < lost * 5 // 4)
        )
        design = Design(
            {0.2: ids, 0.3: ids, 0.4: ids[:100], 0.5: ids},
            3,
            [],
            0.2,
            refined=(0.3, 0.4),
            horizon=100,
            cap=400,
            level_repeats={0.3: 1, 0.4: 1},
        )
        return analyse_graded(out, out, 1000, 0.05, 0.05, design=design)

    widened = [
        a
        for a in map(analysed, range(0, 80, 2))
        if a.ceiling_level == 0.3 and (a.stated_tolerance or 0) > 0.05
    ]
    assert widened, "some drop at 0.3 fails the asked tolerance and passes a wider one"
    a = widened[0]
    assert a.deciding_level == 0.4 and a.level(0.4).waiting
    assert a.open_level == 0.4


_SCAN_IDS = [f"i{k:03d}" for k in range(400)]


def _scan_analysed(measured: int, dip: Callable[[int], bool]) -> Any:
    """A sweep of 400 items (the reference, 0.5, and a cliff at 0.8, each 80% right and
    three repeats) with a dip scan point at 0.35 measured once on the first ``measured`` items,
    right where the reference is except on the items ``dip`` names."""
    ids = _SCAN_IDS
    plan = ((0.2, 3, ids), (0.35, 1, ids[:measured]), (0.5, 3, ids), (0.8, 3, ids))

    def right(lv: float, j: int) -> bool:
        if lv == 0.8:
            return False  # the cliff
        return j % 5 != 0 and not (lv == 0.35 and dip(j))

    out = _graded(plan, right)
    design = Design(
        {0.2: ids, 0.35: ids[:measured], 0.5: ids, 0.8: ids},
        3,
        [],
        0.2,
        scanned=(0.35,),
        horizon=100,
        cap=400,
        level_repeats={0.35: 1},
    )
    return analyse_graded(out, out, 1000, 0.05, 0.05, design=design)


def _first_few(k: int, j: int) -> bool:
    """Items 1..k (all right at the reference)."""
    return 0 < j <= k


def test_a_scan_point_read_below_the_reference_on_the_opening_gates_the_chain() -> None:
    """The scan's screen (``SCAN_LOW``) gates a point reading below the reference at all on
    the opening's items: 1, 2 or 3 points below it on 100 items join the pass tests (the
    points of an 8-point dip read this high on the opening's items, which they share with the
    reference's chance lows, often enough to go unseen at a fifth of the tolerance); one
    reading level with it is shown and not tested."""
    assert SCAN_LOW * 0.05 < 0.01
    for wrong, role in ((0, "scanned"), (1, "scan"), (2, "scan"), (3, "scan")):
        a = _scan_analysed(100, functools.partial(_first_few, wrong))
        scan = a.level(0.35)
        assert scan is not None and scan.role == role, (wrong, scan)
        assert scan.diff == pytest.approx(-wrong / 100)


def test_a_scan_point_that_looks_low_is_measured_on_every_item_before_it_decides() -> None:
    """A dip scan point measured on the opening's 100 items reads 8 points low there by chance
    (flat on the rest): short of the reference's 400 items only a shown drop decides it, so it
    is the open level (the design extends it) and holds on all of them. A real dip shown on
    the opening's items decides at once."""

    def unlucky(j: int) -> bool:
        return j < 100 and j % 25 in (1, 2)  # 8 of the first 100 wrong

    early = _scan_analysed(100, unlucky)
    scan = early.level(0.35)
    assert scan is not None and scan.role == "scan" and scan.short and scan.reach == 400
    assert -0.12 < scan.diff < -0.05 < scan.diff_ci[1]  # looks low, proves nothing
    assert scan.diff_lower < -0.05  # fails at the asked tolerance: no drop, and not futile
    assert decided_by(scan, 0.05, 400) is None and not futile(scan, 0.05, 400)
    assert early.open_level == 0.35
    step = next_step(
        early,
        drawn=400,
        target_items=400,
        refine=True,
        adaptive=True,
        resolution=0.05,
        batch=100,
    )
    assert step is not None and (step.kind, step.levels) == ("extend", (0.35,))
    done = _scan_analysed(400, unlucky)
    assert done.level(0.35) is not None and not done.level(0.35).short
    assert done.ceiling_level == 0.5  # measured whole, the point holds and the dip is not there

    def real(j: int) -> bool:
        return j % 5 in (1, 2)  # 40 points down: a dip, shown on the first 100 items

    dipped = _scan_analysed(100, real)
    assert dipped.deciding_level == 0.35 and dipped.decided_by == "drop"
    assert dipped.ceiling_level == 0.2 and dipped.open_level is None


def test_a_reference_not_shown_above_the_floor_gets_its_items_first() -> None:
    """A reference reading 55% on the opening's 100 items against the 50% floor is not shown
    above it (and not far enough below it to stop): no ceiling is written without that, so the
    design's next items go to the reference alone, the grid's cheapest fill, before the open
    level above it. Shown above the floor (80%), the design goes on where the decision is."""
    ids = _SCAN_IDS[:100]

    def analysed(ref_right: int) -> Any:
        plan = ((0.2, 3, ids), (0.5, 3, ids), (0.8, 3, ids))

        def right(lv: float, j: int) -> bool:
            if lv == 0.8:
                return False  # a cliff
            return j % 100 < ref_right

        out = _graded(plan, right)
        design = Design({lv: ids for lv in (0.2, 0.5, 0.8)}, 3, [], 0.2, horizon=100, cap=400)
        return analyse_graded(out, out, 1000, 0.05, 0.05, design=design, floor=0.5)

    def step(a: Any) -> Any:
        return next_step(
            a, drawn=100, target_items=400, refine=True, adaptive=True, resolution=0.05, batch=100
        )

    near = analysed(55)
    ref = near.level(0.2)
    assert ref is not None and ref.ci[0] < 0.5 < ref.accuracy and near.hopeless is None
    got = step(near)
    assert got is not None and (got.kind, got.levels, got.new_items) == ("items", (0.2,), 100)
    above = step(analysed(80))
    assert above is None or above.levels != (0.2,)


def test_a_reference_near_the_floor_is_decided_within_the_opening_calls() -> None:
    """Before the opening's second stage, a reference not shown above the 50% floor gets items
    of its own; past as many again as the opening drew (``floor_items``), one still reading
    below the floor (49%, not far enough below for futility) ends the sweep, refused, within
    the opening's calls, instead of going on to the second stage and past them. One reading
    above the floor there (55%) goes on until it is shown above it, as does one past the
    second stage, or with no opening given."""
    ids = _SCAN_IDS

    def analysed(n: int, right: int, levels: tuple[float, ...] = (0.2,)) -> Any:
        plan = tuple((lv, 3, ids[:n]) for lv in levels)
        out = _graded(plan, lambda lv, j: j % 100 < right)
        design = Design({lv: ids[:n] for lv in levels}, 3, [], 0.2, horizon=100, cap=400)
        return analyse_graded(out, out, 1000, 0.05, 0.05, design=design, floor=0.5)

    def step(a: Any, drawn: int, target: int = 400, opened: int | None = 100) -> Any:
        return next_step(
            a,
            drawn=drawn,
            target_items=target,
            refine=True,
            adaptive=True,
            resolution=0.05,
            batch=100,
            grid=(0.5, 0.8),
            opened=opened,
        )

    def items(s: Any) -> bool:
        return s is not None and (s.kind, s.levels) == ("items", (0.2,))

    assert floor_items(100, 400) == 200 and floor_items(100, 150) == 150
    assert floor_items(None, 400) == 400
    for right in (49, 55):
        opening = analysed(100, right)
        ref = opening.level(0.2)
        assert ref is not None and ref.ci[0] < 0.5 and opening.hopeless is None
        assert items(step(opening, 100)), right
    low = analysed(200, 49)
    assert low.hopeless is None  # not far enough below the floor for futility
    assert step(low, 200) is None  # the opening's calls are spent
    assert any("below the floor" in r for r in low.refusals)
    assert step(low, 200, target=200) is None  # nor is the second stage asked at the last item
    assert items(step(low, 200, opened=None))
    assert items(step(analysed(200, 49, (0.2, 0.5)), 200))  # past the second stage
    near = analysed(200, 55)
    ref = near.level(0.2)
    assert ref is not None and ref.ci[0] < 0.5 < ref.accuracy
    assert items(step(near, 200))  # above the floor, not yet shown: more items
