"""Fit a chat request into its token budget the way an engineer would by hand.

Stages, in a configurable order, each run only while the request is still over budget:

- ``clear`` (requests that use tools): the history after the task is cut into units, each
  starting where the model replies (its calls, their results and any user message that follows:
  a harness's format error, a reminder, a simulated user's answer). Older tool results are
  replaced whole by a one-line placeholder that names the tool, the call id and the tokens
  cleared (optionally clearing the cleared calls' inputs too), oldest first; when clearing
  cannot free enough, the oldest units are dropped whole in the same event. The system prompt,
  the task, what the model answers now, the units of the latest ``keep`` tool uses and the tools
  in ``exclude_tools`` stay. Cache-aware and stateless: the cut is read from the history as it
  grew (``context_ceiling.core.history_cut``), so every earlier turn got the same cut, it only grows, and it grows
  by at least ``clear_at_least`` at a time (a clearing event), so the turns between two events
  only append to what was forwarded (the provider's prefix cache keeps hitting);
- ``tool_results``: shorten tool results carried forward, oldest first, each only as far as the
  budget still needs and never below N tokens, keeping its head and tail around a visible marker
  that says how many tokens were removed; the latest ``keep`` results, while the model works with
  them, only once nothing else is left;
- ``retrieved``: drop retrieved chunks (Anthropic ``document``/``search_result`` blocks, text
  matching the chunk pattern) in user and tool messages, whole chunks only, the lowest-ranked
  (last) first, until it fits;
- ``history``: drop the oldest units whole by the same rule (in a conversation without tools,
  the oldest exchanges: a reply of the model and the user message after it), keeping system
  messages, the task (configurable; without it the units are whole turns) and what the model
  answers now.

A turn is what the providers' rules make one unit: a user message that starts it, then every
assistant message with its tool calls and the messages that answer them (OpenAI ``tool``
messages; Anthropic user messages that hold ``tool_result`` blocks, whatever else they hold, such
as the text reminders coding agents attach), thinking and redacted-thinking blocks included, never
modified. Cutting only before a reply of the model (after the task) or before a turn keeps
Anthropic's alternation and a user message first; no tool call or tool result is ever
orphaned; assistant messages are edited only to empty a cleared call's input.

Anthropic ``cache_control`` prefixes are cut only when nothing else fits, and the cache loss is
counted. The request is counted once (the sidecar passes its count in); trimming works on the
per-part counts and re-tokenizes only the small texts it rewrites, then the output is counted
again with the same counter: ``report.after`` is that recount (markers and placeholders
included), and ``fits`` is true only when it is within budget (a short further round runs when
the estimate was optimistic). Nothing is left empty: a text emptied by trimming is dropped, or,
when it was a message's only content, replaced by a one-line placeholder.

Application code can call :func:`fit` in its own request builder; the sidecar is the safety net.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import Field

from context_ceiling.core.counting import Part, RequestCount, json_text, prior_of
from context_ceiling.core.history_cut import HistoryCut, UnitCosts, history_cuts
from context_ceiling.core.models import ChatFormat
from context_ceiling.core.strict import Strict
from context_ceiling.core.tokenizers import TextCounter
from context_ceiling.core.trim_rules import PLACEHOLDER, ToolUse, TrimRules
from context_ceiling.core.utilization import Component
from context_ceiling.core.vocabulary import STAGES, Stage

MARKER = "\n[... {n} tokens removed by context-ceiling ...]\n"
MARKER_RE = re.compile(r"\n?\[\.\.\. (\d+) tokens removed by context-ceiling \.\.\.\]\n?")
CLEARED = "[tool result cleared by context-ceiling: {name} (call {id}), {n} tokens]"
CLEARED_RE = re.compile(r"\[tool result cleared by context-ceiling: .* \(call .*\), \d+ tokens\]")
MAX_ROUNDS = 4  # trim, recount; a second round is rare (an optimistic estimate), a fourth unseen
STUB = "[document removed by context-ceiling to fit the context budget]"


class Policy(Strict):
    """How to trim (one per workload)."""

    #: the trim stages, in the order they run
    stages: list[Stage] = Field(default_factory=lambda: list(STAGES))
    #: a tool result is never cut below this many tokens
    tool_result_max_tokens: int = Field(default=1024, ge=16)
    #: keep at most this many retrieved chunks, whatever the budget (none: no cap)
    max_retrieved_chunks: int | None = Field(default=None, ge=0)
    #: never drop the first user message (the task of an agent loop)
    keep_first_user: bool = True
    #: never edit what sits before an Anthropic cache_control breakpoint
    protect_cache_prefix: bool = True
    #: the latest tool uses, cut last: their rounds are cleared (then dropped), oldest first,
    #: only once everything older is gone and a clearing event still lacks ``clear_at_least``
    #: of room (fewer events, the prompt cache kept between them), and their results are the
    #: last thing the ``tool_results`` stage shortens
    keep: int = Field(default=3, ge=0)
    #: tools whose results are never cleared
    exclude_tools: list[str] = Field(default_factory=list)
    #: when a result is cleared, clear its call's input too (edits the assistant message)
    clear_tool_inputs: bool = False
    #: each clearing event leaves at least this much room: a share of the budget below 1, tokens
    #: from 1 up. Larger means fewer events, and between events every turn only appends to the
    #: previous forwarded request, which the provider's prompt cache serves at a tenth of the price
    clear_at_least: float = Field(default=0.6, gt=0)
    #: the clear stage drops the oldest whole rounds when clearing results is not enough
    drop_tool_rounds: bool = True


@dataclass
class FitReport:
    """What fitting did (or, in observe mode, would do)."""

    budget: int
    before: int
    after: int
    removed: dict[str, int] = field(default_factory=lambda: dict.fromkeys(STAGES, 0))
    cache_loss_tokens: int = 0
    actions: list[str] = field(default_factory=list)
    #: tool results replaced by a placeholder (all of them, not only this turn's new ones)
    cleared_tool_uses: int = 0
    #: whole tool rounds dropped inside the kept turns
    dropped_tool_rounds: int = 0
    #: this request cleared or dropped more than the previous turn of its loop would have: the
    #: point where the forwarded history changes, and the prompt cache misses once
    clearing_event: bool = False

    @property
    def fits(self) -> bool:
        return self.after <= self.budget

    @property
    def trimmed(self) -> int:
        return sum(self.removed.values())


def input_budget(window: int, reservation: int, ceiling_tokens: int | None = None) -> int:
    """Input tokens allowed: the ceiling, and never more than the window minus the reservation."""
    budget = window - reservation
    if ceiling_tokens is not None:
        budget = min(budget, ceiling_tokens)
    return max(0, budget)


def _cut(text: str, spans: set[tuple[int, int]]) -> str:
    out, pos = [], 0
    for start, end in sorted(spans):
        if start < pos:
            continue
        out.append(text[pos:start])
        pos = end + 1 if text[end : end + 1] == "\n" else end
    out.append(text[pos:])
    return "".join(out)


@dataclass(slots=True)
class _Unit:
    """A run of messages that starts where the history may be cut: a reply of the model with
    its calls, their results and any user message that follows (with the task kept), or a
    whole turn (without)."""

    start: int
    end: int
    #: what dropping it frees (its system messages stay)
    whole: int = 0
    #: what clearing its tool results (and, by the policy, their calls' inputs) frees
    clearable: int = 0
    #: its results that clearing replaces: (the use, what it frees, the placeholder)
    results: list[tuple[ToolUse, int, str]] = field(default_factory=list)
    #: never cut (it holds the latest server-side compaction)
    fixed: bool = False


class _Trimmer:
    def __init__(
        self,
        body: Mapping[str, Any],
        rules: TrimRules,
        count: RequestCount,
        counter: TextCounter,
        policy: Policy,
        budget: int,
    ) -> None:
        self.body, self.rules, self.counter, self.policy = body, rules, counter, policy
        self.messages: list[Any] = rules.items(body)
        #: where a message keeps its blocks
        self.key = rules.blocks_key
        self.parts = count.by_message()
        #: tokens the stages took from each message so far (a message history drops is worth
        #: what is left of it)
        self.taken: dict[int, int] = {}
        self.report = FitReport(budget=budget, before=count.total, after=count.total)
        self.drop_messages: set[int] = set()
        self.drop_blocks: dict[int, set[int]] = defaultdict(set)
        # sets: a RAG prompt drops a hundred chunks from one text (a list's membership test made
        # dropping them quadratic in the number of chunks)
        self.spans: dict[tuple[int, int], set[tuple[int, int]]] = defaultdict(set)
        self.replace: dict[tuple[int, int], Any] = {}
        #: calls whose input the clear stage emptied (``clear_tool_inputs``)
        self.clear_inputs: set[tuple[int, int]] = set()
        self._cites: bool | None = None
        self.dropped_in_rounds = 0  # messages the clear stage dropped with their tool rounds
        self.first_cut: tuple[int, int] | None = None
        self.boundary = self._cache_boundary()
        self.count = count
        self._marker_tokens: int | None = None
        self._uses: list[ToolUse] | None = None
        #: cited documents dropped to a stub (retrieved chunks, not tool results)
        self.stubs = 0
        #: the newest results may be shortened too (nothing older was left to cut)
        self.lift_keep = False

    @property
    def marker_tokens(self) -> int:
        """The marker's tokens (a long removed count), counted only when a tool result is cut."""
        if self._marker_tokens is None:
            self._marker_tokens = self.counter.count(MARKER.format(n=100000))
        return self._marker_tokens

    # -- bookkeeping -------------------------------------------------------------------------

    def fits(self) -> bool:
        return self.report.after <= self.report.budget

    def _take(self, kind: Stage, i: int, j: int, tokens: int, cut: bool = True) -> None:
        self.report.after -= tokens
        self.report.removed[kind] += tokens
        self.taken[i] = self.taken.get(i, 0) + tokens
        if cut and (self.first_cut is None or (i, j) < self.first_cut):
            self.first_cut = (i, j)

    def _cache_boundary(self) -> tuple[int, int] | None:
        if not self.rules.cache_control:
            return None
        last: tuple[int, int] | None = None
        for i, m in enumerate(self.messages):
            content = m.get("content") if isinstance(m, dict) else None
            if isinstance(content, list):
                for j, b in enumerate(content):
                    if self.rules.cache_point(b):
                        last = (i, j)
        return last

    def _protected(self, i: int, j: int, allow_prefix: bool) -> bool:
        return not allow_prefix and self.boundary is not None and (i, j) <= self.boundary

    # -- stages ------------------------------------------------------------------------------

    def _target(self, tokens: int) -> int:
        """What one tool result keeps, marker included: only as much is removed as the budget
        still needs, and never below the policy's floor."""
        needed = self.report.after - self.report.budget
        return max(self.policy.tool_result_max_tokens, tokens - needed)

    def _step(self) -> int:
        """The room a clearing event leaves at least (``clear_at_least``: a share of the budget
        below 1, tokens from 1 up)."""
        v = self.policy.clear_at_least
        return max(1, int(v * self.report.budget) if v < 1 else int(v))

    def _is_result(self, i: int) -> bool:
        m = self.messages[i] if 0 <= i < len(self.messages) else None
        return isinstance(m, dict) and self.rules.is_result(m)

    def _content_tokens(self, i: int) -> int:
        return sum(p.tokens for p in self.parts.get(i, ()) if not p.frame)

    def _result_tokens(self, i: int, j: int) -> int:
        """What the tool result at message ``i``, block ``j`` (-1: the whole message) is worth,
        its framing (which a shortened result keeps) left out."""
        if j < 0:
            tokens = self._content_tokens(i)
        else:
            tokens = sum(p.tokens for p in self.parts.get(i, ()) if p.block == j)
        return tokens - self.rules.result_overhead(self.messages[i], j, self.counter)

    def _tool_uses(self) -> list[ToolUse]:
        """Every tool use whose result is in the request, in order, with its call's place."""
        if self._uses is None:
            self._uses = self.rules.tool_uses(self.messages, self._result_tokens)
        return self._uses

    def _newest(self) -> set[tuple[int, int]]:
        """The results of the ``keep`` newest tool uses while the model works with them (the
        request ends with tool results): the last thing any stage cuts. A request that ends
        with a new user message carries them forward like any older result."""
        uses = self._tool_uses()
        asks = next(
            (
                m
                for m in reversed(self.messages)
                if not (isinstance(m, dict) and self.rules.is_reply(m))
            ),
            None,
        )
        if not self.policy.keep or asks is None or self.rules.starts_turn(asks):
            return set()
        return {u.result for u in uses[max(0, len(uses) - self.policy.keep) :]}

    def _tail(self) -> int:
        """Where what this turn appended to the previous one starts: the latest reply of the
        model (and what answers it). -1: there is no previous turn."""
        for i in range(len(self.messages) - 1, -1, -1):
            m = self.messages[i]
            if isinstance(m, dict) and self.rules.is_reply(m):
                return self.rules.reply_start(self.messages, i)
        return -1

    def _left(self, i: int) -> int:
        """What message ``i`` is still worth."""
        return sum(p.tokens for p in self.parts.get(i, ())) - self.taken.get(i, 0)

    # -- the cut: clearing and dropping, read from the history ----------------------------------

    def _head_end(self, messages: list[Any]) -> int:
        """Where the cuttable history starts: after the task (the first user message that starts
        a turn, and everything before it) when it is kept; else after the leading system
        messages."""
        if self.policy.keep_first_user:
            for i, m in enumerate(messages):
                if self.rules.starts_turn(m):
                    return i + 1
        i = 0
        while i < len(messages) and self._system(i):
            i += 1
        return i

    def _boundaries(self, start: int, end: int, uses: list[ToolUse]) -> list[int]:
        """Where the history between ``start`` and ``end`` may be cut so that what is kept is
        valid for the provider: before a reply of the model (the task kept: the message before
        the kept part is a user message, so turns still alternate), or before a user message
        that starts a turn (the task not kept); never between a call and its result."""
        open_ = [False] * (end + 1)
        for u in uses:
            if u.call is not None:
                for i in range(u.call[0] + 1, min(u.result[0], end) + 1):
                    open_[i] = True
        out = []
        for b in range(start + 1, end):
            m, prev = self.messages[b], self.messages[b - 1]
            if open_[b] or not isinstance(m, dict):
                continue
            if self.policy.keep_first_user:
                ok = self.rules.is_reply(m) and not (
                    isinstance(prev, dict) and self.rules.is_reply(prev)
                )
            else:
                ok = self.rules.starts_turn(m)
            if ok:
                out.append(b)
        return out

    def _units(self, uses: list[ToolUse], clear: bool) -> tuple[list[_Unit], UnitCosts]:
        """The cuttable units of the history and what they are worth (see :class:`UnitCosts`):
        per history of the first ``e`` units, the latest unit holding what the model answers
        (a user message or tool results, with the reply they answer; an assistant prefill after
        it stays too) and every unit after it, and the unit of the latest compaction, are never
        cut; the units of its ``keep`` newest tool uses are passed over (see
        :meth:`_protection`)."""
        end = len(self.messages)
        head = self._head_end(self.messages)
        if head >= end:
            return [], UnitCosts([], [], [], [0], [frozenset()], self.report.after)
        starts = [head, *self._boundaries(head, end, uses)]
        units = [
            _Unit(s, starts[k + 1] if k + 1 < len(starts) else end) for k, s in enumerate(starts)
        ]
        unit_of = {i: k for k, u in enumerate(units) for i in range(u.start, u.end)}
        comp = self._latest_compaction()
        excluded = set(self.policy.exclude_tools)
        by_message: dict[int, list[ToolUse]] = defaultdict(list)
        for u in uses:
            by_message[u.result[0]].append(u)
        size: list[int] = []
        for unit in units:
            unit.fixed = unit.start <= comp < unit.end
            left = [(i, self._left(i)) for i in range(unit.start, unit.end)]
            size.append(sum(t for _, t in left))
            if unit.fixed:
                continue
            unit.whole = sum(
                t for i, t in left if not self._system(i) and i not in self.drop_messages
            )
            if not clear:
                continue
            for i in range(unit.start, unit.end):
                for u in by_message.get(i, ()):
                    if u.name in excluded or u.result in self.replace or i in self.drop_messages:
                        continue
                    if self._already_cleared(u):
                        continue  # a placeholder (an earlier round's, or the client resent ours)
                    text = CLEARED.format(name=u.name or "tool", id=u.call_id or "?", n=u.tokens)
                    # two tokens of slack a result: the recount of a replaced block can differ
                    gain = u.tokens - self.counter.count(text) - 2
                    if gain > 0:
                        unit.results.append((u, gain, text))
                        unit.clearable += gain
                        if self.policy.clear_tool_inputs and u.call is not None:
                            unit.clearable += self._input_saving(u.call)
        # the first protected unit of each history of e units: its last unit, and the unit of
        # the call of its keep-th newest tool use (uses are in the order of their results)
        protect, keep = self._protection(units, unit_of, uses)
        base = self.report.after - sum(size)
        costs = UnitCosts(
            size, [u.whole for u in units], [u.clearable for u in units], protect, keep, base
        )
        return units, costs

    def _protection(
        self, units: list[_Unit], unit_of: dict[int, int], uses: list[ToolUse]
    ) -> tuple[list[int], list[frozenset[int]]]:
        """Per history of the first ``e`` units: the first unit that stays with every later one
        (the latest holding what the model answers; the latest user message too while fewer
        than ``keep`` tool uses came since), and the units of its ``keep`` newest tool uses."""
        protect = [0]
        keep: list[frozenset[int]] = [frozenset()]
        seen: list[ToolUse] = []
        pending = sorted(uses, key=lambda u: u.result)
        asks = -1  # the latest unit holding what the model answers (not only its own reply)
        user = -1  # the latest unit holding a user message that starts a turn
        since = 0  # tool uses after it
        for e in range(1, len(units) + 1):
            while pending and unit_of.get(pending[0].result[0], -1) < e:
                seen.append(pending.pop(0))
                since += 1
            unit = units[e - 1]
            here = self.messages[unit.start : unit.end]
            if any(not (isinstance(m, dict) and self.rules.is_reply(m)) for m in here):
                asks = e - 1
            if any(self.rules.starts_turn(m) for m in here):
                user, since = e - 1, 0  # a unit's results come before its user message
            guard = asks if asks >= 0 else e - 1
            newest = seen[max(0, len(seen) - self.policy.keep) :] if self.policy.keep else []
            if self.policy.keep and since < self.policy.keep and user >= 0:
                guard = min(guard, user)  # fewer tool uses than keep since the latest user message
            protect.append(guard)
            held = {unit_of[u.result[0]] for u in newest if u.result[0] in unit_of}
            held |= {unit_of[u.call[0]] for u in newest if u.call and u.call[0] in unit_of}
            keep.append(frozenset(k for k in held if k < guard))
        return protect, keep

    def _cut(self, stage: Stage, allow_prefix: bool, drop: bool, clear: bool) -> None:
        """Cut the history (see :func:`history_cuts`); a clearing event when the cut
        differs from the one the turn before got."""
        if self.fits():
            return
        if (
            self.boundary is not None
            and not allow_prefix
            and self.boundary[0] >= self._head_end(self.messages)
        ):
            return  # every cut would edit the cached prefix: only when nothing else fits
        units, costs = self._units(self._tool_uses(), clear)
        if not units:
            return
        cuts = list(
            history_cuts(
                costs, budget=self.report.budget, step=self._step(), drop=drop, clear=clear
            )
        )
        cut = cuts[-1]
        if not cut.clear:
            return
        tail = self._tail()
        # the turn before sent the history up to the latest reply: the units that end there
        e = sum(1 for u in units if u.end <= tail) if tail > 0 else 0
        before = cuts[e - 1] if e else HistoryCut()
        event = cut != before
        for k, unit in enumerate(units):
            if unit.fixed or k in cut.kept:
                continue
            if k < cut.drop and k not in cut.lifted:
                changed = event and (k >= before.drop or k in before.kept or k in before.lifted)
                for i in range(unit.start, unit.end):
                    if self._system(i) or i in self.drop_messages:
                        continue
                    self.drop_messages.add(i)
                    if stage == "clear":
                        self.dropped_in_rounds += 1
                    self._take(stage, i, -1, self._left(i), cut=changed)
                if stage == "clear":
                    self.report.dropped_tool_rounds += 1
            elif k < cut.clear or k in cut.lifted:
                changed = event and (k >= before.clear or k in before.kept)
                for u, gain, text in unit.results:
                    i, j = u.result
                    self.replace[(i, j)] = self.rules.placeholder(self.messages[i], j, text)
                    self._take("clear", i, j, gain + 2, cut=changed)
                    self.report.cleared_tool_uses += 1
                    if self.policy.clear_tool_inputs and u.call is not None:
                        self._clear_input(u.call)
        self.report.clearing_event |= event

    def clear(self, allow_prefix: bool) -> None:
        """Older tool results replaced whole and the oldest rounds dropped, as the history grew (see the
        module's docstring); only where the request uses tools."""
        if self._tool_uses():
            self._cut("clear", allow_prefix, drop=self.policy.drop_tool_rounds, clear=True)

    def _already_cleared(self, u: ToolUse) -> bool:
        i, j = u.result
        text = self.rules.result_text(self.messages[i], j)
        return isinstance(text, str) and CLEARED_RE.fullmatch(text.strip()) is not None

    def _system(self, i: int) -> bool:
        m = self.messages[i]
        return isinstance(m, dict) and m.get("role") in ("system", "developer")

    def _input_saving(self, call: tuple[int, int]) -> int:
        """What emptying a call's input frees."""
        i, k = call
        old = self.rules.call_input(self.messages[i], k)
        old = old if isinstance(old, str) else json_text(old)
        return max(0, self.counter.count(old) - self.counter.count("{}"))

    def _clear_input(self, call: tuple[int, int]) -> None:
        saved = self._input_saving(call)
        if saved > 0 and call not in self.clear_inputs:
            self.clear_inputs.add(call)
            self._take("clear", call[0], call[1], saved, cut=False)

    def tool_results(self, allow_prefix: bool) -> None:
        """Tool results shortened around a marker, oldest first, the ``keep`` newest only once
        nothing else is left to cut."""
        newest = set() if self.lift_keep else self._newest()
        for i, m in enumerate(self.messages):
            if self.fits():
                return
            if i in self.drop_messages or not isinstance(m, dict):
                continue
            for j, text in self.rules.results(m):
                if self.fits():
                    return
                if text is None:
                    continue  # structured output (images, files): left whole
                if (i, j) in self.replace or self._protected(i, j, allow_prefix):
                    continue
                if (i, j) in newest:
                    continue
                tokens = self._result_tokens(i, j)
                new = self._truncate(text, tokens, self._target(tokens))
                if new is not None:
                    text, new_tokens = new
                    self.replace[(i, j)] = self.rules.placeholder(m, j, text)
                    self._take("tool_results", i, j, tokens - new_tokens)

    def _truncate(self, text: str, tokens: int, target: int) -> tuple[str, int] | None:
        """Head and tail of ``text`` around the marker, ``target`` tokens or fewer in all (a few
        tries: where a cut falls changes the count by a token or two)."""
        if tokens <= target or not text:
            return None
        inner = target - self.marker_tokens
        best: tuple[str, int] | None = None
        # a text already cut (an earlier round, or an upstream proxy) is cut again around its
        # marker, never through it: one marker with the true total
        found = MARKER_RE.search(text)
        before = int(found.group(1)) if found else 0
        left, right = (text[: found.start()], text[found.end() :]) if found else (text, text)
        whole = left if not found else left + right
        for _ in range(4):
            keep = max(1, int(len(whole) * (max(1, inner) / 2) / tokens))
            head, tail = left[:keep], right[-keep:]
            kept = self.counter.count(head) + self.counter.count(tail)
            gone = (tokens - self.marker_tokens if found else tokens) - kept
            new = head + MARKER.format(n=max(0, before + gone)) + tail
            new_tokens = self.counter.count(new)
            if new_tokens < tokens:
                best = (new, new_tokens)
            if new_tokens <= target or inner <= 1:
                break
            inner -= new_tokens - target + 1
        return best

    def retrieved(self, allow_prefix: bool) -> None:
        found: dict[int, list[Part]] = {}
        retrieved = Component.RETRIEVED  # hoisted: an enum member lookup per part adds up
        for p in self.count.parts:  # one pass, not one per message: most messages have none
            if p.component is retrieved and p.message >= 0:
                found.setdefault(p.message, []).append(p)
        by_message = {
            i: found[i]
            for i in sorted(found)
            if i not in self.drop_messages and self._role(i) != "assistant"
        }
        limit = self.policy.max_retrieved_chunks
        if limit is not None:
            for i, chunks in by_message.items():
                for p in chunks[limit:]:
                    if not self._protected(i, p.block, allow_prefix):
                        self._drop_chunk(p)
        for i, chunks in by_message.items():
            for p in reversed(chunks[: limit if limit is not None else len(chunks)]):
                if self.fits():
                    return
                if not self._protected(i, p.block, allow_prefix):
                    self._drop_chunk(p)

    def _cites_documents(self) -> bool:
        """Whether an assistant message cites documents by index (Anthropic citations): then a
        dropped document leaves a stub in its place, so every kept citation names the document
        it named before."""
        if self._cites is None:
            self._cites = self.rules.cites_documents(self.messages)
        return self._cites

    def _drop_chunk(self, p: Part) -> None:
        key = (p.message, p.block)
        m = self.messages[p.message] if p.span is None else None
        block = (
            m["content"][p.block]
            if isinstance(m, dict) and isinstance(m.get("content"), list) and p.block >= 0
            else None
        )
        if (
            isinstance(block, dict)
            and block.get("type") == "document"
            and key not in self.replace
            and self._cites_documents()
        ):
            stub = {k: v for k, v in block.items() if k not in ("source", "context")}
            stub["source"] = {"type": "text", "media_type": "text/plain", "data": STUB}
            saved = (
                p.tokens
                - self.counter.count(STUB)
                - self.counter.count(str(block.get("title") or ""))
            )
            if saved > 0:
                self.replace[key] = stub
                self.stubs += 1
                self._take("retrieved", p.message, p.block, saved)
            return
        if p.span is None:
            if p.block in self.drop_blocks[p.message]:
                return
            self.drop_blocks[p.message].add(p.block)
            tokens = p.tokens
        else:
            if p.span in self.spans[key]:
                return
            self.spans[key].add(p.span)
            tokens = p.tokens - 1  # one token of slack: joining the text around a cut can cost one
        self._take("retrieved", p.message, p.block, tokens)

    def history(self, allow_prefix: bool) -> None:
        """The oldest units of the history dropped whole, by the same rule as the clear stage:
        the task, the system messages, what the model answers now and the reply a kept user
        message answers stay."""
        self._cut("history", allow_prefix, drop=True, clear=False)
        comp = self._latest_compaction()
        if self.rules.drops_before_compaction and comp > 0 and not self.fits():
            # the items before the latest compaction item, as OpenAI's guide allows: the
            # compaction carries what they said (Anthropic's block sits in an assistant message,
            # which may not open the conversation: there only whole turns go)
            for i in range(comp):
                if i not in self.drop_messages and not self._system(i) and not self.fits():
                    self.drop_messages.add(i)
                    self._take("history", i, -1, self._left(i))

    def _latest_compaction(self) -> int:
        """The message holding the latest server-side compaction (a Responses ``compaction``
        item, an Anthropic ``compaction`` block); -1: none."""
        for i in range(len(self.messages) - 1, -1, -1):
            m = self.messages[i]
            if not isinstance(m, dict):
                continue
            if m.get("type") == "compaction":
                return i
            content = m.get("content")
            if isinstance(content, list) and any(
                isinstance(b, dict) and b.get("type") == "compaction" for b in content
            ):
                return i
        return -1

    def _role(self, i: int) -> Any:
        m = self.messages[i] if 0 <= i < len(self.messages) else None
        role = m.get("role") if isinstance(m, dict) else None
        return "assistant" if role == "model" else role

    # -- run and materialize -----------------------------------------------------------------

    def run(self) -> None:
        if self.fits():
            return
        passes = (
            [False, True]
            if (self.policy.protect_cache_prefix and self.boundary is not None)
            else [True]
        )
        for allow_prefix in passes:
            for stage in self.policy.stages:
                getattr(self, stage)(allow_prefix)
                if self.fits():
                    break
            if self.fits():
                break
        if not self.fits() and "tool_results" in self.policy.stages and self._newest():
            self.lift_keep = True  # nothing older is left: the newest results are shortened
            self.tool_results(True)
        if (
            self.boundary is not None
            and self.first_cut is not None
            and self.first_cut <= self.boundary
        ):
            lo, hi = self.first_cut, self.boundary
            self.report.cache_loss_tokens = sum(
                p.tokens
                for p in self.count.parts
                if p.message >= 0 and lo <= (p.message, p.block) <= hi
            )
        elif self.first_cut is not None:
            # every API caches the longest unchanged prefix: what the previous turn already sent
            # (before the tail) and this one kept after its first edit is billed uncached again
            tail = self._tail()
            self.report.cache_loss_tokens = sum(
                self._left(i)
                for i in range(max(0, self.first_cut[0]), max(0, tail))
                if i not in self.drop_messages
            )
        self.report.actions = self._summary()

    def _summary(self) -> list[str]:
        out = []
        if self.report.cleared_tool_uses:
            out.append(f"cleared {self.report.cleared_tool_uses} older tool result(s)")
        if self.clear_inputs:
            out.append(f"cleared the inputs of {len(self.clear_inputs)} tool call(s)")
        if self.report.dropped_tool_rounds:
            out.append(f"dropped {self.report.dropped_tool_rounds} older tool round(s)")
        n_tools = len(self.replace) - self.report.cleared_tool_uses - self.stubs
        if n_tools:
            out.append(
                f"capped {n_tools} tool result(s) at {self.policy.tool_result_max_tokens} tokens"
            )
        n_chunks = (
            sum(len(v) for v in self.spans.values())
            + sum(len(v) for v in self.drop_blocks.values())
            + self.stubs
        )
        if n_chunks:
            out.append(f"dropped {n_chunks} retrieved chunk(s)")
        in_turns = len(self.drop_messages) - self.dropped_in_rounds
        if in_turns:
            out.append(f"dropped {in_turns} message(s) of older turns")
        return out

    def changed(self) -> bool:
        return bool(
            self.replace
            or self.drop_messages
            or self.spans
            or self.clear_inputs
            or any(self.drop_blocks.values())
        )

    def materialize(self) -> dict[str, Any]:
        touched = (
            {i for i, _ in self.replace}
            | set(self.drop_blocks)
            | {i for i, _ in self.spans}
            | {i for i, _ in self.clear_inputs}
        )
        if not touched and not self.drop_messages:
            return dict(self.body)
        messages: list[Any] = []
        for i, m in enumerate(self.messages):
            if i in self.drop_messages:
                continue
            if i not in touched:
                messages.append(m)
                continue
            m2 = dict(m)
            calls = {k for x, k in self.clear_inputs if x == i}
            if calls:
                m2 = self.rules.without_inputs(m2, calls)
            content = m2.get(self.key)
            if (i, -1) in self.replace:
                m2["output" if "output" in m else "content"] = self.replace[(i, -1)]
            elif isinstance(content, str):
                m2["content"] = _cut(content, self.spans[(i, -1)])
                if not m2["content"].strip():
                    m2["content"] = PLACEHOLDER
            elif isinstance(content, list):
                blocks: list[Any] = []
                for j, b in enumerate(content):
                    if j in self.drop_blocks.get(i, ()):
                        continue
                    if (i, j) in self.replace:
                        b = self.replace[(i, j)]
                    elif (i, j) in self.spans:
                        b = {**b, "text": _cut(str(b.get("text", "")), self.spans[(i, j)])}
                        if not b["text"].strip():
                            continue
                    blocks.append(b)
                m2[self.key] = blocks or [self.rules.empty_block()]
            messages.append(m2)
        out = dict(self.body)
        self.rules.with_items(out, messages, self.body)
        return out


def fit_with(
    body: Mapping[str, Any],
    recount: Callable[..., RequestCount],
    rules: TrimRules,
    *,
    budget: int,
    counter: TextCounter,
    count: RequestCount,
    policy: Policy | None = None,
    chat_format: ChatFormat | None = None,
    pattern: re.Pattern[str] | None = None,
) -> tuple[dict[str, Any], FitReport]:
    """Fit ``body`` (counted: ``count``) into ``budget`` input tokens by a format's ``rules``,
    recounting each round's output with the format's counter (``recount``). The format-neutral
    engine behind ``context_ceiling.fit``, which picks the format's counter and rules."""
    fn = recount
    before = count.total
    report: FitReport | None = None  # the first round's, the later rounds added to it
    current: Mapping[str, Any] = body
    for _ in range(MAX_ROUNDS):
        if count.total <= budget:
            break
        trimmer = _Trimmer(current, rules, count, counter, policy or Policy(), budget)
        trimmer.run()
        out = trimmer.materialize()
        if not trimmer.changed():
            break
        if report is None:
            report = trimmer.report
        else:
            for k, v in trimmer.report.removed.items():
                report.removed[k] += v
            report.cache_loss_tokens += trimmer.report.cache_loss_tokens
            report.actions += [a for a in trimmer.report.actions if a not in report.actions]
            report.cleared_tool_uses += trimmer.report.cleared_tool_uses
            report.dropped_tool_rounds += trimmer.report.dropped_tool_rounds
            report.clearing_event |= trimmer.report.clearing_event
        # the honest figure: the output counted again with the same counter, markers and
        # placeholders included (the per-part estimate can be off by a few tokens a cut); the
        # messages it shares with the body counted before are taken over, not walked again
        prior = prior_of(trimmer.messages, count)
        current, count = out, fn(out, counter, chat_format, pattern, prior)
    if report is None:
        report = FitReport(budget=budget, before=before, after=before)
    report.before, report.after = before, count.total
    net, est = report.before - report.after, sum(report.removed.values())
    if est and net != est:  # the estimates per stage, made to add up to the recounted total
        top = max(report.removed, key=lambda k: report.removed[k])
        report.removed[top] = max(0, report.removed[top] + net - est)
    return dict(current), report
