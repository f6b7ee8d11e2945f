"""What a sweep costs: the price before it runs (the adaptive design simulated), the budget the
design respects between steps, the tolerance a budget buys, and the prompt cache a shared
haystack is read from.

Runs the real ``ceiling sweep`` command line against the scripted model double (a stand-in for a
hosted model whose accuracy curve is known; it reports cached prompt tokens the way OpenAI's
automatic prompt cache does) on loopback.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from context_ceiling.ceilings.document import load_document
from context_ceiling.sweep.calllog import CallLog, Row
from context_ceiling.sweep.design import asked_few, deferred, staged
from context_ceiling.sweep.prompts import RenderedPrompt
from context_ceiling.sweep.simulate import SHAPES, SimSweep, Truth, forecast, random_truth
from context_ceiling.sweep.solver import Endpoint, _result, request_of
from testkit.doubles.scripted_model import ScriptedModelDouble
from testkit.serving import serve
from tests.sweep.test_sweep import TS, WINDOW, common, run_cli


@pytest.fixture
def model() -> Iterator[tuple[ScriptedModelDouble, str]]:
    d = ScriptedModelDouble(TS, WINDOW, knee=0.65)
    with serve(d.app()) as url:
        yield d, url + "/v1"


# -- the prompt cache -------------------------------------------------------------------------


@pytest.mark.e2e
def test_a_shared_haystack_is_read_from_the_prompt_cache(
    model: tuple[ScriptedModelDouble, str], tmp_path: Path
) -> None:
    """The calls of one haystack group run one after another, so every question after the first
    reads the haystack from the provider's prompt cache; per-item haystacks share nothing long
    enough to be cached. The log keeps the cached tokens per call, the summary adds them up."""
    _, url = model
    shared, alone = tmp_path / "shared", tmp_path / "alone"
    args = ("--levels", "0.5", "--repeats", "1", "--no-refine", "--no-control", "--items", "12")
    assert run_cli(*common(url, shared, *args, "--shared-haystack", "--low-fill", "0")) == 0
    assert run_cli(*common(url, alone, *args, "--low-fill", "0")) == 0
    recs = list(CallLog(shared / "calls.jsonl").records().values())
    read = [r for r in recs if (r.cached_tokens or 0) > 0]
    assert len(read) >= len(recs) - 2  # all but the first question of each group
    assert all(
        (r.cached_tokens or 0) >= 1024 and (r.cached_tokens or 0) < r.prompt_tokens for r in read
    )
    assert not any(
        (r.cached_tokens or 0) > 0 for r in CallLog(alone / "calls.jsonl").records().values()
    )
    spend = json.loads((shared / "summary.json").read_text())["spend"]
    assert spend["calls"] == len(recs)
    assert spend["cached_tokens"] == sum(r.cached_tokens or 0 for r in recs) > 0
    assert spend["cached_tokens"] < spend["input_tokens"]


def test_anthropic_calls_mark_the_shared_haystack_as_a_cache_breakpoint() -> None:
    ep = Endpoint("https://api.anthropic.test", api="anthropic", model="claude")
    user = "Documents:\nA long haystack.\n\nQuestion: what?"
    shared = RenderedPrompt("sys", user, [], {}, 100, 100, shared=user.index("Question"))
    _, _, body = request_of(ep, shared)
    first, second = body["messages"][0]["content"]
    assert first["cache_control"] == {"type": "ephemeral"}
    assert first["text"] + second["text"] == user and "cache_control" not in second
    _, _, alone = request_of(ep, RenderedPrompt("sys", user, [], {}, 100, 100))
    assert alone["messages"][0]["content"] == user  # a haystack of its own: nothing to reuse
    got = _result(
        ep,
        {
            "content": [{"type": "text", "text": "{}"}],
            "stop_reason": "end_turn",
            "usage": {
                "input_tokens": 20,
                "cache_read_input_tokens": 900,
                "cache_creation_input_tokens": 0,
                "output_tokens": 5,
            },
        },
        0.1,
        1,
    )
    assert got["usage_prompt"] == 920 and got["cached_tokens"] == 900
    assert got["cache_write_tokens"] == 0


# -- the price before it runs -------------------------------------------------------------------


@pytest.mark.e2e
def test_the_dry_run_prices_the_adaptive_design_and_what_each_budget_buys(
    model: tuple[ScriptedModelDouble, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, url = model
    out = tmp_path / "dry"
    assert run_cli(*common(url, out, "--dry-run", "--json", "--price", "2,8,0.5")) == 0
    got = capsys.readouterr()
    printed = got.out
    est = json.loads(printed[printed.index("{") :])
    cost = est["cost_usd"]
    assert cost["min"] <= cost["expected"] <= cost["max"]
    assert cost["expected_calls"] >= est["calls"], "more than the opening: the adaptive steps"
    rows = est["budgets"]
    assert [r["items"] for r in rows] == sorted(r["items"] for r in rows)
    tolerances = [r["tolerance"] for r in rows]
    assert tolerances == sorted(tolerances, reverse=True) and tolerances[0] > tolerances[-1]
    assert all(r["usd"] > 0 for r in rows)
    assert "what a budget buys" in got.err and not out.exists()  # the console is on stderr


# -- a budget the design respects ---------------------------------------------------------------


@pytest.mark.e2e
def test_a_budget_stops_the_design_between_steps_and_states_what_it_resolved(
    model: tuple[ScriptedModelDouble, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A call cap a little above the opening: the design stops adding items where the next step
    would cross it, so no level is left half measured, and the ceiling is written at the
    tolerance the data resolve, said so, instead of refused."""
    d, url = model
    d.shoulder = (0.45, 0.88)  # a small drop before the knee keeps a decision open
    out = tmp_path / "capped"
    args = common(url, out, "--levels", "0.2,0.5,0.8", "--repeats", "1", "--tolerance", "0.05")
    assert run_cli(*args, "--max-calls", "300") == 0
    said = capsys.readouterr().out
    assert "the decision stays open" in said or "budget reached" in said
    summary = json.loads((out / "summary.json").read_text())["analysis"]
    assert all(s["missing_calls"] == 0 for s in summary["levels"]), "no step half measured"
    assert summary["stated_tolerance"] is not None
    assert summary["stated_tolerance"] >= 0.05
    if summary["stated_tolerance"] > 0.05:
        assert any("the data resolve" in w for w in summary["warnings"])
    assert run_cli("derive", str(out), "--model", "m") == 0
    [entry] = load_document(out / "ceilings.yaml").entries
    assert entry.tolerance == pytest.approx(summary["stated_tolerance"])


# -- the simulation the price comes from ---------------------------------------------------------


def test_the_simulation_runs_the_sweeps_own_design() -> None:
    """A fixed design spends exactly its opening; an adaptive one at least that."""
    t = Truth("cliff", base=0.9, knee=0.6)
    fixed = SimSweep(t, taskset=200, window=8192, items=40, adaptive=False, refine=False)
    a = fixed.run()
    levels = len(fixed.levels)
    assert fixed.spend.calls == 40 * (1 + levels * 3)
    assert a.ceiling_level is not None and a.ceiling_level < 0.6
    grown = SimSweep(t, taskset=960, window=8192)
    grown.run()
    assert grown.spend.calls > grown.open.start * (1 + levels * 3)
    f = forecast(lambda truth, seed: SimSweep(truth, taskset=300, window=8192, seed=seed), runs=6)
    assert f["calls_p10"] <= f["calls_median"] <= f["calls_p90"]


def test_a_cliff_is_probed_on_the_openings_items_before_a_midpoint_is_tested() -> None:
    """Inside a bracket whose failing level dropped steeply, the refinement probes on the
    opening's items first: a probe past the cliff shows the drop there and is measured no
    further; the highest probe below it is the midpoint tested, on every item of its one test,
    and the ceiling lands between the grid level below the cliff and the cliff."""
    t = Truth("cliff", base=0.9, knee=0.6)
    sim = SimSweep(t, seed=3)
    a = sim.run()
    opening = sim.batches[0]
    past = [lv for lv in sim.probed if t.p(lv) < t.p(0.2) - 0.3]
    assert past, sim.probed
    assert all(sim.n_at[lv] == opening for lv in past)
    assert all(lv not in sim.refined for lv in past)
    tested = [lv for lv in sim.refined if lv in sim.probed]
    assert tested, (sim.refined, sim.probed)
    for lv in tested:
        s = a.level(lv)
        assert s is not None and s.role == "level" and s.final
        assert sim.n_at[lv] >= s.final > opening
    for lv in set(sim.probed) - set(sim.refined):
        s = a.level(lv)
        assert s is not None and s.role == "probe" and s not in a.chain
    assert a.ceiling_level is not None
    assert 0.5 < a.ceiling_level <= t.drop_point(0.2, 0.95, 0.05)


def test_a_gentle_drop_is_bisected_with_every_midpoint_tested() -> None:
    """A bracket whose failing level dropped by less than ``STEEP`` tolerances holds no cliff
    for a probe to show: its midpoints are tested, one after another, without probes."""
    t = Truth("gentle", base=0.9, knee=2.0, slope=0.2)
    sim = SimSweep(t, seed=5)
    a = sim.run()
    assert sim.refined and not sim.probed, (sim.refined, sim.probed)
    assert a.ceiling_level is not None
    assert a.ceiling_level <= t.drop_point(0.2, 0.95, a.stated_tolerance or 0.05)


# -- the grid above the first level past the reference waits for the levels below it -----------


def test_grid_levels_above_a_failing_level_are_never_measured() -> None:
    """An adaptive design opens on the grid up to the first level above the reference (that
    one as the opening's second stage); 0.8 and the practical limit are measured only once every
    level below them passes, each on the opening's items (as the opening would have measured
    them). A cliff at 0.35 never pays for either; one past 0.8 measures both, the limit asked
    once per item."""
    assert deferred([0.1, 0.2, 0.5, 0.8, 0.95], 0.2) == [0.5, 0.8, 0.95]
    assert staged([0.1, 0.2, 0.5, 0.8, 0.95], 0.2, [0.5, 0.8, 0.95]) == [0.5]
    assert staged([0.1, 0.2, 0.5, 0.8, 0.95], 0.2, [0.8, 0.95]) == []  # measured: not waiting
    assert deferred([0.2], 0.2) == staged([0.2], 0.2, []) == []
    early = SimSweep(Truth("cliff", base=0.9, knee=0.35), seed=3)
    a = early.run()
    assert early.grid_left == [0.8, max(early.levels)]
    stage = [r for r in early.records if r["level"] == 0.5][: early.batches[0] * early.repeats]
    assert {r["item"] for r in stage} == {f"i{i}" for i in early.order[: early.batches[0]]}
    assert {r["level"] for r in early.records}.isdisjoint(early.grid_left)
    assert all(a.level(lv) is None for lv in early.grid_left)
    assert a.ceiling_level is not None and a.ceiling_level < 0.5
    late = SimSweep(Truth("cliff", base=0.9, knee=0.93), seed=3)
    b = late.run()
    assert late.grid_left == []
    opening = late.batches[0]
    for lv in (0.8, max(late.levels)):
        s = b.level(lv)
        assert s is not None and s.n_design >= opening
        first = [r for r in late.records if r["level"] == lv][: opening * late.repeats]
        assert {r["item"] for r in first} == {f"i{i}" for i in late.order[:opening]}
    top = [r for r in late.records if r["level"] == max(late.levels)]
    assert all(r["repeat"] == 0 for r in top)
    assert b.ceiling_level is not None and b.ceiling_level > 0.8
    # the two levels that wait are more than half of what opening on the whole grid costs
    fresh = SimSweep(Truth("cliff", base=0.9, knee=0.35), seed=3)
    whole = 1 + sum(fresh._reps(lv) * round(lv * fresh.window) for lv in fresh.levels)
    assert fresh._opening_tokens(180) < 0.5 * 180 * whole
    fixed = SimSweep(Truth("cliff", base=0.9, knee=0.35), items=200, adaptive=False)
    assert fixed.grid_left == []


def _dry_run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[dict[str, Any], str]:
    """``ceiling sweep run ARGS --dry-run --json``: its JSON, and its terminal text on one line."""
    assert run_cli(*args, "--dry-run", "--json") == 0
    printed = capsys.readouterr()
    return json.loads(printed.out[printed.out.index("{") :]), " ".join(printed.err.split())


@pytest.mark.e2e
def test_a_run_below_the_accuracy_floor_never_pays_for_the_levels_above_the_reference(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The real ``ceiling sweep run``, adaptive, on a model right 30% of the time at every fill
    (the floor: 50%): the opening's first stage (the low-fill control and the reference) shows
    it below the floor, the design stops, and no call is made at 0.5 or above; the dry run
    priced the opening with 0.5 in it (what a model past the floor spends at once)."""
    d = ScriptedModelDouble(TS, WINDOW, knee=0.95, high=0.3)
    out = tmp_path / "floor"
    with serve(d.app()) as url:
        args = common(url + "/v1", out, "--tolerance", "0.1")
        dry, _ = _dry_run(args, capsys)
        run_cli(*args)
    recs = list(CallLog(out / "calls.jsonl").records().values())
    measured = {r.level for r in recs if r.level is not None}
    assert measured and max(measured) < 0.5, measured
    plan = json.loads((out / "plan.json").read_text())
    assert plan["grid_left"] == dry["deferred_levels"] and 0.5 in plan["grid_left"]
    # three of the opening's four sets of calls, and the cheapest: well under half its tokens
    assert len(recs) < dry["calls"]
    spent = sum(r.prompt_tokens for r in recs)
    assert spent < 0.5 * dry["input_tokens"], (spent, dry["input_tokens"])
    summary = json.loads((out / "summary.json").read_text())
    refusals = summary["analysis"]["refusals"]
    assert summary["analysis"]["hopeless"] and any("floor" in r for r in refusals), refusals


def test_a_model_below_the_floor_is_refused_on_the_opening_s_first_stage() -> None:
    """A model reading 30% against the 50% floor is refused on the low-fill control and the
    reference alone: 0.5, the opening's dearest level, is never asked, and the sweep spends well
    under half of what the opening on both stages would have."""
    sim = SimSweep(Truth("cliff", base=0.3, knee=0.8), seed=4)
    a = sim.run()
    assert a.hopeless is not None and "floor" in a.hopeless and a.blocking()
    assert {r["level"] for r in sim.records} <= {None, 0.1, 0.2}
    assert sim.grid_left == deferred(sim.levels, sim.reference)
    assert sim.spend.input_tokens < 0.5 * sim._opening_tokens(sim.batches[0])


def test_a_model_just_below_the_floor_is_decided_within_the_opening_s_calls() -> None:
    """A model reading 44% against the 50% floor now and then reads above it on the opening's
    items by chance: its reference gets items of its own, and still reading below the floor on
    as many again as the opening drew it is refused there, so no sweep spends more calls than
    the opening on both stages planned (the control and three levels at three repeats on each
    of its items), and none writes a ceiling."""
    for seed in range(16):
        sim = SimSweep(Truth("cliff", base=0.44, knee=0.8), seed=seed)
        a = sim.run()
        assert a.blocking() and a.outcome == "refused", (seed, a.outcome)
        assert sim.spend.calls <= sim.batches[0] * (1 + 3 * 3), (seed, sim.spend.calls)


def test_a_model_that_knows_the_answers_is_refused_on_the_opening_s_first_stage() -> None:
    """A model that answers the task set without its documents (every item known closed-book:
    97% right with no documents) is refused on the low-fill control and the reference alone:
    the documents are shown to add less than the tolerance, so no fill's loss could be
    measured, and 0.5 is never asked. Half the items known closed-book still leaves the
    documents adding far more than that: the sweep goes on."""
    for seed in range(3):
        sim = SimSweep(Truth("cliff", base=0.9, knee=0.8, known=1.0), seed=seed)
        a = sim.run()
        assert a.hopeless is not None and "documents add at most" in a.hopeless, seed
        assert a.outcome == "refused" and a.hopeless in a.refusals
        assert {r["level"] for r in sim.records} <= {None, 0.1, 0.2}
        assert sim.spend.calls <= sim.batches[0] * (1 + 3 + 3)
    half = SimSweep(Truth("cliff", base=0.9, knee=0.8, known=0.5), seed=0)
    b = half.run()
    assert b.hopeless is None and any(r["level"] == 0.5 for r in half.records)


def test_a_level_left_with_too_few_items_gets_more_before_the_sweep_ends() -> None:
    """A task set 95% answered closed-book leaves about one item in twelve for the decision: a
    level measured on the opening's 180 items alone is scored on about 16, fewer than a
    decision needs, and no tolerance resolves while the chain reaches it. It gets the items
    drawn before the sweep ends, which then states a ceiling instead of ending unresolved."""
    sim = SimSweep(Truth("cliff", base=0.9, knee=0.8, known=0.95), seed=0)
    a = sim.run()
    assert not any("fewer than the 20" in r for r in a.refusals), a.refusals
    assert a.outcome == "ceiling" and a.stated_tolerance is not None
    assert all(s.n_items >= 20 for s in a.chain)


def test_a_gap_the_dip_scan_could_not_measure_caps_the_ceiling_below_it() -> None:
    """A budget that runs out after the grid passes 0.5 but before the dip scan between the
    reference and 0.5: a dip that recovers there is unseen, so the ceiling stays at the
    reference (reported as such, with the fills owed named); with the budget for the scan the
    same curve is scanned and the ceiling lies at or below the dip."""
    t = Truth("recover", base=0.9, knee=0.9, dip=0.08, dip_at=0.3, dip_width=0.1)
    drop = t.drop_point(0.2, 0.95, 0.05)
    assert drop < 0.35
    short = SimSweep(t, seed=2, budget_tokens=70_000_000)
    a = short.run()
    assert a.unscanned and min(a.unscanned) > 0.2 and max(a.unscanned) < 0.5
    assert a.ceiling_level == a.reference_level and a.at_reference
    assert a.outcome == "at_reference"
    assert any("not scanned for a dip" in w for w in a.warnings)
    assert (a.ceiling_utilization or 0) <= t.drop_point(0.2, 0.95, a.stated_tolerance or 0.05)
    chain_top = max(s.level for s in a.chain if s.passes)
    assert chain_top >= 0.5, "the chain alone would have admitted the dip"
    whole = SimSweep(t, seed=2)
    b = whole.run()
    assert whole.scanned and not b.unscanned
    stated = b.stated_tolerance or 0.05
    assert b.ceiling_utilization is not None
    assert b.ceiling_utilization <= t.drop_point(0.2, 0.95, stated)


def test_a_gap_is_scanned_before_the_grid_level_above_it() -> None:
    """Once 0.5 passes, the fills between the reference and it are scanned before 0.8 is
    measured: a dip found there makes 0.8 moot, and a budget spent on 0.8 first could leave
    the gap unscanned (and the ceiling at the reference)."""
    t = Truth("recover", base=0.85, knee=0.9, dip=0.08, dip_at=0.3, dip_width=0.1)
    sim = SimSweep(t, seed=4)
    sim.run()
    order = [r["level"] for r in sim.records if r["level"] is not None]
    first_scan = next(k for k, lv in enumerate(order) if lv in sim.scanned)
    assert sim.scanned[0] < 0.5 and 0.8 not in order[:first_scan]


def test_true_drop_points_of_every_shape() -> None:
    import random

    rng = random.Random(4)
    for shape in SHAPES:
        t = random_truth(rng, shape)
        u = t.drop_point(0.2, 0.99, 0.05)
        assert 0.2 <= u <= 0.99
        assert t.p(u) - t.p(0.2) >= -0.05
        if u < 0.99:
            assert t.p(u + 0.001) - t.p(0.2) < -0.05 + 1e-9
    dip = Truth("dip", base=0.9, knee=0.9, dip=0.06, dip_at=0.4)
    assert dip.drop_point(0.2, 0.99, 0.05) < 0.45, "the dip before the cliff is the drop"


# -- the calls added after the opening are asked once -------------------------------------------


def test_the_highest_grid_level_is_asked_once_when_levels_lie_below_it() -> None:
    """The practical limit is asked once per item when two or more levels lie above the
    reference (it decides only when every level below it passes); a level that is the only one
    above the reference keeps its repeats; the simulation spends what the rule plans."""
    assert asked_few([0.1, 0.2, 0.5, 0.8, 0.95], 0.2) == [0.95]
    assert asked_few([0.2, 0.5, 0.8], 0.2) == [0.8]
    assert asked_few([0.1, 0.2, 0.5], 0.2) == []
    t = Truth("cliff", base=0.9, knee=2.0)  # no drop: 0.8 passes, the limit is measured
    sim = SimSweep(t, window=8192, adaptive=True, refine=False, seed=1)
    assert sim.few == [max(sim.levels)]
    sim.run()
    top = [r for r in sim.records if r["level"] == max(sim.levels)]
    assert top and all(r["repeat"] == 0 for r in top)
    assert sim.design().repeats_of("i0", max(sim.levels)) == 1
    fixed = SimSweep(t, taskset=200, window=8192, items=40, adaptive=False, refine=False)
    assert fixed.few == [] and fixed.design().level_repeats == {}


@pytest.mark.e2e
def test_calls_added_after_the_opening_are_asked_once(
    model: tuple[ScriptedModelDouble, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The opening asks every item three times at every grid level but the highest (asked once);
    the items the adaptive design adds and the refinement's and the scan's points are asked once
    per level (a call buys more as a new item than as a repeat); the log has exactly the calls
    the plan says, so no level is incomplete."""
    d, url = model
    d.shoulder = (0.45, 0.86)  # a small drop before the knee: the design adds items there
    out = tmp_path / "once"
    args = common(url, out, "--levels", "0.2,0.5,0.8", "--tolerance", "0.1")
    assert run_cli(*args) == 0
    plan = json.loads((out / "plan.json").read_text())
    assert len(plan["batches"]) > 1, "items were added"
    assert plan["batch_repeats"][0] == 3 and set(plan["batch_repeats"][1:]) == {1}
    assert "asked 1 time(s) at each level" in capsys.readouterr().out
    assert plan["few_repeats"] == [0.8], "the highest grid level is asked once"
    added = {*plan["refined"], *plan["scanned"], *plan["few_repeats"]}
    assert added - {0.8}, "the refinement or the scan added points"
    summary = json.loads((out / "summary.json").read_text())["analysis"]
    assert all(s["missing_calls"] == 0 for s in summary["levels"])
    first = set(plan["item_ids"][: plan["batches"][0]])
    recs = CallLog(out / "calls.jsonl").records().values()
    assert all(r.repeat == 0 for r in recs if r.item not in first and not r.control)
    assert all(r.repeat == 0 for r in recs if r.level in added)
    assert any(r.repeat == 2 for r in recs if r.item in first and r.level not in added)


@pytest.mark.e2e
def test_a_run_whose_drop_lies_below_0_5_never_pays_for_the_levels_above(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The real ``ceiling sweep run``, adaptive, on a model whose accuracy falls at 0.35: the
    opening measures the grid up to 0.5 only; 0.5 fails, so 0.8 and the practical limit are
    never asked (``plan.json``'s ``grid_left`` keeps them, the log has no call there, the report
    says so), and the dry run prices the opening without them and the upper end with them."""
    d = ScriptedModelDouble(TS, WINDOW, knee=0.35)
    out = tmp_path / "early"
    with serve(d.app()) as url:
        args = common(url + "/v1", out, "--tolerance", "0.1")
        dry, said = _dry_run(args, capsys)
        assert run_cli(*args, "--dry-run", "--json", "--price", "2,8") == 0
        priced = json.loads(capsys.readouterr().out)
        assert run_cli(*args) == 0
    # the price's upper end: every item at every level of the grid, the deferred ones included
    # (more than the opening scaled to every item)
    cost = priced["cost_usd"]
    assert cost["max"] > cost["min"] * priced["items_max"] / priced["items"] * 1.5
    assert dry["deferred_levels"] == [0.5, 0.8, max(dry["levels"])], dry
    assert "(0.5 once the reference holds the floor; 0.8, 0.9858 once every level below" in said
    deferred = dry["deferred_levels"][1:]
    plan = json.loads((out / "plan.json").read_text())
    assert plan["grid_left"] == deferred
    recs = CallLog(out / "calls.jsonl").records().values()
    assert not {r.level for r in recs} & set(deferred)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["unmeasured_grid_levels"] == deferred
    assert all(s["level"] not in deferred for s in summary["analysis"]["levels"])
    assert all(s["missing_calls"] == 0 for s in summary["analysis"]["levels"])
    ceiling = summary["analysis"]["ceiling_utilization"]
    assert ceiling is not None and ceiling < 0.35
    assert "not measured: the sweep ended before every level below them passed" in " ".join(
        capsys.readouterr().out.split()
    )
    # the dry run's opening is the calls the run opened with: the first batch's items at the
    # levels up to 0.5 and the closed-book control, nothing above
    first = set(plan["item_ids"][: plan["batches"][0]])
    opened = [r for r in recs if r.item in first and (r.control or r.level in (0.1, 0.2, 0.5))]
    assert dry["calls"] == len(opened)


def test_the_repeats_agreement_is_an_intraclass_correlation() -> None:
    from context_ceiling.sweep.analysis import repeat_icc

    def rows(outcomes: dict[str, list[int]]) -> list[Row]:
        return [
            {"item": k, "level": 0.5, "correct": bool(x), "control": False}
            for k, xs in outcomes.items()
            for x in xs
        ]

    agree = {f"i{k}": [k % 2] * 3 for k in range(40)}
    assert repeat_icc(rows(agree)) == 1.0
    coin = {f"i{k}": [(k + r) % 2 for r in range(3)] for k in range(40)}
    got = repeat_icc(rows(coin))
    assert got is not None and got < 0.2
    assert repeat_icc(rows({"a": [1], "b": [0]})) is None  # no item asked twice


def test_the_repeat_switch_reads_the_paired_differences_agreement() -> None:
    """Items that differ from each other (easy ones always right, hard ones always wrong) make
    the outcomes' repeats look redundant; what the pass test averages is the paired difference,
    and there the repeats of the few items that vary disagree completely."""
    from context_ceiling.sweep.analysis import repeat_icc

    rows: list[Row] = []
    for k in range(40):
        for level in (0.2, 0.5):
            for r in range(3):
                if k < 20:
                    correct = 1
                elif k < 37:
                    correct = 0
                else:  # the same item, right and wrong by turns, at either level
                    correct = [[1, 0, 1], [0, 1, 1]][level == 0.5][r]
                rows.append(
                    {"item": f"i{k}", "level": level, "repeat": r, "correct": bool(correct)}
                )
    outcomes = repeat_icc(rows)
    paired = repeat_icc(rows, reference=0.2)
    assert outcomes is not None and outcomes >= 0.75  # the old reading: "redundant"
    assert paired is not None and paired < 0.75
