"""Anthropic messages (``/v1/messages`` and ``/v1/messages/count_tokens``): a top-level
``system``, content blocks (text, images, documents and search results, tool uses and results,
thinking, compaction), prompt-cache breakpoints, and Anthropic's error body."""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from types import MappingProxyType
from typing import Any

import orjson

from context_ceiling.core.counting import (
    TOOL_FRAME,
    Prior,
    RequestCount,
    Tally,
    call_tokens,
    count_context,
    json_text,
    last_index,
    require_messages,
    walk_items,
)
from context_ceiling.core.images import anthropic_image_tokens, size_from_base64
from context_ceiling.core.models import ChatFormat
from context_ceiling.core.shape_checks import (
    RequestShapeError,
    check_depth_around,
    messages_of,
    optional_type,
    require_type,
)
from context_ceiling.core.tokenizers import CountCache, TextCounter
from context_ceiling.core.trim import Policy
from context_ceiling.core.trim_rules import ToolUse, TrimRules, block_texts
from context_ceiling.core.utilization import Component
from context_ceiling.formats.base import (
    Answer,
    ApiInfo,
    Ask,
    Expect,
    Format,
    Native,
    Prompt,
    Route,
    StreamTap,
    Usage,
    as_mapping,
    event_data,
    expectation,
    int_of,
    latest,
    load_json,
    output_cap,
    text_of,
)

__all__ = [
    "API",
    "CONTEXT_BETA",
    "FORMAT",
    "PDF_PAGE_TOKENS",
    "ROUTES",
    "TOOL_SYSTEM_TOKENS",
    "MessagesRules",
    "MessagesStreamTap",
    "ask",
    "body_usage",
    "check_message",
    "check_top",
    "count",
    "document_text",
    "error_body",
    "expect",
    "latest_turn_start",
    "native",
    "pdf_tokens",
    "prompt",
    "read_answer",
    "requested_output",
    "too_long",
]

#: Anthropic's published tool-use system prompt size (auto/none tool_choice).
TOOL_SYSTEM_TOKENS = 346

# -- shape ---------------------------------------------------------------------------------------


def _objects(v: Any, where: str) -> None:
    """An optional array of objects."""
    if v is not None:
        require_type(v, list, where, "an array")
        for k, x in enumerate(v):
            require_type(x, dict, f"{where}[{k}]", "an object")


def _check_document(b: Mapping[str, Any], w: str) -> None:
    """A ``document`` or ``search_result`` block: its source (text, base64, content blocks),
    its content, title and context."""
    src = b.get("source")
    if src is not None and not isinstance(src, str):
        require_type(src, dict, f"{w}.source", "an object or a string")
        optional_type(src, "data", str, f"{w}.source", "a string")
        _objects(src.get("content"), f"{w}.source.content")
    _objects(b.get("content"), f"{w}.content")
    for key in ("title", "context"):
        optional_type(b, key, str, w, "a string")


def _check_block(b: Any, w: str, in_tool_result: bool = False) -> None:
    if in_tool_result and isinstance(b, str):
        return
    require_type(b, dict, w, "an object")
    require_type(b.get("type"), str, f"{w}.type", "a string")
    kind = b["type"]
    if kind == "text":
        optional_type(b, "text", str, w, "a string")
    elif kind == "image":
        src = b.get("source")
        require_type(src, dict, f"{w}.source", "an object")
        optional_type(src, "data", str, f"{w}.source", "a string")
        optional_type(src, "type", str, f"{w}.source", "a string")
    elif kind in ("document", "search_result"):
        _check_document(b, w)
    elif kind == "tool_result":
        inner = b.get("content")
        if isinstance(inner, list):
            for k, x in enumerate(inner):
                _check_block(x, f"{w}.content[{k}]", in_tool_result=True)
        elif inner is not None and not isinstance(inner, str):
            raise RequestShapeError(f"{w}.content must be a string or an array")
    elif kind == "tool_use":
        optional_type(b, "name", str, w, "a string")
    elif kind == "thinking":
        optional_type(b, "thinking", str, w, "a string")


def check_top(body: Mapping[str, Any]) -> None:
    """Everything of a messages body but its messages' insides."""
    check_depth_around(body, "messages")
    messages_of(body)
    system = body.get("system")
    if isinstance(system, list):
        for j, b in enumerate(system):
            require_type(b, dict, f"system[{j}]", "an object")
            optional_type(b, "text", str, f"system[{j}]", "a string")
    elif system is not None and not isinstance(system, str):
        raise RequestShapeError("'system' must be a string or an array of text blocks")
    if body.get("tools") is not None:
        require_type(body["tools"], list, "'tools'", "an array")
        for k, t in enumerate(body["tools"]):
            require_type(t, dict, f"tools[{k}]", "an object")


def check_message(i: int, m: Any) -> None:
    """One messages-API message (``messages[i]``)."""
    w = f"messages[{i}]"
    require_type(m, dict, w, "an object")
    if m.get("role") not in ("user", "assistant"):
        raise RequestShapeError(f"{w}.role must be 'user' or 'assistant'")
    content = m.get("content")
    if isinstance(content, list):
        for j, b in enumerate(content):
            _check_block(b, f"{w}.content[{j}]")
    elif not isinstance(content, str):
        raise RequestShapeError(f"{w}.content must be a string or an array")


# -- count ---------------------------------------------------------------------------------------


def _block(
    tally: Tally,
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
        tally.add(i, j, Component.RETRIEVED, count(document_text(block)) + pdf_tokens(block))
    elif kind == "tool_result":
        content = block.get("content")
        inner = content if isinstance(content, list) else [content or ""]
        for sub in inner:
            sub_kind = sub.get("type") if isinstance(sub, dict) else None
            if sub_kind == "image":
                _block(tally, i, j, Component.TOOL_RESULTS, sub, None)
            elif sub_kind in ("document", "search_result") and isinstance(sub, dict):
                # Anthropic's "search results from tool calls": the text the model reads
                tally.add(i, j, Component.TOOL_RESULTS, count(document_text(sub)) + pdf_tokens(sub))
            elif isinstance(sub, str) or sub_kind in (None, "text"):
                text = sub if isinstance(sub, str) else str((sub or {}).get("text", ""))
                tally.add(i, j, Component.TOOL_RESULTS, count(text))
            else:  # a block type this counter does not know: its JSON is the best estimate
                tally.add(i, j, Component.TOOL_RESULTS, count(json_text(sub)))
        tally.add(i, j, Component.TOOL_RESULTS, TOOL_FRAME)
    elif kind == "tool_use":
        name, arguments = str(block.get("name", "")), json_text(block.get("input", {}))
        tally.add(i, j, comp, call_tokens(name, arguments, count))
    elif kind in ("thinking", "redacted_thinking") and stripped:
        # an earlier turn's thinking: the API removes it from the context window
        # (context_window = input - previous thinking + this turn), so it counts nothing
        tally.add(i, j, comp, 0)
    elif kind == "thinking":
        tally.add(i, j, comp, count(str(block.get("thinking", ""))))
    elif kind == "compaction":  # server-side compaction's summary, replayed by the client
        tally.add(i, j, comp, 3 + count(str(block.get("content") or "")))
    else:  # server tool blocks, redacted thinking, ...: their JSON is the best estimate
        tally.add(i, j, comp, count(json_text(block)))


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


def document_text(block: Mapping[str, Any]) -> str:
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


def latest_turn_start(messages: list[Any]) -> int:
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


def count(
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
    check = check_message if prior is None else None
    if check is not None:  # a body derived from a checked one has its shape
        check_top(body)
    fmt = fmt or ChatFormat()
    messages = require_messages(body)
    tally = Tally(counter, prior)
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
        tally.add(-2, j, Component.TOOL_DEFINITIONS, count(json_text(tool)))
    if tools:
        tally.add(-2, -1, Component.TOOL_DEFINITIONS, TOOL_SYSTEM_TOKENS)
    last_user = last_index(messages, "user")
    turn_start = latest_turn_start(messages)
    ctx = count_context("anthropic", counter, fmt, chunks)

    def classify(i: int, msg: Any) -> tuple[Component, bool, bool]:
        if not isinstance(msg, dict):
            raise RequestShapeError(f"messages[{i}] must be an object")
        role = msg.get("role")
        if role not in ("user", "assistant"):
            raise RequestShapeError(f"messages[{i}].role must be 'user' or 'assistant'")
        comp = Component.LATEST_USER if i == last_user else Component.HISTORY
        return comp, role == "assistant" and i < turn_start, False

    marks = (last_user, turn_start)
    walk_items(tally, memo, prior, ctx, messages, marks, fmt, chunks, check, classify, _message)
    tally.add(-1, -1, Component.LATEST_USER, fmt.reply_priming)
    return tally.result()


def _message(
    tally: Tally,
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
            _block(tally, i, j, comp, block, chunks, stripped)
    else:
        raise RequestShapeError(f"messages[{i}].content must be a string or an array")


def requested_output(body: Mapping[str, Any]) -> int | None:
    """``max_tokens`` (required by the API)."""
    return output_cap(body.get("max_tokens"))


# -- usage ---------------------------------------------------------------------------------------


def _usage(u: Usage, usage: Any) -> None:
    if not isinstance(usage, dict):
        return
    fresh = int_of(usage.get("input_tokens"))
    read = int_of(usage.get("cache_read_input_tokens")) or 0
    created = int_of(usage.get("cache_creation_input_tokens")) or 0
    if fresh is not None:
        u.input_tokens = fresh + read + created
        u.cached_tokens = read
        u.cache_write_tokens = created
    out = int_of(usage.get("output_tokens"))
    if out is not None:
        u.output_tokens = out
    _iterations(u, usage.get("iterations"))


def _iterations(u: Usage, iterations: Any) -> None:
    """``usage.iterations`` (compaction, server tool loops): a ``compaction`` entry is the
    provider summarizing the context, billed apart from the top-level usage (which is the
    answer's own); its tokens are kept so billed usage is whole. Read whole each time (the
    last ``message_delta`` repeats the list)."""
    if not isinstance(iterations, list):
        return
    steps = [it for it in iterations if isinstance(it, dict) and it.get("type") == "compaction"]
    u.compactions = len(steps)
    u.compaction_input_tokens = sum(
        (int_of(it.get(k)) or 0)
        for it in steps
        for k in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
    )
    u.compaction_output_tokens = sum(int_of(it.get("output_tokens")) or 0 for it in steps)


def _context_management(u: Usage, cm: Any) -> None:
    """Anthropic's report of the context edits it applied (``context_management``)."""
    if not isinstance(cm, dict) or not isinstance(cm.get("applied_edits"), list):
        return
    cleared = 0
    for edit in cm["applied_edits"]:
        if isinstance(edit, dict):
            u.native_edits += 1
            cleared += int_of(edit.get("cleared_input_tokens")) or 0
    u.native_cleared_tokens = cleared


def body_usage(body: bytes) -> Usage:
    """A message (usage, model, stop reason, context edits), or a ``count_tokens`` reply."""
    u = Usage()
    obj = load_json(body)
    if isinstance(obj, dict):
        _usage(u, obj.get("usage"))
        u.response_model = obj.get("model") if isinstance(obj.get("model"), str) else None
        u.finish_reason = obj.get("stop_reason")
        _context_management(u, obj.get("context_management"))
        if obj.get("input_tokens") is not None and u.input_tokens is None:  # count_tokens reply
            u.input_tokens = int_of(obj.get("input_tokens"))
    return u


class MessagesStreamTap(StreamTap):
    """Reads usage from ``message_start`` and ``message_delta`` events; forwards all unchanged."""

    __slots__ = ()  # complete: saw ``message_stop``; upstream_error: saw ``event: error``

    @staticmethod
    def error_event(message: str) -> bytes:
        """Anthropic's mid-stream failure: ``event: error`` (the SDK raises on it)."""
        err = {"type": "error", "error": {"type": "api_error", "message": message}}
        return b"event: error\ndata: " + orjson.dumps(err) + b"\n\n"

    whole_reads = True
    marks = (b"message_", b"error")  # message_start/_delta/_stop, error

    def on_event(self, event: bytes) -> bytes | None:
        name, data = event_data(event)
        if name == b"message_stop":
            self.complete = True
        elif name == b"error":
            self.upstream_error = True
        if name not in (b"message_start", b"message_delta") or not data:
            return event
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            return event
        if not isinstance(obj, dict):
            return event
        if name == b"message_start" and isinstance(obj.get("message"), dict):
            msg = obj["message"]
            _usage(self.usage, msg.get("usage"))
            if isinstance(msg.get("model"), str):
                self.usage.response_model = msg["model"]
        else:
            usage = obj.get("usage")
            if isinstance(usage, dict):
                # message_delta usage is cumulative; input fields appear there on some versions
                if usage.get("input_tokens") is not None:
                    _usage(self.usage, usage)
                else:
                    if int_of(usage.get("output_tokens")) is not None:
                        self.usage.output_tokens = int_of(usage.get("output_tokens"))
                    _iterations(self.usage, usage.get("iterations"))
            delta = obj.get("delta")
            if isinstance(delta, dict) and delta.get("stop_reason"):
                self.usage.finish_reason = delta["stop_reason"]
            _context_management(self.usage, obj.get("context_management"))
        return event


# -- the answer ----------------------------------------------------------------------------------


def expect(obj: Mapping[str, Any]) -> Expect:
    """What a messages request asks its answer to be (``output_config.format``, ``tools``)."""
    oc = obj.get("output_config")  # generally available; output_format: the beta
    fmt = oc.get("format") if isinstance(oc, Mapping) else obj.get("output_format")
    json_, schema = False, None
    if isinstance(fmt, Mapping) and fmt.get("type") == "json_schema":
        json_, schema = True, fmt.get("schema")
    raw = obj.get("tools")
    if not isinstance(raw, list):
        return expectation(json_, schema, None)
    # client tools carry an input_schema; server tools (web search...) are answered by the
    # provider as server_tool_use blocks, never as tool calls to check
    named = {
        t["name"]: as_mapping(t.get("input_schema"))
        for t in raw
        if isinstance(t, Mapping) and isinstance(t.get("name"), str)
    }
    return expectation(json_, schema, (named, set()))


def _whole(a: Answer, o: Mapping[str, Any], text: list[str]) -> None:
    """A whole message: its text and tool_use blocks, its stop reason."""
    for b in o.get("content") or ():
        if not isinstance(b, Mapping):
            continue
        if b.get("type") == "text" and isinstance(b.get("text"), str):
            text.append(b["text"])
        elif b.get("type") == "tool_use":
            a.tool_calls.append((str(b.get("name") or ""), b.get("input")))
    a.finish = o.get("stop_reason") if isinstance(o.get("stop_reason"), str) else None


def _event(a: Answer, o: Mapping[str, Any], text: list[str], blocks: dict[int, list[Any]]) -> None:
    """One stream event: text, a tool_use block's start and its input pieces (``blocks``:
    index -> [name, partial json pieces...]), the stop reason."""
    kind = o.get("type")
    if kind == "content_block_start" and isinstance(o.get("content_block"), Mapping):
        b = o["content_block"]
        if b.get("type") == "tool_use":
            blocks[int_of(o.get("index")) or 0] = [str(b.get("name") or "")]
        elif b.get("type") == "text" and isinstance(b.get("text"), str):
            text.append(b["text"])
    elif kind == "content_block_delta" and isinstance(o.get("delta"), Mapping):
        d = o["delta"]
        if d.get("type") == "text_delta" and isinstance(d.get("text"), str):
            text.append(d["text"])
        elif d.get("type") == "input_json_delta" and isinstance(d.get("partial_json"), str):
            # a client tool's input; a server tool's (server_tool_use) is the provider's
            block = blocks.get(int_of(o.get("index")) or 0)
            if block is not None:
                block.append(d["partial_json"])
    elif kind == "message_delta":
        d = o.get("delta")
        if isinstance(d, Mapping) and isinstance(d.get("stop_reason"), str):
            a.finish = d["stop_reason"]


def read_answer(objs: Iterable[Any], stream: bool) -> Answer:
    """A message's content blocks, or a stream's block events (tool inputs joined from their
    ``input_json_delta`` pieces)."""
    a = Answer()
    text: list[str] = []
    blocks: dict[int, list[Any]] = {}
    for o in objs:
        if isinstance(o, Mapping):
            if stream:
                _event(a, o, text, blocks)
            else:
                _whole(a, o, text)
    a.text = "".join(text)
    # a streamed tool_use with no input deltas has the empty object as its input
    a.tool_calls += [(s[0], "".join(s[1:]) or "{}") for _, s in sorted(blocks.items())]
    return a


def _documents(content: Any) -> list[tuple[str, str | None]]:
    """Anthropic ``document`` blocks with plain text sources: retrieved chunks as blocks."""
    out: list[tuple[str, str | None]] = []
    if isinstance(content, list):
        for b in content:
            if isinstance(b, Mapping) and b.get("type") == "document":
                src = b.get("source")
                if isinstance(src, Mapping) and isinstance(src.get("data"), str):
                    title = b.get("title")
                    out.append((src["data"], title if isinstance(title, str) else None))
    return out


def prompt(body: Mapping[str, Any]) -> Prompt:
    """``system``, the latest user message (its text, and its ``document`` blocks as the
    retrieved documents), the tools."""
    sys_ = body.get("system")
    content = latest(body.get("messages"), ("user",))
    return Prompt(
        sys_ if isinstance(sys_, str) else text_of(sys_),
        text_of(content),
        body.get("tools"),
        _documents(content),
    )


# -- errors --------------------------------------------------------------------------------------

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    422: "invalid_request_error",
    502: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
}


def error_body(status: int, message: str, code: str | None = None) -> bytes:
    """Anthropic's error object (the SDK raises the class its ``type`` names)."""
    return orjson.dumps(
        {
            "type": "error",
            "error": {"type": ERROR_TYPES.get(status, "api_error"), "message": message},
        }
    )


# -- trimming ------------------------------------------------------------------------------------


def _has_result(content: Any) -> bool:
    return isinstance(content, list) and any(
        isinstance(b, dict) and b.get("type") == "tool_result" for b in content
    )


class MessagesRules(TrimRules):
    """Tool results are ``tool_result`` blocks in a user message, which belongs to the
    assistant turn before it whatever text it also carries (the reminders coding agents
    attach); calls are ``tool_use`` blocks; the prefix up to the last ``cache_control``
    breakpoint is protected; a cited document leaves a stub."""

    #: a ``tool_result`` block's part carries 3 framing tokens
    result_frame = 3
    cache_control = True

    def is_result(self, m: dict[str, Any]) -> bool:
        return m.get("role") == "user" and _has_result(m.get("content"))

    def starts_turn(self, m: Any) -> bool:
        return isinstance(m, dict) and m.get("role") == "user" and not _has_result(m.get("content"))

    def tool_uses(self, messages: list[Any], tokens: Callable[[int, int], int]) -> list[ToolUse]:
        calls: dict[str, tuple[tuple[int, int], str]] = {}
        uses: list[ToolUse] = []
        for i, m in enumerate(messages):
            if not (isinstance(m, dict) and isinstance(m.get("content"), list)):
                continue
            for j, b in enumerate(m["content"]):
                if not isinstance(b, dict):
                    continue
                if b.get("type") == "tool_use":
                    calls[str(b.get("id"))] = ((i, j), str(b.get("name", "")))
                elif b.get("type") == "tool_result":
                    cid = str(b.get("tool_use_id") or "")
                    where, name = calls.get(cid, (None, ""))
                    uses.append(ToolUse((i, j), where, name, cid, tokens(i, j)))
        return uses

    def results(self, m: dict[str, Any]) -> Iterator[tuple[int, str | None]]:
        content = m.get("content")
        if not isinstance(content, list):
            return
        for j, b in enumerate(content):
            if not (isinstance(b, dict) and b.get("type") == "tool_result"):
                continue
            inner = b.get("content")
            if isinstance(inner, list) and any(
                isinstance(x, dict) and x.get("type") != "text" for x in inner
            ):
                yield j, None  # results with images are left whole
            else:
                yield j, block_texts(inner)

    def call_input(self, m: dict[str, Any], k: int) -> Any:
        return m["content"][k].get("input", {})

    def without_inputs(self, m: dict[str, Any], calls: set[int]) -> dict[str, Any]:
        m["content"] = [{**b, "input": {}} if k in calls else b for k, b in enumerate(m["content"])]
        return m

    def cites_documents(self, messages: list[Any]) -> bool:
        return any(
            isinstance(b, dict)
            and isinstance(b.get("citations"), list)
            and any(isinstance(c, dict) and "document_index" in c for c in b["citations"])
            for m in messages
            if isinstance(m, dict) and m.get("role") == "assistant"
            for b in (m["content"] if isinstance(m.get("content"), list) else [])
        )


def _provider(_path: str) -> str:
    return "anthropic"


def too_long(tokens: int, budget: int, detail: str) -> str:
    """Anthropic's words for a prompt over the window."""
    return f"prompt is too long: {tokens} tokens > {budget} maximum ({detail})"


#: the beta that enables Anthropic's context editing
CONTEXT_BETA = "context-management-2025-06-27"


def native(ceiling: int, policy: Policy) -> dict[str, Any]:
    """Tool-result clearing triggered at the ceiling, with the policy's ``keep``,
    ``exclude_tools``, ``clear_tool_inputs`` and ``clear_at_least``."""
    v = policy.clear_at_least
    edit: dict[str, Any] = {
        "type": "clear_tool_uses_20250919",
        "trigger": {"type": "input_tokens", "value": ceiling},
        "keep": {"type": "tool_uses", "value": policy.keep},
        "clear_at_least": {
            "type": "input_tokens",
            "value": max(1, int(v * ceiling) if v < 1 else int(v)),
        },
    }
    if policy.exclude_tools:
        edit["exclude_tools"] = list(policy.exclude_tools)
    if policy.clear_tool_inputs:
        edit["clear_tool_inputs"] = True
    return {"edits": [edit]}


#: the provider's other routes (passed through): first path segment -> the ``route`` label
PASSTHROUGH_ROUTES = MappingProxyType(
    {
        "messages": "message_batches",
        "models": "models",
        "files": "files",
        "complete": "complete",
        "skills": "skills",
    }
)


def ask(a: Ask) -> tuple[str, dict[str, Any]]:
    """A message that asks ``a``. A question on a shared haystack marks the haystack as a
    prompt-cache breakpoint (written once, then read by the questions after it); a thinking
    budget turns extended thinking on, on top of ``max_tokens``, and drops ``temperature``
    (thinking refuses one)."""
    content: str | list[dict[str, Any]] = a.user
    if a.shared:
        content = [
            {"type": "text", "text": a.user[: a.shared], "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": a.user[a.shared :]},
        ]
    body: dict[str, Any] = {
        "model": a.model,
        "max_tokens": a.max_tokens,
        "temperature": a.temperature,
        "messages": [{"role": "user", "content": content}],
    }
    if a.thinking:
        budget = max(1024, a.thinking)
        del body["temperature"]
        body |= {
            "max_tokens": a.max_tokens + budget,
            "thinking": {"type": "enabled", "budget_tokens": budget},
        }
    if a.system:
        body["system"] = a.system
    return "/v1/messages", body


#: Anthropic's API
API = ApiInfo(
    "anthropic",
    "the default upstream of Anthropic routes (messages, count_tokens, message batches)",
    "https://api.anthropic.com",
    prices="anthropic",
    key_headers=lambda key: (
        {"anthropic-version": "2023-06-01"} | ({"x-api-key": key} if key else {})
    ),
    key_env="ANTHROPIC_API_KEY",
)

FORMAT = Format(
    shape="anthropic",
    api="anthropic",
    ask=ask,
    count=count,
    trim=MessagesRules(),
    requested_output=requested_output,
    body_usage=body_usage,
    tap=lambda _changed: MessagesStreamTap(),
    expect=expect,
    read_answer=read_answer,
    prompt=prompt,
    error_body=error_body,
    too_long=too_long,
    provider=_provider,
    native=Native(
        native, ("api.anthropic.com",), CONTEXT_BETA, excludes=("context_management", "compaction")
    ),
    betas_header="anthropic-beta",
    passthrough_routes=PASSTHROUGH_ROUTES,
    client_headers=("anthropic-version", "x-api-key"),
)

ROUTES = (
    Route(FORMAT, "anthropic_messages", "/v1/messages", paths=("/v1/messages",)),
    Route(
        FORMAT,
        "anthropic_count_tokens",
        "/v1/messages/count_tokens",
        paths=("/v1/messages/count_tokens",),
        count_only=True,
    ),
)
