"""What a count is, and the one walk every wire format counts with.

A request is counted in one pass, broken down by component: every message (or item, or content)
and content block becomes a :class:`Part` with its own token count, so the total, the component
breakdown and (later) trimming all come from the same single tokenization. What a message of a
format holds, and how it is framed, is the format's own (``context_ceiling.formats``): each one
gives :func:`walk_items` a classifier and a per-message walk, and gets the count cache, the
resent-history shortcut and the recount of a trimmed body from here.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from context_ceiling.core.models import ChatFormat
from context_ceiling.core.shape_checks import RequestShapeError, check_item_depth
from context_ceiling.core.tokenizers import CountCache, TextCounter
from context_ceiling.core.utilization import COMPONENTS, Component

#: Default delimiter of retrieved chunks inlined as text: ``<document ...>...</document>``.
#: Unrolled (``[^<]*`` runs between ``<`` checks) rather than ``(?s)<document\b[^>]*>.*?</document>``:
#: it matches the same spans, and Python's ``re`` runs it many times faster on long prompts,
#: because a lazy ``.*?`` retries the closing tag at every character.
DEFAULT_CHUNK_PATTERN = r"<document\b[^>]*>[^<]*(?:<(?!/document>)[^<]*)*</document>"


@dataclass(slots=True)
class Part:
    """The tokens of one message or content block, and where they came from.

    ``message`` is the index in ``messages`` (-1 for top-level fields such as Anthropic
    ``system`` or ``tools``); ``block`` the index in the message's content list (-1 for the
    message as a whole, including its framing)."""

    message: int
    block: int
    component: Component
    tokens: int
    #: for a retrieved chunk found by pattern inside a text: its (start, end) in that text
    span: tuple[int, int] | None = None
    #: the message's framing tokens (role, separators), not its content
    frame: bool = False


@dataclass(slots=True)
class RequestCount:
    """Input tokens of one request. ``exact`` is True only when the serving engine counted."""

    total: int
    components: dict[Component, int]
    parts: list[Part] = field(default_factory=list)
    counter: str = ""
    exact: bool = False
    #: the provider holds part of the context (Responses ``previous_response_id`` /
    #: ``conversation``): this count is what the sidecar saw, not the whole input
    partial: bool = False
    _groups: dict[int, list[Part]] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    def by_message(self) -> dict[int, list[Part]]:
        """The parts by message index (-1: the top-level fields), in order. Grouped once: the
        trimmer reads it and the recount of its output takes it over (:func:`prior_of`). The
        lists are shared: read them, never change them."""
        if self._groups is None:
            groups: dict[int, list[Part]] = {}
            for p in self.parts:
                got = groups.get(p.message)
                if got is None:
                    groups[p.message] = [p]
                else:
                    got.append(p)
            self._groups = groups
        return self._groups

    def scaled_to(self, total: int, *, exact: bool, counter: str | None = None) -> RequestCount:
        """Re-express the breakdown against an authoritative total (largest remainder)."""
        if self.total <= 0:
            comps = dict.fromkeys(COMPONENTS, 0)
            comps[Component.LATEST_USER] = total
            return RequestCount(total, comps, self.parts, counter or self.counter, exact)
        raw = {c: self.components[c] * total / self.total for c in COMPONENTS}
        comps = {c: int(v) for c, v in raw.items()}
        short = total - sum(comps.values())
        for c in sorted(COMPONENTS, key=lambda c: raw[c] - comps[c], reverse=True)[:short]:
            comps[c] += 1
        return RequestCount(total, comps, self.parts, counter or self.counter, exact)


#: The counted parts of a body's messages, by message object (``id``, with the object itself to
#: prove it is the same one): see :func:`prior_of`.
Prior = dict[int, tuple[Any, list[Part]]]

#: components a part takes from its own kind (a chunk, a tool result), whatever its message's
_OWN_KIND = (Component.RETRIEVED, Component.TOOL_RESULTS)


def prior_of(messages: list[Any], count: RequestCount) -> Prior:
    """What a body derived from this one (a fitted body: untouched messages shared, not copied)
    need not count again: each message object of ``messages`` with the parts ``count`` gave it.

    Why: the trimmer's honest recount of its output used to walk every kept message again; the
    per-request memo made their long texts lookups, but the walk, the short texts and the shape
    check remained, a fifth of an enforced request at 1k tokens. Only the rewritten messages
    (new objects) are counted now."""
    by = count.by_message()
    none: list[Part] = []
    return {id(m): (m, by.get(i, none)) for i, m in enumerate(messages)}


class Tally:
    __slots__ = ("comps", "counter", "parts", "prior")

    def __init__(self, counter: TextCounter, prior: Prior | None = None) -> None:
        self.counter = counter
        self.parts: list[Part] = []
        self.comps = dict.fromkeys(COMPONENTS, 0)
        self.prior = prior

    def reuse(self, message: int, msg: Any, component: Component) -> bool:
        """Take over the prior parts of ``msg`` (renumbered to ``message``) when it is the same
        object, counted with the same component (a turn that was the latest user turn and no
        longer is differs); False: count it. Called only with a prior (the walkers test for it
        first, so a first count pays no call per message)."""
        assert self.prior is not None
        got = self.prior.get(id(msg))
        if got is None or got[0] is not msg:
            return False
        parts = got[1]
        if any(p.component is not component and p.component not in _OWN_KIND for p in parts):
            return False
        self.take(message, parts)
        return True

    def take(self, message: int, parts: list[Part]) -> None:
        """Add the parts counted before for one message, renumbered to ``message`` (shared as
        they are when the message kept its place)."""
        comps = self.comps
        if not parts or parts[0].message == message:  # same place: the parts themselves
            self.parts.extend(parts)
            for p in parts:
                comps[p.component] += p.tokens
            return
        for p in parts:
            self.parts.append(Part(message, p.block, p.component, p.tokens, p.span, p.frame))
            comps[p.component] += p.tokens

    def add(
        self,
        message: int,
        block: int,
        component: Component,
        tokens: int,
        span: tuple[int, int] | None = None,
        frame: bool = False,
    ) -> None:
        if tokens:
            self.parts.append(Part(message, block, component, tokens, span, frame))
            self.comps[component] += tokens

    def text(
        self,
        message: int,
        block: int,
        component: Component,
        text: str,
        chunks: re.Pattern[str] | None,
    ) -> None:
        """Count text; spans matching the chunk pattern count as retrieved."""
        count = self.counter.count
        if chunks is None or component in (Component.SYSTEM, Component.TOOL_RESULTS):
            self.add(message, block, component, count(text))
            return
        # The text between chunks is one part (only chunks are ever cut out one by one), so a
        # document-heavy prompt costs one Part per chunk, not two (this loop is the hot path).
        pos = rest = 0
        parts, comps, retrieved = self.parts, self.comps, Component.RETRIEVED
        for m in chunks.finditer(text):
            start, end = m.span()
            if start > pos:
                rest += count(text[pos:start])
            n = count(text[start:end])
            if n:
                parts.append(Part(message, block, retrieved, n, (start, end)))
                comps[retrieved] += n
            pos = end
        self.add(message, block, component, rest + count(text[pos:] if pos else text))

    def result(self, exact: bool = False) -> RequestCount:
        return RequestCount(
            sum(self.comps.values()), self.comps, self.parts, self.counter.name, exact
        )


#: bytes a remembered message is charged beside its own (the key tuple, the list, each Part)
_ENTRY_BYTES, _PART_BYTES = 200, 100


#: the per-message walk of one format: (tally, index, message, component, flag, framing,
#: chunk pattern); ``flag`` is the one fact beside the component that changes a message's count
#: (an earlier turn's thinking or reasoning counts nothing)
Walk = Callable[["Tally", int, Any, Component, bool, ChatFormat, "re.Pattern[str] | None"], None]
Check = Callable[[int, Any], None]


def count_context(
    name: str, counter: TextCounter, fmt: ChatFormat, chunks: re.Pattern[str] | None
) -> Hashable:
    """What besides its bytes a message's count depends on."""
    return (name, counter.name, fmt.per_message, fmt.per_name, chunks.pattern if chunks else None)


def _message(
    tally: Tally,
    memo: CountCache | None,
    ctx: Hashable,
    i: int,
    msg: Any,
    comp: Component,
    flag: bool,
    fmt: ChatFormat,
    chunks: re.Pattern[str] | None,
    check: Check | None,
    walk: Walk,
) -> None:
    """Count one message: from the count cache when its bytes were counted before in the same
    context (its shape was checked then), else checked (``check``, None for a body derived from
    a checked one), walked and remembered. Why: an agent resends its whole history every turn;
    a lookup per message keeps the cost of a turn with its new content."""
    key: tuple[Hashable, bytes] | None = None
    if memo is not None:
        try:
            key = ((ctx, comp, flag), orjson.dumps(msg))
        except orjson.JSONEncodeError:  # nested past what JSON writers accept: the check says so
            key = None
        else:
            hit = memo.recall(key)
            if hit is not None:
                tally.take(i, hit)
                return
    if check is not None:
        check_item_depth(msg)
        check(i, msg)
    mark = len(tally.parts)
    walk(tally, i, msg, comp, flag, fmt, chunks)
    if memo is not None and key is not None:
        parts = tally.parts[mark:]
        memo.keep(key, parts, len(key[1]) + _ENTRY_BYTES + _PART_BYTES * len(parts))


#: bytes of a history's JSON that key its lookup, and how many histories one key keeps (agents
#: sharing a long system prompt share the head; the longest matching one is taken)
_HEAD, _HISTORIES_PER_HEAD = 1024, 8


@dataclass(slots=True)
class _History:
    """A conversation's messages as counted: their JSON (without its closing bracket), their
    parts in order, where each message's parts start, and what their components depended on."""

    blob: bytes
    parts: list[Part]
    bounds: list[int]
    last_user: int
    turn_start: int
    system_at: int


#: requests with fewer messages are not conversations worth remembering: a single-turn request
#: (system and question) is mostly new content, and keeping it would only push out what repeats
_CONVERSATION = 4


def _conversation(
    memo: CountCache | None, prior: Prior | None, messages: list[Any]
) -> CountCache | None:
    """The cache to remember this request's messages in: only for a first count (a trimmer's
    recount shares its messages by object already) of a conversation long enough to be resent.
    Its newest message is not remembered alone: the next turn takes it with the history."""
    if memo is None or prior is not None or len(messages) < _CONVERSATION:
        return None
    return memo


class _Resume:
    """Takes over the counted prefix of a resent history whole: one serialisation of the
    messages and one byte comparison with the conversation's previous request, instead of a
    lookup per message. An agent appends to its history every turn, so all of it but the new
    messages (and the one whose component changed: the previous latest user turn, the turn
    where earlier thinking starts) is the previous request's count again."""

    __slots__ = (
        "blob",
        "bounds",
        "index",
        "key",
        "last_user",
        "memo",
        "start",
        "states",
        "system_at",
        "tally",
        "turn_start",
    )

    def __init__(
        self,
        tally: Tally,
        memo: CountCache,
        ctx: Hashable,
        messages: list[Any],
        last_user: int,
        turn_start: int = -1,
    ) -> None:
        self.tally, self.memo = tally, memo
        self.start, self.index, self.system_at = len(tally.parts), 0, -1
        self.last_user, self.turn_start = last_user, turn_start
        self.bounds: list[int] = []
        self.states: list[_History] = []
        self.key: Hashable | None = None
        try:
            blob = orjson.dumps(messages)
        except orjson.JSONEncodeError:  # nested too deep to write: the per-message checks say so
            return
        self.blob = blob[:-1]
        self.key = ("history", ctx, blob[:_HEAD])
        self.states = memo.recall(self.key) or []
        for h in self.states:
            n = len(h.blob)
            # the same bytes up to a message boundary: the same messages (JSON reads left to
            # right, so the previous request's last object closes at the same byte here)
            if not (self.blob.startswith(h.blob) and (len(self.blob) == n or self.blob[n] == 44)):
                continue
            j = len(h.bounds) - 1
            if last_user != h.last_user and h.last_user >= 0:
                j = min(j, h.last_user)
            if turn_start != h.turn_start and h.turn_start >= 0:
                j = min(j, h.turn_start)
            taken = h.parts[: h.bounds[j]]
            tally.parts.extend(taken)
            comps = tally.comps
            for p in taken:
                comps[p.component] += p.tokens
            self.bounds, self.index = h.bounds[:j], j
            self.system_at = h.system_at if h.system_at < j else -1
            return

    def at(self, i: int, system: bool = False) -> None:
        """Message ``i`` starts here (``system``: it is a system message)."""
        self.bounds.append(len(self.tally.parts) - self.start)
        if system and self.system_at < 0:
            self.system_at = i

    def finish(self) -> None:
        """Remember this request's history for the conversation's next turn."""
        if self.key is None:
            return
        parts = self.tally.parts[self.start :]
        h = _History(
            self.blob,
            parts,
            [*self.bounds, len(parts)],
            self.last_user,
            self.turn_start,
            self.system_at,
        )
        # the history this one extends is replaced by it; other conversations stay
        kept = [s for s in self.states if not h.blob.startswith(s.blob)]
        states = [h, *kept[: _HISTORIES_PER_HEAD - 1]]
        size = sum(len(s.blob) + _PART_BYTES * len(s.parts) + 8 * len(s.bounds) for s in states)
        self.memo.keep(self.key, states, size + _ENTRY_BYTES)


#: one format's reading of one message: (its component, the flag beside it, whether it is a
#: system message); raises the shape error a malformed one deserves
Classify = Callable[[int, Any], tuple[Component, bool, bool]]


def walk_items(
    tally: Tally,
    memo: CountCache | None,
    prior: Prior | None,
    ctx: Hashable,
    items: list[Any],
    marks: tuple[int, int],
    fmt: ChatFormat,
    chunks: re.Pattern[str] | None,
    check: Check | None,
    classify: Classify,
    walk: Walk,
) -> bool:
    """Count a request's messages (or items, or contents) in order, the same way for every
    format: the history counted before taken whole (``_Resume``), each other message from the
    message cache or checked and walked. ``marks``: the latest user turn and the turn start,
    what the components depend on. Returns whether a system message was among them."""
    memo = _conversation(memo, prior, items)
    resume = _Resume(tally, memo, ctx, items, *marks) if memo is not None else None
    newest = len(items) - 1
    system = resume is not None and resume.system_at >= 0
    for i in range(resume.index if resume else 0, len(items)):
        msg = items[i]
        comp, flag, is_system = classify(i, msg)
        system |= is_system
        if resume is not None:
            resume.at(i, is_system)
        if prior is not None and tally.reuse(i, msg, comp):
            continue
        cache = memo if i < newest else None
        _message(tally, cache, ctx, i, msg, comp, flag, fmt, chunks, check, walk)
    if resume is not None:
        resume.finish()
    return system


def json_text(value: Any) -> str:
    return orjson.dumps(value).decode()


#: the tokens of a tool call's or a tool result's framing, besides its name, arguments or text:
#: every API's counter frames them alike, so one conversation counts the same in each
TOOL_FRAME = 3


def call_tokens(name: str, arguments: str, count: Callable[[str], int]) -> int:
    """A tool call as every API's counter counts it: its framing, its name and its arguments'
    text (their JSON where the API carries an object); its id only pairs it with its result."""
    return TOOL_FRAME + count(name) + count(arguments)


def require_messages(body: Mapping[str, Any]) -> list[Any]:
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise RequestShapeError("'messages' is required and must be an array")
    return messages


def last_index(messages: list[Any], role: str) -> int:
    for i in range(len(messages) - 1, -1, -1):
        m = messages[i]
        if isinstance(m, dict) and m.get("role") == role:
            return i
    return -1
