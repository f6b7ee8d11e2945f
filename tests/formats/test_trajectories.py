"""Enforcement on real agent trajectories (a coding agent whose harness inserts user messages
mid-loop, a multi-turn tool agent with a simulated user, a coding agent's short runs with its own
tools), in every API's shape: no turn rejected
where the task and the newest rounds fit, nothing invalid or over, the prompt cache kept between
clearing events, no more events than the growth asks for, nothing cut coming back, the newest
results last; and the cut itself only grows as the history does."""

from __future__ import annotations

import itertools
import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.agent_trajectories import CEILINGS, Row, in_process, replay
from context_ceiling import Policy, count, fit
from context_ceiling.core.history_cut import HistoryCut, UnitCosts, history_cut, history_cuts
from context_ceiling.core.vocabulary import Shape
from context_ceiling.formats import FORMATS, SHARED_CACHE
from testkit.traffic.agent_loops import Loop, history_of, provider_valid
from testkit.traffic.trajectories import Trajectory, load_all, to_api, turns

APIS: list[Shape] = list(FORMATS)
TRAJECTORIES = {t.name: t for t in load_all()}
#: the quick tier: the coding trajectory with the most harness messages, both multi-turn ends
QUICK = ("mini-swe-agent-django__django-14349", "tau-bench-airline-task33")


def _row(t: Trajectory, api: Shape, ceiling: float) -> Row:
    bodies = list(turns(t, api))
    peak = max(count(b, shape=api).total for b in bodies)
    row = Row(t.framework, t.name, api, ceiling, peak=peak, budget=int(ceiling * peak))
    return replay(row, bodies, in_process(api, row.budget))


def _floor(body: dict[str, Any], api: Shape) -> int:
    """What the history stages cannot remove from a turn: the system prompt, the task, the
    newest rounds and what the model answers."""
    _, report = fit(body, shape=api, budget=1, policy=Policy(stages=["clear", "history"]))
    return report.after


def _judge(t: Trajectory, api: Shape, ceiling: float) -> None:
    row = _row(t, api, ceiling)
    ok = row.passes()
    where = f"{t.name} {api} {ceiling:.0%}"
    assert ok["valid"] and ok["reappeared"], where
    bodies = list(turns(t, api))
    floors = [_floor(b, api) for b in bodies]
    for body, floor in zip(bodies, floors, strict=True):
        _, report = fit(body, shape=api, budget=row.budget)
        assert report.fits or floor > row.budget, f"{where}: rejected though the floor fits"
    if max(floors) <= row.budget:
        assert ok["latest"], where
    step = Policy().clear_at_least * row.budget
    if max(floors) <= row.budget - step:  # each event can free a step: the targets hold
        assert ok["prefix"] and ok["uncached"] and ok["cost"] and ok["events"], (where, row)


@pytest.mark.parametrize("name", QUICK)
@pytest.mark.parametrize("api", APIS)
def test_real_trajectories_keep_running_and_keep_the_cache(name: str, api: Shape) -> None:
    for ceiling in CEILINGS:
        _judge(TRAJECTORIES[name], api, ceiling)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(set(TRAJECTORIES) - set(QUICK)))
def test_every_shipped_trajectory(name: str) -> None:
    for api in APIS:
        for ceiling in CEILINGS:
            _judge(TRAJECTORIES[name], api, ceiling)


def test_the_shipped_trajectories_are_real_and_sourced() -> None:
    frameworks = {t.framework for t in TRAJECTORIES.values()}
    assert frameworks == {"mini-swe-agent", "swe-agent", "tau-bench"}
    for t in TRAJECTORIES.values():
        assert {"repository", "commit", "path", "licence"} <= set(t.source)
        assert len(t.source["commit"]) == 40
        for api in APIS:
            assert all(provider_valid(api, b) for b in turns(t, api)), (t.name, api)
    coding = [t for t in TRAJECTORIES.values() if t.framework == "mini-swe-agent"]
    # long loops, and short ones, where the task and the newest rounds are more of the ceiling
    assert sum(t.model_turns >= 60 for t in coding) >= 8
    assert any(t.model_turns < 40 for t in coding)
    # the harness's own user messages in the middle of the loop
    assert any(sum(1 for m in t.messages[2:] if m["role"] == "user") >= 10 for t in coding)


def test_swe_agent_runs_keep_both_of_its_modes() -> None:
    """SWE-agent's function-calling runs keep their own tools (ids made unique where the record
    repeats one), its thought-and-command runs become ``bash`` calls answered by the command's
    output; every call is answered once (but the last reply's, which ends the run)."""
    runs = load_all("swe-agent")
    tools = [
        {c["name"] for m in t.messages if m["role"] == "assistant" for c in m["calls"]}
        for t in runs
    ]
    assert any(names == {"bash"} for names in tools)
    assert any({"open", "submit"} <= names for names in tools)
    for t in runs:
        replies = [m for m in t.messages if m["role"] == "assistant"]
        calls = [c["id"] for m in replies for c in m["calls"]]
        answered = [m["call_id"] for m in t.messages if m["role"] == "tool"]
        assert len(set(calls)) == len(calls) and len(set(answered)) == len(answered), t.name
        last = {c["id"] for c in replies[-1]["calls"]}
        assert set(calls) - last <= set(answered) <= set(calls), t.name


def test_a_kept_user_message_keeps_the_reply_it_answers() -> None:
    seen = 0
    for t in load_all("tau-bench"):
        bodies = list(turns(t, "openai"))
        peak = count(bodies[-1], shape="openai").total
        for body in bodies:
            out, report = fit(body, shape="openai", budget=int(0.5 * peak))
            if not report.trimmed:
                continue
            given, kept = history_of("openai", body), history_of("openai", out)
            where = {id(m): k for k, m in enumerate(given)}
            for k, m in enumerate(kept[2:], 2):  # after the system prompt and the task
                if m.get("role") != "user":
                    continue
                seen += 1
                before = given[where[id(m)] - 1]
                assert before.get("role") == "assistant" and kept[k - 1] is before
    assert seen


def test_gemini_results_are_shortened_where_the_openai_shape_fits() -> None:
    """One long tool result in a short loop: the tool_results stage shortens it in both
    shapes, so Gemini fits wherever the same conversation in OpenAI's shape does."""
    msgs: list[dict[str, Any]] = [
        {"role": "system", "text": "You are an agent."},
        {"role": "user", "text": "Read the log and say what failed."},
        {"role": "assistant", "text": "", "calls": [{"id": "c1", "name": "cat", "args": {}}]},
        {"role": "tool", "call_id": "c1", "name": "cat", "text": "log line\n" * 4000},
    ]
    openai_body, gemini_body = to_api(msgs, "openai"), to_api(msgs, "gemini")
    budget = count(openai_body, shape="openai").total // 3
    _, a = fit(openai_body, shape="openai", budget=budget)
    out, g = fit(gemini_body, shape="gemini", budget=budget)
    assert a.fits and g.fits and g.removed["tool_results"] > 0
    text = out["contents"][-1]["parts"][0]["functionResponse"]["response"]["result"]
    assert "tokens removed by context-ceiling" in text


def test_the_public_count_remembers_the_history_it_counted() -> None:
    bodies = list(Loop("anthropic", rounds=40, seed=9).turns())
    for body in bodies[:-1]:
        count(body, shape="anthropic")
    hits = SHARED_CACHE.hits
    cached = count(bodies[-1], shape="anthropic")
    assert SHARED_CACHE.hits > hits
    assert cached.total == count(bodies[-1], shape="anthropic", cache=False).total
    out, report = fit(bodies[-1], shape="anthropic", budget=cached.total // 2)
    assert report.after == count(out, shape="anthropic", cache=False).total


# -- the cut, as a function of the history ---------------------------------------------------------


@st.composite
def histories(draw: st.DrawFn) -> tuple[UnitCosts, int, int]:
    n = draw(st.integers(2, 40))
    rng = random.Random(draw(st.integers(0, 2**32)))
    size = [rng.randint(50, 3000) for _ in range(n)]
    drop = [s - rng.randint(0, 20) for s in size]
    clear = [rng.randint(0, d) if rng.random() < 0.7 else 0 for d in drop]
    tools = [c > 0 for c in clear]
    protect, keep = [0], [frozenset[int]()]
    for e in range(1, n + 1):
        protect.append(e - 1)
        newest = [u for u in range(e) if tools[u]][-3:]
        keep.append(frozenset(u for u in newest if u < e - 1))
    costs = UnitCosts(size, drop, clear, protect, keep, base=rng.randint(0, 2000))
    budget = draw(st.integers(500, sum(size) + 2000))
    step = draw(st.integers(1, budget))
    return costs, budget, step


def _states(cut: HistoryCut, n: int) -> list[int]:
    """0 whole, 1 cleared, 2 dropped, per unit."""

    def state(u: int) -> int:
        if u in cut.kept:
            return 0
        if u in cut.lifted:
            return 1
        return 2 if u < cut.drop else 1 if u < cut.clear else 0

    return [state(u) for u in range(n)]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(history=histories(), drop=st.booleans(), clear=st.booleans())
def test_a_unit_cut_at_one_turn_stays_cut_at_every_later_one(
    history: tuple[UnitCosts, int, int], drop: bool, clear: bool
) -> None:
    costs, budget, step = history
    n = len(costs.size)
    previous = [0] * n
    scanned = list(history_cuts(costs, budget=budget, step=step, drop=drop, clear=clear))
    assert len(scanned) == n
    for e in range(1, n + 1):
        cut = history_cut(costs, budget=budget, step=step, drop=drop, clear=clear, units=e)
        assert scanned[e - 1] == cut, "one scan gives every earlier turn's cut"
        states = _states(cut, e)
        assert all(s >= p for s, p in zip(states, previous, strict=False)), e
        assert all(s == 0 for s in states[costs.protect[e] :]), "protected units stay"
        for u in costs.keep[e]:  # the newest tool uses go last
            assert states[u] == 0 or all(states[:u]), (e, u)
        previous = states
        if drop:
            before = history_cut(costs, budget=budget, step=step, drop=drop, clear=clear, units=e)
            assert before == cut, "the cut is a function of the history"


def test_the_newest_results_go_in_the_same_event_once_nothing_older_is_left() -> None:
    """Every unit a tool use of 1,000 tokens (900 of them its result), the three newest held
    back: once the older units are gone and the room is still short of a step, the same event
    clears the newest results too, oldest first (the newest kept whole), instead of freeing just
    enough at every turn to come; with clearing off they stay."""
    n = 12
    protect = [0, *range(n)]
    keep = [frozenset[int](), *(frozenset(range(max(0, e - 4), e - 1)) for e in range(1, n + 1))]
    costs = UnitCosts([1000] * n, [1000] * n, [900] * n, protect, keep, base=2000)
    cuts = list(history_cuts(costs, budget=7000, step=2500))
    assert cuts[5] == HistoryCut(5, 5, frozenset({4}), frozenset({2, 3}))
    events = sum(a != b for a, b in itertools.pairwise(cuts))
    assert events == 3 <= 1 + (n * 1000 + 2000 - 7000) / 2500
    assert not any(c.lifted for c in history_cuts(costs, budget=7000, step=2500, clear=False))


@pytest.mark.parametrize("name", ["tau-bench-airline-task7", "tau-bench-airline-task9"])
def test_gemini_fits_wherever_the_openai_shape_fits_at_the_same_budget(name: str) -> None:
    """A multi-turn agent whose system prompt is most of a 40% ceiling: the same conversation in
    Gemini's shape counts as it does in OpenAI's (calls and results as the other APIs count
    them, no ids, a text result as text), so no Gemini turn is refused that fits as OpenAI."""
    t = TRAJECTORIES[name]
    chat, gemini = list(turns(t, "openai")), list(turns(t, "gemini"))
    peak = max(count(b, shape="openai").total for b in chat)
    assert max(count(b, shape="gemini").total for b in gemini) <= 1.02 * peak
    for ceiling in CEILINGS:
        budget = int(ceiling * peak)
        for k, (a, g) in enumerate(zip(chat, gemini, strict=True)):
            if fit(a, shape="openai", budget=budget)[1].fits:
                assert fit(g, shape="gemini", budget=budget)[1].fits, (name, ceiling, k)


def test_a_tool_calls_arguments_count_alike_in_every_api() -> None:
    """The same call with longer arguments adds the same tokens in every API's counter (each
    counts a call through ``core.counting.call_tokens``: framing, name, the arguments' text)."""

    def conversation(path: str) -> list[dict[str, Any]]:
        call = {"id": "call_1", "name": "read_file", "args": {"path": path}}
        return [
            {"role": "system", "text": "You are a coding agent."},
            {"role": "user", "text": "Read the file."},
            {"role": "assistant", "text": "", "calls": [call]},
            {"role": "tool", "call_id": "call_1", "name": "read_file", "text": "done"},
        ]

    added = {
        api: count(to_api(conversation("src/" + "module/" * 40 + "a.py"), api), shape=api).total
        - count(to_api(conversation("a.py"), api), shape=api).total
        for api in ("openai", "anthropic", "responses", "converse", "gemini")
    }
    assert len(set(added.values())) == 1 and min(added.values()) > 40, added
