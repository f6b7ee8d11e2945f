"""The cut of a growing conversation: which of its oldest units are dropped and which have
their tool results cleared, read from the history itself as it grew.

The trimmer (``context_ceiling.core.trim``) splits a request's history into units and says what
each is worth (:class:`UnitCosts`); :func:`history_cuts` gives the cut of every history from the
first unit to the whole request, the same cut each earlier turn of the conversation got. Apart
from the trimmer so the rule can be read, tested and simulated on numbers alone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

__all__ = ["HistoryCut", "UnitCosts", "history_cut", "history_cuts"]


@dataclass(frozen=True, slots=True)
class HistoryCut:
    """One plan over a history's units: ``[0, drop)`` dropped, ``[drop, clear)`` cleared, the
    rest sent as they are; the units in ``kept`` are sent as they are wherever they fall, those
    in ``lifted`` (newest tool uses an event had to clear) with their tool results cleared."""

    drop: int = 0
    clear: int = 0
    kept: frozenset[int] = frozenset()
    lifted: frozenset[int] = frozenset()


@dataclass(frozen=True, slots=True)
class UnitCosts:
    """What the units of a history are worth, for :func:`history_cut`: per unit, its tokens as
    sent (``size``), what dropping it frees (``drop``: its system messages stay) and what
    clearing its results frees (``clear``); per history of the first ``e`` units, its first
    protected unit (``protect[e]``: it and every later one stay) and the units of its newest
    tool uses (``keep[e]``); and the request's tokens outside the units (``base``)."""

    size: list[int]
    drop: list[int]
    clear: list[int]
    protect: list[int]
    keep: list[frozenset[int]]
    base: int


def _sums(values: list[int]) -> list[int]:
    out = [0]
    for v in values:
        out.append(out[-1] + v)
    return out


def _released(
    c: HistoryCut, enough: Callable[[HistoryCut], bool], clearable: list[int]
) -> HistoryCut:
    """``c`` with the units it holds back let go until ``enough``: everything older is gone and
    the room is still short of a step, so the newest tool uses' results are cleared too, oldest
    first, in the same event, rather than one more event (or a shortened result, which differs
    every turn) on the turns to come; a unit with nothing worth clearing goes whole, so no older
    result outlives a newer one; still short, the cleared ones go whole, oldest first."""
    for u in sorted(c.kept):
        if enough(c):
            return c
        lifted = c.lifted | {u} if clearable[u] > 0 else c.lifted
        c = HistoryCut(c.drop, c.clear, c.kept - {u}, lifted)
    for u in sorted(c.lifted):
        if enough(c):
            return c
        c = HistoryCut(c.drop, c.clear, c.kept, c.lifted - {u})
    return c


def history_cut(
    costs: UnitCosts,
    *,
    budget: int,
    step: int,
    drop: bool = True,
    clear: bool = True,
    units: int | None = None,
) -> HistoryCut:
    """The cut for the history of the first ``units`` units (all: the request); see
    :func:`history_cuts`."""
    cuts = list(history_cuts(costs, budget=budget, step=step, drop=drop, clear=clear, units=units))
    return cuts[-1] if cuts else HistoryCut()


def history_cuts(
    costs: UnitCosts,
    *,
    budget: int,
    step: int,
    drop: bool = True,
    clear: bool = True,
    units: int | None = None,
) -> Iterator[HistoryCut]:
    """The cut that fits each history of the first 1, 2, ... ``units`` units (all: the request)
    into ``budget``, one per history, in order: a function of the history alone, and the same
    cut every earlier turn of the conversation got, extended only where needed.

    The history is read as the conversation grew, one unit at a time, as each earlier request
    was. While a history fits with the cut so far, the cut stays. Where it no longer fits, the
    cut grows once, enough to leave ``step`` tokens of room (a clearing event): older tool
    results cleared, oldest first, up to the protected units; when clearing cannot free that
    much, all of them cleared and the oldest units dropped in the same event; when nothing
    more can go, everything before the protected units. The units of the newest tool uses
    (``costs.keep``) are passed over when the cut grows, and stay as they are until the next
    event; only when everything older is gone and the room is still short of ``step`` does the
    same event clear their results too, oldest first (their calls stay; a unit with nothing
    worth clearing goes whole), and, still short, drop them whole, oldest first (with
    ``clear`` off, neither): a history whose newest results are most of what can go still gets
    one event per step instead of one a turn.

    Why: replicas keep no conversation state, so the cut must follow from the history; read
    this way, it is what the previous turn was sent (the provider's prefix cache keeps hitting
    between events), what is cut at one turn stays cut at every later one, and each event
    frees about ``step`` whatever share of the history tool results are, so events come about
    once per ``step`` tokens of growth."""
    n = len(costs.size) if units is None else units
    size, dropped, cleared = _sums(costs.size[:n]), _sums(costs.drop[:n]), _sums(costs.clear[:n])
    step = max(1, step)

    def freed(c: HistoryCut) -> int:
        def out(u: int) -> int:
            return costs.drop[u] if u < c.drop else costs.clear[u]

        held = sum(out(u) for u in c.kept) + sum(out(u) - costs.clear[u] for u in c.lifted)
        return dropped[c.drop] + cleared[max(c.drop, c.clear)] - cleared[c.drop] - held

    cut = HistoryCut()
    for e in range(1, n + 1):
        now = freed(cut)
        over = costs.base + size[e] - now - budget
        if over <= 0:
            yield cut
            continue
        reached = max(cut.drop, cut.clear)
        q = max(costs.protect[e], reached)
        # the newest tool uses' units stay whole, but never come back once an event cleared
        # them (a cleared one stays cleared while it is among the newest, then goes as any)
        keep = frozenset(u for u in costs.keep[e] if u >= reached or u in cut.kept)
        lifted = frozenset(u for u in cut.lifted if u in costs.keep[e])
        target = now + over + step

        def grown(
            d: int, c: int, keep: frozenset[int] = keep, lifted: frozenset[int] = lifted
        ) -> HistoryCut:
            r = max(d, c)
            return HistoryCut(d, c, frozenset(u for u in keep if u < r), lifted)

        def released(c: HistoryCut, target: int = target) -> HistoryCut:
            return _released(c, lambda c: freed(c) >= target, costs.clear) if clear else c

        # clearing alone, as little as leaves the room
        lo = max(cut.clear, cut.drop)
        if clear:
            x = next((x for x in range(lo, q + 1) if freed(grown(cut.drop, x)) >= target), None)
            if x is not None:
                cut = grown(cut.drop, x)
                yield cut
                continue
        reach = q if clear else lo
        if not drop:
            cut = released(grown(cut.drop, reach))
            yield cut
            continue
        d = next((d for d in range(cut.drop, q + 1) if freed(grown(d, max(d, reach))) >= target), q)
        cut = released(grown(d, max(d, reach)))
        yield cut
