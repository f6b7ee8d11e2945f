"""AWS Bedrock: the Converse API (``/model/{modelId}/converse`` and ``converse-stream``:
content blocks keyed by their kind, ``toolUse``/``toolResult``, a ``system`` list,
``inferenceConfig``, ``cachePoint`` breakpoints) and Anthropic's models through InvokeModel
(``/model/{modelId}/invoke`` and ``invoke-with-response-stream``: an Anthropic messages body
with ``anthropic_version``, the model in the path).

Bedrock's particulars, each a part of the provider layer:

- **Signing**: a SigV4 signature covers the host, the path and the body, so a request the
  sidecar forwards is signed again with the sidecar's own credentials (the standard AWS chain,
  through botocore's signer); a Bedrock API key (``Authorization: Bearer``) goes as sent.
  Without credentials the client's request goes as it came, and a body the sidecar changed is
  refused (a signature of the client's no longer holds).
- **Streams** are AWS event-stream binary messages (:mod:`~context_ceiling.formats.eventstream`).
- **Errors** carry their type in ``x-amzn-ErrorType``, which botocore reads.

Path and query go upstream as the client sent them, to the ``bedrock`` upstream
(``https://bedrock-runtime.REGION.amazonaws.com``).
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from types import MappingProxyType
from typing import Any, ClassVar
from urllib.parse import quote, unquote

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
from context_ceiling.core.trim_rules import PLACEHOLDER, ToolUse, TrimRules
from context_ceiling.core.utilization import Component
from context_ceiling.formats import anthropic
from context_ceiling.formats.base import (
    Answer,
    ApiInfo,
    Ask,
    Expect,
    Format,
    Prompt,
    Provider,
    Route,
    StreamTap,
    Usage,
    as_mapping,
    expectation,
    int_of,
    load_json,
    output_cap,
)
from context_ceiling.formats.eventstream import EventStreamFraming, Message, decode, encode
from context_ceiling.formats.sigv4 import SigV4Signer

__all__ = [
    "API",
    "BEDROCK",
    "CONVERSE",
    "COUNT_TOKENS",
    "INVOKE",
    "PASSTHROUGH_ROUTES",
    "ROUTES",
    "SIGNER",
    "ConverseRules",
    "ConverseStreamTap",
    "InvokeStreamTap",
    "SigV4Signer",
    "ask",
    "body_usage",
    "count",
    "count_tokens",
    "count_tokens_usage",
    "error_body",
    "error_headers",
    "expect",
    "model_of",
    "prompt",
    "read_answer",
    "requested_output",
    "too_long",
]

# -- shape ---------------------------------------------------------------------------------------

#: the content blocks a Converse message may hold (each block is an object with one of these)
_BLOCKS = (
    "text",
    "image",
    "document",
    "video",
    "toolUse",
    "toolResult",
    "guardContent",
    "cachePoint",
    "reasoningContent",
    "citationsContent",
)


def _kind(b: Mapping[str, Any]) -> str:
    """A block's kind: its one known key (``other`` when it has none)."""
    for k in b:
        if k in _BLOCKS:
            return k
    return "other"


def _check_block(b: Any, w: str) -> None:
    require_type(b, dict, w, "an object")
    kind = _kind(b)
    if kind == "text":
        require_type(b["text"], str, f"{w}.text", "a string")
    elif kind == "toolUse":
        require_type(b["toolUse"], dict, f"{w}.toolUse", "an object")
        optional_type(b["toolUse"], "name", str, f"{w}.toolUse", "a string")
        optional_type(b["toolUse"], "toolUseId", str, f"{w}.toolUse", "a string")
    elif kind == "toolResult":
        tr = b["toolResult"]
        require_type(tr, dict, f"{w}.toolResult", "an object")
        optional_type(tr, "toolUseId", str, f"{w}.toolResult", "a string")
        content = tr.get("content")
        if content is not None:
            require_type(content, list, f"{w}.toolResult.content", "an array")
            for k, x in enumerate(content):
                require_type(x, dict, f"{w}.toolResult.content[{k}]", "an object")
                optional_type(x, "text", str, f"{w}.toolResult.content[{k}]", "a string")
    elif kind in ("image", "document", "video", "reasoningContent", "guardContent"):
        require_type(b[kind], dict, f"{w}.{kind}", "an object")


def _check_top(body: Mapping[str, Any]) -> None:
    check_depth_around(body, "messages")
    messages_of(body)
    system = body.get("system")
    if system is not None:
        require_type(system, list, "'system'", "an array of system content blocks")
        for j, b in enumerate(system):
            require_type(b, dict, f"system[{j}]", "an object")
            optional_type(b, "text", str, f"system[{j}]", "a string")
    tc = body.get("toolConfig")
    if tc is not None:
        require_type(tc, dict, "'toolConfig'", "an object")
        tools = tc.get("tools")
        require_type(tools, list, "toolConfig.tools", "an array")
        for k, t in enumerate(tools):
            require_type(t, dict, f"toolConfig.tools[{k}]", "an object")
    ic = body.get("inferenceConfig")
    if ic is not None:
        require_type(ic, dict, "'inferenceConfig'", "an object")
        optional_type(ic, "maxTokens", int, "inferenceConfig", "an integer")


def _check_message(i: int, m: Any) -> None:
    w = f"messages[{i}]"
    require_type(m, dict, w, "an object")
    if m.get("role") not in ("user", "assistant"):
        raise RequestShapeError(f"{w}.role must be 'user' or 'assistant'")
    content = m.get("content")
    require_type(content, list, f"{w}.content", "an array of content blocks")
    for j, b in enumerate(content):
        _check_block(b, f"{w}.content[{j}]")


# -- count ---------------------------------------------------------------------------------------


def _image_tokens(image: Mapping[str, Any]) -> int:
    src = image.get("source")
    data = src.get("bytes") if isinstance(src, Mapping) else None
    return anthropic_image_tokens(size_from_base64(data) if isinstance(data, str) else None)


def _document_text(doc: Mapping[str, Any]) -> str:
    """A document block's name and the text the model reads (a text source, or content
    blocks)."""
    pieces = [str(doc.get("name") or "")]
    src = doc.get("source")
    if isinstance(src, Mapping):
        if isinstance(src.get("text"), str):
            pieces.append(src["text"])
        for b in src.get("content") or ():
            if isinstance(b, Mapping) and isinstance(b.get("text"), str):
                pieces.append(b["text"])
    return "\n".join(p for p in pieces if p)


def _document_tokens(doc: Mapping[str, Any], count: Callable[[str], int]) -> int:
    src = doc.get("source")
    data = src.get("bytes") if isinstance(src, Mapping) else None
    pdf = 0
    if isinstance(data, str) and doc.get("format") in (None, "pdf"):
        # the same per-page estimate as Anthropic's PDF documents
        pdf = anthropic.pdf_tokens({"source": {"type": "base64", "data": data}})
    elif isinstance(data, str):  # a text file sent as bytes (txt, md, csv, html ...)
        try:
            pdf = count(base64.b64decode(data, validate=False).decode("utf-8", "replace"))
        except (binascii.Error, ValueError):
            pdf = len(data) // 4
    return count(_document_text(doc)) + pdf


def _result_item_text(x: Any) -> str | None:
    """A tool result's content item as text (None: an image, a document, a video)."""
    if not isinstance(x, Mapping):
        return None
    if isinstance(x.get("text"), str):
        return str(x["text"])
    if "json" in x:
        return json_text(x["json"])
    return None


def _block(
    tally: Tally,
    i: int,
    j: int,
    comp: Component,
    b: Any,
    chunks: re.Pattern[str] | None,
    stripped: bool,
) -> None:
    count = tally.counter.count
    kind = _kind(b)
    if kind == "text":
        tally.text(i, j, comp, b["text"], chunks)
    elif kind == "image":
        tally.add(i, j, comp, _image_tokens(b["image"]))
    elif kind == "document":
        tally.add(i, j, Component.RETRIEVED, _document_tokens(b["document"], count))
    elif kind == "toolUse":
        tu = b["toolUse"]
        name, arguments = str(tu.get("name") or ""), json_text(tu.get("input", {}))
        tally.add(i, j, comp, call_tokens(name, arguments, count))
    elif kind == "toolResult":
        n = TOOL_FRAME
        for x in b["toolResult"].get("content") or ():
            text = _result_item_text(x)
            if text is not None:
                n += count(text)
            elif isinstance(x, Mapping) and isinstance(x.get("image"), Mapping):
                n += _image_tokens(x["image"])
            elif isinstance(x, Mapping) and isinstance(x.get("document"), Mapping):
                n += _document_tokens(x["document"], count)
            else:
                n += count(json_text(x))
        tally.add(i, j, Component.TOOL_RESULTS, n)
    elif kind == "cachePoint":
        tally.add(i, j, comp, 0)
    elif kind == "reasoningContent":
        # an earlier turn's reasoning is removed from the window by the model's API
        rt = b["reasoningContent"].get("reasoningText")
        text = rt.get("text") if isinstance(rt, Mapping) else None
        tally.add(i, j, comp, 0 if stripped else count(str(text or "")))
    elif kind == "guardContent":
        text = b["guardContent"].get("text")
        inner = text.get("text") if isinstance(text, Mapping) else None
        tally.add(i, j, comp, count(str(inner or "")))
    else:  # video, citations, blocks this counter does not know: their JSON is the estimate
        tally.add(i, j, comp, count(json_text(b)))


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
    if not isinstance(content, list):
        raise RequestShapeError(f"messages[{i}].content must be an array of content blocks")
    for j, b in enumerate(content):
        if not isinstance(b, dict):
            raise RequestShapeError(f"messages[{i}].content[{j}] must be an object")
        _block(tally, i, j, comp, b, chunks, stripped)


def _answers_call(m: Any) -> bool:
    content = m.get("content") if isinstance(m, dict) else None
    return isinstance(content, list) and any(
        isinstance(b, dict) and "toolResult" in b for b in content
    )


def _turn_start(messages: list[Any]) -> int:
    for i in range(len(messages) - 1, -1, -1):
        m = messages[i]
        if isinstance(m, dict) and m.get("role") == "user" and not _answers_call(m):
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
    """Input tokens of a Converse body (its shape checked first: ``RequestShapeError`` names
    the field), by component: ``system`` blocks, ``toolConfig`` tools, each message's blocks
    (documents as retrieved material, tool results as tool results)."""
    check = _check_message if prior is None else None
    if check is not None:
        _check_top(body)
    fmt = fmt or ChatFormat()
    messages = require_messages(body)
    tally = Tally(counter, prior)
    cnt = counter.count
    for j, b in enumerate(body.get("system") or ()):
        if isinstance(b, dict) and isinstance(b.get("text"), str):
            tally.add(-1, j, Component.SYSTEM, cnt(b["text"]))
        elif isinstance(b, dict) and "cachePoint" not in b:
            tally.add(-1, j, Component.SYSTEM, cnt(json_text(b)))
    tc = body.get("toolConfig")
    tools = tc.get("tools") if isinstance(tc, dict) else None
    for j, tool in enumerate(tools or ()):
        if isinstance(tool, dict) and "cachePoint" not in tool:
            tally.add(-2, j, Component.TOOL_DEFINITIONS, cnt(json_text(tool)))
    last_user = last_index(messages, "user")
    turn_start = _turn_start(messages)
    ctx = count_context("converse", counter, fmt, chunks)

    def classify(i: int, msg: Any) -> tuple[Component, bool, bool]:
        if not isinstance(msg, dict):
            raise RequestShapeError(f"messages[{i}] must be an object")
        comp = Component.LATEST_USER if i == last_user else Component.HISTORY
        return comp, msg.get("role") == "assistant" and i < turn_start, False

    marks = (last_user, turn_start)
    walk_items(tally, memo, prior, ctx, messages, marks, fmt, chunks, check, classify, _message)
    tally.add(-1, -1, Component.LATEST_USER, fmt.reply_priming)
    return tally.result()


def requested_output(body: Mapping[str, Any]) -> int | None:
    """``inferenceConfig.maxTokens``."""
    ic = body.get("inferenceConfig")
    return output_cap(ic.get("maxTokens")) if isinstance(ic, Mapping) else None


# -- usage ---------------------------------------------------------------------------------------


def _usage(u: Usage, usage: Any) -> None:
    """Converse usage: ``inputTokens`` are the uncached ones; cache reads and writes are in the
    window too."""
    if not isinstance(usage, Mapping):
        return
    fresh = int_of(usage.get("inputTokens"))
    read = int_of(usage.get("cacheReadInputTokens")) or 0
    written = int_of(usage.get("cacheWriteInputTokens")) or 0
    if fresh is not None:
        u.input_tokens = fresh + read + written
        u.cached_tokens = read
        u.cache_write_tokens = written
    out = int_of(usage.get("outputTokens"))
    if out is not None:
        u.output_tokens = out


def body_usage(body: bytes) -> Usage:
    """A Converse response: its usage and stop reason."""
    u = Usage()
    obj = load_json(body)
    if isinstance(obj, dict):
        _usage(u, obj.get("usage"))
        if isinstance(obj.get("stopReason"), str):
            u.finish_reason = obj["stopReason"]
    return u


def _exception(message: str) -> bytes:
    """An event-stream exception: botocore raises it as an ``EventStreamError``."""
    return encode(
        {
            ":message-type": "exception",
            ":exception-type": "internalServerException",
            ":content-type": "application/json",
        },
        orjson.dumps({"message": message}),
    )


class _FrameTap(StreamTap):
    """A tap over event-stream messages: a read of whole messages in which none is one this
    tap reads (by a byte scan for the names it reads) is forwarded whole."""

    __slots__ = ()

    marks: ClassVar[tuple[bytes, ...]] = (b"exception",)

    @staticmethod
    def error_event(message: str) -> bytes:
        return _exception(message)

    whole_reads = True

    def on_event(self, event: bytes) -> bytes | None:
        try:
            m = decode(event)
        except ValueError:
            return event
        if m.kind != "event":
            self.upstream_error = True
            return event
        self.read(m)
        return event

    def read(self, m: Message) -> None:
        """Read one event message."""


class ConverseStreamTap(_FrameTap):
    """ConverseStream: the stop reason from ``messageStop``, usage from ``metadata`` (the
    protocol's last event)."""

    __slots__ = ()
    marks = (b"exception", b"messageStop", b"metadata")

    def read(self, m: Message) -> None:
        if m.event == "messageStop":
            obj = m.json()
            if isinstance(obj, dict) and isinstance(obj.get("stopReason"), str):
                self.usage.finish_reason = obj["stopReason"]
        elif m.event == "metadata":
            obj = m.json()
            if isinstance(obj, dict):
                _usage(self.usage, obj.get("usage"))
            self.complete = True


def _chunk_event(m: Message) -> Any:
    """An InvokeModelWithResponseStream ``chunk``: the model's own event, base64 in ``bytes``."""
    if m.kind != "event" or m.event != "chunk":
        return None
    obj = m.json()
    data = obj.get("bytes") if isinstance(obj, dict) else None
    if not isinstance(data, str):
        return None
    try:
        return orjson.loads(base64.b64decode(data))
    except (binascii.Error, ValueError):
        return None


class InvokeStreamTap(_FrameTap):
    """InvokeModelWithResponseStream on an Anthropic model: each ``chunk`` carries one
    Anthropic stream event, read by the Anthropic tap (usage, stop reason, ``message_stop``)."""

    __slots__ = ("inner",)
    marks = (b"exception", b"chunk")

    def __init__(self) -> None:
        super().__init__()
        self.inner = anthropic.MessagesStreamTap()
        self.usage = self.inner.usage

    def read(self, m: Message) -> None:
        obj = _chunk_event(m)
        if not isinstance(obj, dict) or not isinstance(obj.get("type"), str):
            return
        name = obj["type"].encode()
        self.inner.on_event(b"event: " + name + b"\ndata: " + orjson.dumps(obj) + b"\n\n")
        self.complete = self.inner.complete
        self.upstream_error = self.upstream_error or self.inner.upstream_error

    whole_reads = False

    def on_chunk(self, chunk: bytes) -> bytes | None:
        return None  # every content delta is a chunk: each is read


def _converse_event(m: Message) -> Any:
    """A ConverseStream event as boto3 parses it: ``{eventType: payload}``."""
    obj = m.json() if m.kind == "event" else None
    return {m.event: obj} if isinstance(obj, dict) else None


# -- the answer ----------------------------------------------------------------------------------


def expect(obj: Mapping[str, Any]) -> Expect:
    """The tools a Converse request offers (``toolConfig.tools[].toolSpec``: name and
    ``inputSchema.json``)."""
    tc = obj.get("toolConfig")
    tools = tc.get("tools") if isinstance(tc, Mapping) else None
    if not isinstance(tools, list):
        return expectation(False, None, None)
    named: dict[str, Any] = {}
    for t in tools:
        spec = t.get("toolSpec") if isinstance(t, Mapping) else None
        if isinstance(spec, Mapping) and isinstance(spec.get("name"), str):
            schema = spec.get("inputSchema")
            named[spec["name"]] = (
                as_mapping(schema.get("json")) if isinstance(schema, Mapping) else None
            )
    return expectation(False, None, (named, set()))


def read_answer(objs: Iterable[Any], stream: bool) -> Answer:
    """A Converse response's message (text and ``toolUse`` blocks, ``stopReason``), or a
    stream's events (``contentBlockStart``/``Delta`` text and tool inputs, ``messageStop``)."""
    a = Answer()
    text: list[str] = []
    blocks: dict[int, list[Any]] = {}
    for o in objs:
        if not isinstance(o, Mapping):
            continue
        if not stream:
            out = o.get("output")
            msg = out.get("message") if isinstance(out, Mapping) else None
            for b in (msg.get("content") if isinstance(msg, Mapping) else None) or ():
                if isinstance(b, Mapping) and isinstance(b.get("text"), str):
                    text.append(b["text"])
                elif isinstance(b, Mapping) and isinstance(b.get("toolUse"), Mapping):
                    tu = b["toolUse"]
                    a.tool_calls.append((str(tu.get("name") or ""), tu.get("input")))
            if isinstance(o.get("stopReason"), str):
                a.finish = o["stopReason"]
            continue
        if isinstance(o.get("contentBlockStart"), Mapping):
            ev = o["contentBlockStart"]
            start = ev.get("start")
            tu = start.get("toolUse") if isinstance(start, Mapping) else None
            if isinstance(tu, Mapping):
                blocks[int_of(ev.get("contentBlockIndex")) or 0] = [str(tu.get("name") or "")]
        elif isinstance(o.get("contentBlockDelta"), Mapping):
            ev = o["contentBlockDelta"]
            d = ev.get("delta")
            if isinstance(d, Mapping) and isinstance(d.get("text"), str):
                text.append(d["text"])
            elif isinstance(d, Mapping) and isinstance(d.get("toolUse"), Mapping):
                block = blocks.get(int_of(ev.get("contentBlockIndex")) or 0)
                piece = d["toolUse"].get("input")
                if block is not None and isinstance(piece, str):
                    block.append(piece)
        elif isinstance(o.get("messageStop"), Mapping):
            stop = o["messageStop"].get("stopReason")
            a.finish = stop if isinstance(stop, str) else a.finish
    a.text = "".join(text)
    a.tool_calls += [(s[0], "".join(s[1:]) or "{}") for _, s in sorted(blocks.items())]
    return a


def prompt(body: Mapping[str, Any]) -> Prompt:
    """``system``, the latest user message's text blocks and its documents (text sources), the
    tools."""
    system = "\n".join(
        b["text"]
        for b in body.get("system") or ()
        if isinstance(b, Mapping) and isinstance(b.get("text"), str)
    )
    question, docs = [], []
    messages = body.get("messages")
    for m in reversed(messages if isinstance(messages, list) else []):
        if isinstance(m, Mapping) and m.get("role") == "user":
            for b in m.get("content") or ():
                if isinstance(b, Mapping) and isinstance(b.get("text"), str):
                    question.append(b["text"])
                elif isinstance(b, Mapping) and isinstance(b.get("document"), Mapping):
                    doc = b["document"]
                    name = doc.get("name")
                    docs.append((_document_text(doc), name if isinstance(name, str) else None))
            break
    tc = body.get("toolConfig")
    return Prompt(
        system, "\n".join(question), tc.get("tools") if isinstance(tc, Mapping) else None, docs
    )


# -- errors --------------------------------------------------------------------------------------

#: the exception botocore raises for a status (its ``x-amzn-ErrorType``)
ERROR_TYPES = {
    400: "ValidationException",
    401: "UnrecognizedClientException",
    403: "AccessDeniedException",
    404: "ResourceNotFoundException",
    408: "ModelTimeoutException",
    413: "ValidationException",
    424: "ModelErrorException",
    429: "ThrottlingException",
    431: "ValidationException",
    500: "InternalServerException",
    501: "ValidationException",
    502: "InternalServerException",
    503: "ServiceUnavailableException",
    504: "ModelTimeoutException",
}


def _error_type(status: int) -> str:
    return ERROR_TYPES.get(
        status, "ValidationException" if status < 500 else "InternalServerException"
    )


def error_body(status: int, message: str, code: str | None = None) -> bytes:
    """Bedrock's error body: ``message`` (and the type, as ``__type``)."""
    return orjson.dumps({"message": message, "__type": _error_type(status)})


def error_headers(status: int, code: str | None = None) -> Mapping[str, str]:
    """``x-amzn-ErrorType``: the exception botocore raises."""
    return {"x-amzn-ErrorType": _error_type(status)}


def too_long(tokens: int, budget: int, detail: str) -> str:
    """Bedrock's words for a prompt over the window."""
    return f"Input is too long for requested model: {tokens} input tokens > {budget} ({detail})"


# -- trimming ------------------------------------------------------------------------------------


class ConverseRules(TrimRules):
    """Tool results are ``toolResult`` blocks in a user message; calls are ``toolUse`` blocks;
    the prefix up to the last ``cachePoint`` block is protected."""

    result_frame = 3
    cache_control = True

    def empty_block(self) -> Any:
        return {"text": PLACEHOLDER}

    def cache_point(self, block: Any) -> bool:
        return isinstance(block, dict) and "cachePoint" in block

    def is_result(self, m: dict[str, Any]) -> bool:
        return m.get("role") == "user" and _answers_call(m)

    def starts_turn(self, m: Any) -> bool:
        return isinstance(m, dict) and m.get("role") == "user" and not _answers_call(m)

    def tool_uses(self, messages: list[Any], tokens: Callable[[int, int], int]) -> list[ToolUse]:
        calls: dict[str, tuple[tuple[int, int], str]] = {}
        uses: list[ToolUse] = []
        for i, m in enumerate(messages):
            if not (isinstance(m, dict) and isinstance(m.get("content"), list)):
                continue
            for j, b in enumerate(m["content"]):
                if not isinstance(b, dict):
                    continue
                if isinstance(b.get("toolUse"), dict):
                    tu = b["toolUse"]
                    calls[str(tu.get("toolUseId"))] = ((i, j), str(tu.get("name") or ""))
                elif isinstance(b.get("toolResult"), dict):
                    cid = str(b["toolResult"].get("toolUseId") or "")
                    where, name = calls.get(cid, (None, ""))
                    uses.append(ToolUse((i, j), where, name, cid, tokens(i, j)))
        return uses

    def results(self, m: dict[str, Any]) -> Iterator[tuple[int, str | None]]:
        content = m.get("content")
        for j, b in enumerate(content if isinstance(content, list) else []):
            if isinstance(b, dict) and isinstance(b.get("toolResult"), dict):
                yield j, self.result_text(m, j)

    def result_text(self, m: dict[str, Any], j: int) -> Any:
        items = m["content"][j]["toolResult"].get("content") or []
        texts = [_result_item_text(x) for x in items]
        if any(t is None for t in texts):
            return None  # results with images or documents are left whole
        return "\n".join(t for t in texts if t is not None)

    def placeholder(self, m: dict[str, Any], j: int, text: str) -> Any:
        tr = m["content"][j]["toolResult"]
        return {"toolResult": {**tr, "content": [{"text": text}]}}

    def call_input(self, m: dict[str, Any], k: int) -> Any:
        return m["content"][k]["toolUse"].get("input", {})

    def without_inputs(self, m: dict[str, Any], calls: set[int]) -> dict[str, Any]:
        m["content"] = [
            {**b, "toolUse": {**b["toolUse"], "input": {}}} if k in calls else b
            for k, b in enumerate(m["content"])
        ]
        return m


# -- signing -------------------------------------------------------------------------------------

#: the host of a regional Bedrock runtime endpoint, the region its group
_REGION = re.compile(r"^bedrock-runtime(?:-fips)?\.([a-z0-9-]+)\.amazonaws\.com$")

#: the signer of every Bedrock route (one credential chain per process)
SIGNER = SigV4Signer(
    "bedrock",
    _REGION,
    "use the regional Bedrock URL (https://bedrock-runtime.REGION.amazonaws.com)",
    "signing Bedrock requests needs botocore: install context-ceiling[bedrock]",
)


def _aws(headers: Mapping[str, str]) -> bool:
    """A SigV4 signature, or a Bedrock API key (long-term keys are ``ABSK...``, short-term
    ones ``bedrock-api-key-...``)."""
    auth = headers.get("authorization", "")
    if auth.startswith("AWS4-") or "x-amz-date" in headers or "x-amz-security-token" in headers:
        return True
    token = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
    return token.startswith(("ABSK", "bedrock-api-key-"))


#: AWS Bedrock's runtime API; AWS credentials go to no other upstream
API = ApiInfo(
    "bedrock",
    "AWS Bedrock's runtime (``https://bedrock-runtime.REGION.amazonaws.com``): the Converse "
    "API and Anthropic's models through InvokeModel; requests are signed again with the "
    "sidecar's own AWS credentials",
    "https://bedrock-runtime.us-east-1.amazonaws.com",
    owns=_aws,
    credentials="AWS credentials (a SigV4 signature or a Bedrock API key)",
    signer=SIGNER,
    key_env="AWS_BEARER_TOKEN_BEDROCK",
    prices="aws",
)


def ask(a: Ask) -> tuple[str, dict[str, Any]]:
    """A Converse request that asks ``a``: a shared haystack ends in a ``cachePoint`` block (the
    questions after the first read it from the prompt cache, on the models that have one); a
    thinking budget goes to Claude models as ``additionalModelRequestFields.thinking``, on top
    of ``maxTokens`` and without ``temperature``."""
    content: list[dict[str, Any]] = [{"text": a.user}]
    if a.shared:
        content = [
            {"text": a.user[: a.shared]},
            {"cachePoint": {"type": "default"}},
            {"text": a.user[a.shared :]},
        ]
    body: dict[str, Any] = {
        "messages": [{"role": "user", "content": content}],
        "inferenceConfig": {"maxTokens": a.max_tokens, "temperature": a.temperature},
    }
    if a.system:
        body["system"] = [{"text": a.system}]
    if a.thinking:
        budget = max(1024, a.thinking)
        body["inferenceConfig"] = {"maxTokens": a.max_tokens + budget}
        body["additionalModelRequestFields"] = {
            "thinking": {"type": "enabled", "budget_tokens": budget}
        }
    return f"/model/{quote(a.model, safe='')}/converse", body


def model_of(path: str) -> str:
    """``/model/{modelId}/{operation}`` -> the model id (an ARN's escapes undone)."""
    rest = path.removeprefix("/model/")
    return unquote(rest.rsplit("/", 1)[0]) if rest != path and "/" in rest else ""


#: Bedrock's other runtime routes (passed through, signed): first path segment -> ``route``
PASSTHROUGH_ROUTES = MappingProxyType(
    {"model": "model", "async-invoke": "async_invoke", "guardrail": "guardrail"}
)

CONVERSE = Format(
    shape="converse",
    api="bedrock",
    ask=ask,
    count=count,
    trim=ConverseRules(),
    requested_output=requested_output,
    body_usage=body_usage,
    tap=lambda _changed: ConverseStreamTap(),
    expect=expect,
    read_answer=read_answer,
    prompt=prompt,
    error_body=error_body,
    too_long=too_long,
    stream_suffix="/converse-stream",
    framing=EventStreamFraming(_converse_event),
    error_headers=error_headers,
    passthrough_routes=PASSTHROUGH_ROUTES,
    client_paths=("/model/", "/async-invoke", "/guardrail/"),
)

#: Anthropic messages on InvokeModel: Anthropic's count, trimming and answers; Bedrock's
#: errors and stream framing, and no Anthropic-only context management
INVOKE = dataclasses.replace(
    anthropic.FORMAT,
    api="bedrock",
    ask=None,
    tap=lambda _changed: InvokeStreamTap(),
    error_body=error_body,
    error_headers=error_headers,
    too_long=too_long,
    stream_suffix="/invoke-with-response-stream",
    framing=EventStreamFraming(_chunk_event),
    native=None,
    betas_header=None,
    passthrough_routes={},
    client_headers=(),
)

# -- CountTokens ------------------------------------------------------------------------------------


def _count_tokens_input(body: Mapping[str, Any]) -> tuple[str, Mapping[str, Any]]:
    """CountTokens' ``input``: a Converse request (``converse``) or an InvokeModel body
    (``invokeModel.body``, a blob: base64 in the JSON botocore sends), as (kind, body)."""
    inp = body.get("input")
    if isinstance(inp, Mapping) and isinstance(inp.get("converse"), Mapping):
        return "converse", inp["converse"]
    if isinstance(inp, Mapping) and isinstance(inp.get("invokeModel"), Mapping):
        raw = inp["invokeModel"].get("body")
        try:
            decoded = orjson.loads(base64.b64decode(raw, validate=True))
        except (TypeError, ValueError, binascii.Error, orjson.JSONDecodeError):
            raise RequestShapeError(
                "input.invokeModel.body must be the model's JSON request, base64-encoded"
            ) from None
        if not isinstance(decoded, Mapping):
            raise RequestShapeError("input.invokeModel.body must be a JSON object")
        return "invoke", decoded
    raise RequestShapeError("'input' must hold 'converse' or 'invokeModel'")


def count_tokens(
    body: Mapping[str, Any],
    counter: TextCounter,
    fmt: ChatFormat | None = None,
    chunks: re.Pattern[str] | None = None,
    prior: Prior | None = None,
    memo: CountCache | None = None,
) -> RequestCount:
    """A CountTokens request counted as the request it asks about: a Converse body as Converse
    counts it, an InvokeModel body of Anthropic's messages as Anthropic's are; another family's
    InvokeModel body by its text (its schema is the family's own)."""
    kind, inner = _count_tokens_input(body)
    if kind == "converse":
        return count(inner, counter, fmt, chunks, prior, memo)
    if isinstance(inner.get("messages"), list):
        return anthropic.count(inner, counter, fmt, chunks, prior, memo)
    text = orjson.dumps(inner).decode()
    as_converse = {"messages": [{"role": "user", "content": [{"text": text}]}]}
    return count(as_converse, counter, fmt, chunks, prior, memo)


def count_tokens_usage(body: bytes) -> Usage:
    """CountTokens' answer: ``inputTokens``, the provider's exact count of the input."""
    u = Usage()
    obj = load_json(body)
    if isinstance(obj, dict) and isinstance(obj.get("inputTokens"), int):
        u.input_tokens = obj["inputTokens"]
    return u


#: CountTokens (``/model/{modelId}/count-tokens``): counted, never trimmed or answered: the
#: provider's count beside the sidecar's is the estimate error, per model
COUNT_TOKENS = dataclasses.replace(
    CONVERSE,
    count=count_tokens,
    requested_output=lambda _body: None,
    body_usage=count_tokens_usage,
    stream_suffix=None,
)

#: the decoded path: a model ARN's ``/`` is part of the model id
_MODEL = r"^/model/.+"
#: InvokeModel on Anthropic's models only (other families' bodies pass through): a model id or
#: inference profile naming ``anthropic.``
_ANTHROPIC = r"^/model/.*anthropic\..*"


#: AWS Bedrock's runtime: every route's path and query signed as sent
BEDROCK = Provider("aws.bedrock")


def _route(
    fmt: Format, metric_api: str, path: str, pattern: str, count_only: bool = False
) -> Route:
    """A Bedrock runtime route: the model in the path (it wins over the body's), path and query
    sent as they came (the signature covers them)."""
    return Route(
        fmt,
        metric_api,
        path,
        pattern=re.compile(pattern),
        provider=BEDROCK,
        path_model=model_of,
        path_model_first=True,
        count_only=count_only,
    )


ROUTES = (
    _route(
        CONVERSE,
        "bedrock_converse",
        "/model/{modelId}/converse",
        _MODEL + r"/converse(?:-stream)?$",
    ),
    _route(
        INVOKE,
        "bedrock_invoke",
        "/model/anthropic.{model}/invoke",
        _ANTHROPIC + r"/invoke(?:-with-response-stream)?$",
    ),
    _route(
        COUNT_TOKENS,
        "bedrock_count_tokens",
        "/model/{modelId}/count-tokens",
        _MODEL + r"/count-tokens$",
        count_only=True,
    ),
)
