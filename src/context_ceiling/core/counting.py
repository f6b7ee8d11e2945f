"""Count a chat request's input tokens in one pass, broken down by component.

Both wire formats (OpenAI chat completions, Anthropic messages) are walked once; every message
and content block becomes a :class:`Part` with its own token count, so the total, the component
breakdown and (later) trimming all come from the same single tokenization. Framing tokens follow
the model's :class:`~context_ceiling.core.models.ChatFormat`; images follow the provider's published rule.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from context_ceiling.core.images import (
    anthropic_image_tokens,
    openai_image_tokens,
    size_from_base64,
    size_from_data_url,
)
from context_ceiling.core.models import ChatFormat
from context_ceiling.core.shape import (
    RequestShapeError,
    check_anthropic_message,
    check_anthropic_top,
    check_gemini_content,
    check_gemini_top,
    check_item_depth,
    check_openai_chat_top,
    check_openai_message,
    check_responses_item,
    check_responses_top,
)
from context_ceiling.core.tokenizers import CountCache, TextCounter
from context_ceiling.core.utilization import COMPONENTS, Component

#: Default delimiter of retrieved chunks inlined as text: ``<document ...>...</document>``.
#: Unrolled (``[^<]*`` runs between ``<`` checks) rather than ``(?s)<document\b[^>]*>.*?</document>``:
#: it matches the same spans, and Python's ``re`` runs it many times faster on long prompts,
#: because a lazy ``.*?`` retries the closing tag at every character.
DEFAULT_CHUNK_PATTERN = r"<document\b[^>]*>[^<]*(?:<(?!/document>)[^<]*)*</document>"

#: Anthropic's published tool-use system prompt size (auto/none tool_choice).
ANTHROPIC_TOOL_SYSTEM_TOKENS = 346


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


class _Tally:
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
_Walk = Callable[["_Tally", int, Any, Component, bool, ChatFormat, "re.Pattern[str] | None"], None]
_Check = Callable[[int, Any], None]


def _context(
    name: str, counter: TextCounter, fmt: ChatFormat, chunks: re.Pattern[str] | None
) -> Hashable:
    """What besides its bytes a message's count depends on."""
    return (name, counter.name, fmt.per_message, fmt.per_name, chunks.pattern if chunks else None)


def _message(
    tally: _Tally,
    memo: CountCache | None,
    ctx: Hashable,
    i: int,
    msg: Any,
    comp: Component,
    flag: bool,
    fmt: ChatFormat,
    chunks: re.Pattern[str] | None,
    check: _Check | None,
    walk: _Walk,
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
        tally: _Tally,
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
_Classify = Callable[[int, Any], tuple[Component, bool, bool]]


def _walk(
    tally: _Tally,
    memo: CountCache | None,
    prior: Prior | None,
    ctx: Hashable,
    items: list[Any],
    marks: tuple[int, int],
    fmt: ChatFormat,
    chunks: re.Pattern[str] | None,
    check: _Check | None,
    classify: _Classify,
    walk: _Walk,
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


def _json(value: Any) -> str:
    return orjson.dumps(value).decode()


def _require_messages(body: Mapping[str, Any]) -> list[Any]:
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise RequestShapeError("'messages' is required and must be an array")
    return messages


def _last_index(messages: list[Any], role: str) -> int:
    for i in range(len(messages) - 1, -1, -1):
        m = messages[i]
        if isinstance(m, dict) and m.get("role") == role:
            return i
    return -1


# --------------------------------------------------------------------------------------------
# OpenAI chat completions


def _openai_tools(tally: _Tally, tools: Iterable[Any]) -> None:
    for i, tool in enumerate(tools):
        fn = tool.get("function", tool) if isinstance(tool, dict) else tool
        tally.add(-1, i, Component.TOOL_DEFINITIONS, tally.counter.count(_json(fn)) + 8)


def count_openai(
    body: Mapping[str, Any],
    counter: TextCounter,
    fmt: ChatFormat | None = None,
    chunks: re.Pattern[str] | None = None,
    prior: Prior | None = None,
    memo: CountCache | None = None,
) -> RequestCount:
    """Input tokens of an OpenAI ``/v1/chat/completions`` body (its shape checked first:
    ``RequestShapeError`` names the field). ``memo``: the count cache, which remembers
    messages by their bytes."""
    check = check_openai_message if prior is None else None
    if check is not None:  # a body derived from a checked one has its shape
        check_openai_chat_top(body)
    fmt = fmt or ChatFormat()
    messages = _require_messages(body)
    tally = _Tally(counter, prior)
    tools = body.get("tools") or body.get("functions") or []
    if not isinstance(tools, list):
        raise RequestShapeError("'tools' must be an array")
    _openai_tools(tally, tools)
    last_user = _last_index(messages, "user")
    ctx = _context("openai", counter, fmt, chunks)

    def classify(i: int, msg: Any) -> tuple[Component, bool, bool]:
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
            if check is not None:
                check(i, msg)  # its own words for what is wrong
            raise RequestShapeError(f"messages[{i}] must be an object with a role")
        role = msg["role"]
        if role in ("system", "developer"):
            return Component.SYSTEM, False, True
        if role in ("tool", "function"):
            return Component.TOOL_RESULTS, False, False
        latest = role == "user" and i == last_user
        return (Component.LATEST_USER if latest else Component.HISTORY), False, False

    marks = (last_user, -1)
    has_system = _walk(
        tally, memo, prior, ctx, messages, marks, fmt, chunks, check, classify, _openai_message
    )
    if not has_system and fmt.default_system:
        tally.add(-1, -1, Component.SYSTEM, fmt.default_system)
    tally.add(-1, -1, Component.LATEST_USER, fmt.reply_priming)
    return tally.result()


def _openai_message(
    tally: _Tally,
    i: int,
    msg: Any,
    comp: Component,
    _flag: bool,
    fmt: ChatFormat,
    chunks: re.Pattern[str] | None,
) -> None:
    count = tally.counter.count
    role = msg["role"]
    frame = fmt.per_message + count(role)
    name = msg.get("name")
    if isinstance(name, str):
        frame += fmt.per_name + count(name)
    tally.add(i, -1, comp, frame, frame=True)
    content = msg.get("content")
    if isinstance(content, str):
        tally.text(i, -1, comp, content, chunks)
    elif isinstance(content, list):
        for j, part in enumerate(content):
            if not isinstance(part, dict):
                raise RequestShapeError(f"messages[{i}].content[{j}] must be an object")
            kind = part.get("type")
            if kind in ("text", "input_text", "refusal"):
                tally.text(i, j, comp, str(part.get("text") or part.get("refusal") or ""), chunks)
            elif kind == "image_url":
                img = part.get("image_url") or {}
                url = (img.get("url") or "") if isinstance(img, dict) else str(img)
                detail = (img.get("detail") or "auto") if isinstance(img, dict) else "auto"
                tally.add(i, j, comp, openai_image_tokens(size_from_data_url(url), detail))
            elif kind == "file":  # an attached document: retrieved material
                tally.add(i, j, Component.RETRIEVED, count(_json(part.get("file", {}))))
    elif content is not None:
        raise RequestShapeError(f"messages[{i}].content must be a string, an array or null")
    for k, call in enumerate(msg.get("tool_calls") or []):
        fn = (call.get("function") or {}) if isinstance(call, dict) else {}
        tally.add(
            i,
            1000 + k,
            comp,
            3 + count(str(fn.get("name", ""))) + count(str(fn.get("arguments", ""))),
        )
    if isinstance(msg.get("function_call"), dict):
        fc = msg["function_call"]
        tally.add(
            i, 999, comp, 3 + count(str(fc.get("name", ""))) + count(str(fc.get("arguments", "")))
        )


# --------------------------------------------------------------------------------------------
# Anthropic messages


def _anthropic_block(
    tally: _Tally,
    i: int,
    j: int,
    comp: Component,
    block: Any,
    chunks: re.Pattern[str] | None,
    stripped: bool = False,
) -> None:
    if isinstance(block, str):
        tally.text(i, j, comp, block, chunks)
        return
    if not isinstance(block, dict):
        raise RequestShapeError(f"messages[{i}].content[{j}] must be an object")
    count = tally.counter.count
    kind = block.get("type")
    if kind == "text":
        tally.text(i, j, comp, str(block.get("text", "")), chunks)
    elif kind == "image":
        src = block.get("source") or {}
        size = size_from_base64(src.get("data") or "") if src.get("type") == "base64" else None
        tally.add(i, j, comp, anthropic_image_tokens(size))
    elif kind in ("document", "search_result"):
        tally.add(i, j, Component.RETRIEVED, count(_document_text(block)) + pdf_tokens(block))
    elif kind == "tool_result":
        content = block.get("content")
        inner = content if isinstance(content, list) else [content or ""]
        for sub in inner:
            sub_kind = sub.get("type") if isinstance(sub, dict) else None
            if sub_kind == "image":
                _anthropic_block(tally, i, j, Component.TOOL_RESULTS, sub, None)
            elif sub_kind in ("document", "search_result") and isinstance(sub, dict):
                # Anthropic's "search results from tool calls": the text the model reads
                tally.add(
                    i, j, Component.TOOL_RESULTS, count(_document_text(sub)) + pdf_tokens(sub)
                )
            elif isinstance(sub, str) or sub_kind in (None, "text"):
                text = sub if isinstance(sub, str) else str((sub or {}).get("text", ""))
                tally.add(i, j, Component.TOOL_RESULTS, count(text))
            else:  # a block type this counter does not know: its JSON is the best estimate
                tally.add(i, j, Component.TOOL_RESULTS, count(_json(sub)))
        tally.add(i, j, Component.TOOL_RESULTS, 3)
    elif kind == "tool_use":
        tally.add(
            i, j, comp, 3 + count(str(block.get("name", ""))) + count(_json(block.get("input", {})))
        )
    elif kind in ("thinking", "redacted_thinking") and stripped:
        # an earlier turn's thinking: the API removes it from the context window
        # (context_window = input - previous thinking + this turn), so it counts nothing
        tally.add(i, j, comp, 0)
    elif kind == "thinking":
        tally.add(i, j, comp, count(str(block.get("thinking", ""))))
    elif kind == "compaction":  # server-side compaction's summary, replayed by the client
        tally.add(i, j, comp, 3 + count(str(block.get("content") or "")))
    else:  # server tool blocks, redacted thinking, ...: their JSON is the best estimate
        tally.add(i, j, comp, count(_json(block)))


#: Anthropic's published estimate for a PDF page: its text (1,500-3,000 tokens a page) and the
#: page's image; the upper end, so an estimate errs toward fitting less
PDF_PAGE_TOKENS = 3000
_PDF_PAGE = re.compile(rb"/Type\s*/Page(?![a-zA-Z])")


def pdf_tokens(block: Mapping[str, Any]) -> int:
    """Tokens of a base64 PDF ``document`` block by the published per-page estimate (its pages
    found in the decoded bytes; at least one page), 0 for any other block. An estimate: the
    provider renders each page as text and image."""
    src = block.get("source")
    if not isinstance(src, dict) or src.get("type") != "base64":
        return 0
    if src.get("media_type") not in (None, "application/pdf"):
        return 0
    try:
        data = base64.b64decode(str(src.get("data") or ""), validate=False)
    except (binascii.Error, ValueError):
        return PDF_PAGE_TOKENS
    pages = len(_PDF_PAGE.findall(data))
    if not pages:  # compressed object streams hide the page objects: size decides
        pages = max(1, len(data) // 100_000)
    return pages * PDF_PAGE_TOKENS


def _document_text(block: Mapping[str, Any]) -> str:
    """The text of a document or search_result block (title, context, source text)."""
    pieces = [
        str(block.get(k, ""))
        for k in ("title", "context", "source")
        if isinstance(block.get(k), str)
    ]
    src = block.get("source")
    if isinstance(src, dict):
        if src.get("type") == "text":
            pieces.append(str(src.get("data", "")))
        elif src.get("type") == "content":
            pieces.extend(
                str(b.get("text", "")) for b in src.get("content") or [] if isinstance(b, dict)
            )
    content = block.get("content")
    if isinstance(content, list):
        pieces.extend(str(b.get("text", "")) for b in content if isinstance(b, dict))
    return "\n".join(p for p in pieces if p)


def _anthropic_turn_start(messages: list[Any]) -> int:
    """The latest user message that starts a turn (one that answers no tool call): thinking
    before it belongs to earlier turns. The API requires a message's ``tool_result`` blocks to
    come first in its content, so the first block tells (one look per message: an agent loop
    scans back through every round)."""
    for i in range(len(messages) - 1, -1, -1):
        m = messages[i]
        if not isinstance(m, dict) or m.get("role") != "user":
            continue
        content = m.get("content")
        if not (
            isinstance(content, list)
            and content
            and isinstance(content[0], dict)
            and content[0].get("type") == "tool_result"
        ):
            return i
    return -1


def count_anthropic(
    body: Mapping[str, Any],
    counter: TextCounter,
    fmt: ChatFormat | None = None,
    chunks: re.Pattern[str] | None = None,
    prior: Prior | None = None,
    memo: CountCache | None = None,
) -> RequestCount:
    """Input tokens of an Anthropic ``/v1/messages`` (or ``count_tokens``) body (its shape
    checked first: ``RequestShapeError`` names the field). ``memo``: the count cache, which
    remembers messages by their bytes."""
    check = check_anthropic_message if prior is None else None
    if check is not None:  # a body derived from a checked one has its shape
        check_anthropic_top(body)
    fmt = fmt or ChatFormat()
    messages = _require_messages(body)
    tally = _Tally(counter, prior)
    count = counter.count
    system = body.get("system")
    if isinstance(system, str):
        tally.add(-1, -1, Component.SYSTEM, count(system))
    elif isinstance(system, list):
        for j, b in enumerate(system):
            tally.add(
                -1,
                j,
                Component.SYSTEM,
                count(str(b.get("text", "")) if isinstance(b, dict) else ""),
            )
    elif system is not None:
        raise RequestShapeError("'system' must be a string or an array of text blocks")
    tools = body.get("tools") or []
    if not isinstance(tools, list):
        raise RequestShapeError("'tools' must be an array")
    for j, tool in enumerate(tools):
        tally.add(-2, j, Component.TOOL_DEFINITIONS, count(_json(tool)))
    if tools:
        tally.add(-2, -1, Component.TOOL_DEFINITIONS, ANTHROPIC_TOOL_SYSTEM_TOKENS)
    last_user = _last_index(messages, "user")
    turn_start = _anthropic_turn_start(messages)
    ctx = _context("anthropic", counter, fmt, chunks)

    def classify(i: int, msg: Any) -> tuple[Component, bool, bool]:
        if not isinstance(msg, dict):
            raise RequestShapeError(f"messages[{i}] must be an object")
        role = msg.get("role")
        if role not in ("user", "assistant"):
            raise RequestShapeError(f"messages[{i}].role must be 'user' or 'assistant'")
        comp = Component.LATEST_USER if i == last_user else Component.HISTORY
        return comp, role == "assistant" and i < turn_start, False

    marks = (last_user, turn_start)
    _walk(
        tally, memo, prior, ctx, messages, marks, fmt, chunks, check, classify, _anthropic_message
    )
    tally.add(-1, -1, Component.LATEST_USER, fmt.reply_priming)
    return tally.result()


def _anthropic_message(
    tally: _Tally,
    i: int,
    msg: Any,
    comp: Component,
    stripped: bool,
    fmt: ChatFormat,
    chunks: re.Pattern[str] | None,
) -> None:
    tally.add(i, -1, comp, fmt.per_message, frame=True)
    content = msg.get("content")
    if isinstance(content, str):
        tally.text(i, -1, comp, content, chunks)
    elif isinstance(content, list):
        for j, block in enumerate(content):
            _anthropic_block(tally, i, j, comp, block, chunks, stripped)
    else:
        raise RequestShapeError(f"messages[{i}].content must be a string or an array")


# --------------------------------------------------------------------------------------------
# OpenAI Responses API


def compaction_tokens(item: Mapping[str, Any]) -> int:
    """A Responses ``compaction`` item's tokens, an estimate: its ``encrypted_content`` is opaque
    (base64 of an encrypted summary), so its decoded bytes at four bytes a token; the provider's
    reported usage is what the estimate-error metric compares it with."""
    enc = item.get("encrypted_content")
    return 8 + (len(enc) * 3 // 4 // 4 if isinstance(enc, str) else 0)


def responses_items(body: Mapping[str, Any]) -> list[Any]:
    """``input`` as a list of items (a string input is one user message)."""
    items = body.get("input")
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    return list(items) if isinstance(items, list) else []


def count_responses(
    body: Mapping[str, Any],
    counter: TextCounter,
    fmt: ChatFormat | None = None,
    chunks: re.Pattern[str] | None = None,
    prior: Prior | None = None,
    memo: CountCache | None = None,
) -> RequestCount:
    """Input tokens of an OpenAI ``/v1/responses`` body: ``instructions``, ``tools`` and the
    ``input`` items (each item is a ``Part`` message index, as messages are for chat). With
    ``previous_response_id`` or a ``conversation`` the provider holds earlier turns the sidecar
    never sees: the count is ``partial`` and the upstream's reported usage is the figure.
    ``memo``: the count cache, which remembers items by their bytes."""
    check = check_responses_item if prior is None else None
    if check is not None:  # a body derived from a checked one has its shape
        check_responses_top(body)
    fmt = fmt or ChatFormat()
    tally = _Tally(counter, prior)
    count = counter.count
    instructions = body.get("instructions")
    if isinstance(instructions, str):
        tally.add(-1, -1, Component.SYSTEM, count(instructions))
    _openai_tools(tally, body.get("tools") or [])
    items = responses_items(body)
    last_user = max(
        (i for i, it in enumerate(items) if isinstance(it, dict) and it.get("role") == "user"),
        default=-1,
    )
    ctx = _context("responses", counter, fmt, chunks)

    def classify(i: int, it: Any) -> tuple[Component, bool, bool]:
        if not isinstance(it, dict):
            raise RequestShapeError(f"input[{i}] must be an object")
        kind = it.get("type") or "message"
        if kind != "message":  # a function call, its output, reasoning
            return Component.HISTORY, kind == "reasoning" and i < last_user, False
        role = it.get("role")
        if role in ("system", "developer"):
            return Component.SYSTEM, False, False
        return (Component.LATEST_USER if i == last_user else Component.HISTORY), False, False

    marks = (last_user, -1)
    _walk(tally, memo, prior, ctx, items, marks, fmt, chunks, check, classify, _responses_item)
    tally.add(-1, -1, Component.LATEST_USER, fmt.reply_priming)
    result = tally.result()
    result.partial = bool(body.get("previous_response_id") or body.get("conversation"))
    return result


def _responses_item(
    tally: _Tally,
    i: int,
    it: Any,
    comp: Component,
    earlier: bool,
    fmt: ChatFormat,
    chunks: re.Pattern[str] | None,
) -> None:
    count = tally.counter.count
    kind = it.get("type") or "message"
    if kind == "message":
        tally.add(i, -1, comp, fmt.per_message + count(str(it.get("role") or "")), frame=True)
        content = it.get("content")
        if isinstance(content, str):
            tally.text(i, -1, comp, content, chunks)
        elif isinstance(content, list):
            for j, part in enumerate(content):
                ptype = part.get("type")
                if ptype in ("input_text", "output_text", "text"):
                    tally.text(i, j, comp, str(part.get("text") or ""), chunks)
                elif ptype == "input_image":
                    url = part.get("image_url") or ""
                    size = size_from_data_url(url) if isinstance(url, str) else None
                    detail = part.get("detail") or "auto"
                    tally.add(i, j, comp, openai_image_tokens(size, detail))
                elif ptype == "input_file":
                    tally.add(i, j, Component.RETRIEVED, count(_json(part)))
                else:
                    tally.add(i, j, comp, count(_json(part)))
    elif kind == "function_call":
        tally.add(
            i,
            -1,
            Component.HISTORY,
            3 + count(str(it.get("name") or "")) + count(str(it.get("arguments") or "")),
        )
    elif kind == "function_call_output":
        out = it.get("output")
        text = out if isinstance(out, str) else _json(out)
        tally.add(i, -1, Component.TOOL_RESULTS, 3 + count(text))
    elif kind == "compaction":
        tally.add(i, -1, Component.HISTORY, compaction_tokens(it))
    elif kind == "reasoning" and earlier:
        # an earlier turn's reasoning: the API drops it from the context (only the
        # reasoning of the turn in progress, between its calls, is carried)
        tally.add(i, -1, Component.HISTORY, 0)
    else:  # reasoning, item references, tool calls of built-in tools: their JSON
        tally.add(i, -1, Component.HISTORY, count(_json(it)))


# --------------------------------------------------------------------------------------------
# Google Gemini (generateContent / streamGenerateContent / countTokens)

#: Gemini's published cost of an image part (up to 384x384; larger ones are tiled, 258 a tile)
GEMINI_IMAGE_TOKENS = 258


def count_gemini(
    body: Mapping[str, Any],
    counter: TextCounter,
    fmt: ChatFormat | None = None,
    chunks: re.Pattern[str] | None = None,
    prior: Prior | None = None,
    memo: CountCache | None = None,
) -> RequestCount:
    """Input tokens of a Gemini ``generateContent`` body (a ``countTokens`` body carries the same
    fields, or a ``generateContentRequest`` holding them). Gemini's tokenizer ships with no
    package: the model entry's calibrated estimate counts, and ``countTokens`` is the reference
    the estimate-error metric compares it with. ``memo``: the count cache, which remembers
    contents by their bytes."""
    if isinstance(body.get("generateContentRequest"), dict):
        body = body["generateContentRequest"]
    check = check_gemini_content if prior is None else None
    if check is not None:  # a body derived from a checked one has its shape
        check_gemini_top(body)
    fmt = fmt or ChatFormat()
    tally = _Tally(counter, prior)
    count = counter.count
    si = body.get("systemInstruction")
    if isinstance(si, dict):
        for j, part in enumerate(si.get("parts") or []):
            tally.add(-1, j, Component.SYSTEM, count(str(part.get("text") or "")))
    for k, tool in enumerate(body.get("tools") or []):
        tally.add(-2, k, Component.TOOL_DEFINITIONS, count(_json(tool)))
    contents = body["contents"]
    last_user = max(
        (
            i
            for i, c in enumerate(contents)
            if isinstance(c, dict) and c.get("role", "user") == "user"
        ),
        default=-1,
    )
    ctx = _context("gemini", counter, fmt, chunks)

    def classify(i: int, _content: Any) -> tuple[Component, bool, bool]:
        return (Component.LATEST_USER if i == last_user else Component.HISTORY), False, False

    marks = (last_user, -1)
    _walk(tally, memo, prior, ctx, contents, marks, fmt, chunks, check, classify, _gemini_content)
    tally.add(-1, -1, Component.LATEST_USER, fmt.reply_priming)
    return tally.result()


def _gemini_content(
    tally: _Tally,
    i: int,
    c: Any,
    comp: Component,
    _flag: bool,
    fmt: ChatFormat,
    chunks: re.Pattern[str] | None,
) -> None:
    count = tally.counter.count
    tally.add(i, -1, comp, fmt.per_message, frame=True)
    for j, part in enumerate(c.get("parts") or []):
        if "text" in part:
            tally.text(i, j, comp, str(part.get("text") or ""), chunks)
        elif "inlineData" in part:
            tally.add(i, j, comp, GEMINI_IMAGE_TOKENS)
        elif "fileData" in part:
            tally.add(i, j, Component.RETRIEVED, count(_json(part)))
        elif "functionResponse" in part:
            tally.add(i, j, Component.TOOL_RESULTS, count(_json(part["functionResponse"])))
        else:
            tally.add(i, j, comp, count(_json(part)))
