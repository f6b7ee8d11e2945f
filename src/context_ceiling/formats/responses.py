"""The OpenAI Responses API (``/v1/responses`` and ``/v1/responses/input_tokens``; on Azure
OpenAI too, see :mod:`context_ceiling.formats.azure`): ``instructions`` and ``input`` items
(messages, function calls and their outputs, reasoning, compaction) instead of messages, and
OpenAI's error body."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Mapping
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
    walk_items,
)
from context_ceiling.core.images import openai_image_tokens, size_from_data_url
from context_ceiling.core.models import ChatFormat
from context_ceiling.core.shape_checks import (
    RequestShapeError,
    check_depth_around,
    optional_type,
    require_type,
)
from context_ceiling.core.tokenizers import CountCache, TextCounter
from context_ceiling.core.trim import Policy
from context_ceiling.core.trim_rules import ToolUse, TrimRules
from context_ceiling.core.utilization import Component
from context_ceiling.formats.base import (
    Answer,
    Expect,
    Format,
    Native,
    Prompt,
    Route,
    StreamTap,
    Usage,
    event_data,
    expectation,
    int_of,
    latest,
    load_json,
    output_cap,
    text_of,
)
from context_ceiling.formats.openai_chat import (
    count_tools,
    error_body,
    too_long,
    tools_offered,
    usage_of,
)

__all__ = [
    "FORMAT",
    "ROUTES",
    "ResponsesRules",
    "ResponsesStreamTap",
    "body_usage",
    "check_item",
    "check_top",
    "compaction_tokens",
    "count",
    "count_usage",
    "expect",
    "items_of",
    "native",
    "prompt",
    "read_answer",
    "requested_output",
]

# -- shape ---------------------------------------------------------------------------------------


def check_top(body: Mapping[str, Any]) -> None:
    """Everything of a Responses body but its input items' insides."""
    check_depth_around(body, "input")
    optional_type(body, "instructions", str, "'instructions'", "a string")
    if body.get("tools") is not None:
        require_type(body["tools"], list, "'tools'", "an array")
        for k, t in enumerate(body["tools"]):
            require_type(t, dict, f"tools[{k}]", "an object")
    items = body.get("input")
    if items is None or isinstance(items, str):
        return
    require_type(items, list, "'input'", "a string or an array of items")


def check_item(i: int, it: Any) -> None:
    """One Responses input item (``input[i]``)."""
    w = f"input[{i}]"
    require_type(it, dict, w, "an object")
    optional_type(it, "type", str, w, "a string")
    optional_type(it, "role", str, w, "a string")
    kind = it.get("type") or "message"  # as the count reads it: an untyped item is a message
    if kind == "message":
        content = it.get("content")
        if isinstance(content, list):
            for j, part in enumerate(content):
                pw = f"{w}.content[{j}]"
                require_type(part, dict, pw, "an object")
                optional_type(part, "type", str, pw, "a string")
                optional_type(part, "text", str, pw, "a string")
                optional_type(part, "image_url", str, pw, "a string")
                optional_type(part, "detail", str, pw, "a string")
        elif content is not None and not isinstance(content, str):
            raise RequestShapeError(f"{w}.content must be a string or an array")
    elif kind == "function_call":
        optional_type(it, "name", str, w, "a string")
        optional_type(it, "arguments", str, w, "a string")
    elif kind == "function_call_output":
        out = it.get("output")
        if isinstance(out, list):
            for j, part in enumerate(out):
                require_type(part, dict, f"{w}.output[{j}]", "an object")
        elif out is not None and not isinstance(out, str):
            raise RequestShapeError(f"{w}.output must be a string or an array")


# -- count ---------------------------------------------------------------------------------------


def compaction_tokens(item: Mapping[str, Any]) -> int:
    """A Responses ``compaction`` item's tokens, an estimate: its ``encrypted_content`` is opaque
    (base64 of an encrypted summary), so its decoded bytes at four bytes a token; the provider's
    reported usage is what the estimate-error metric compares it with."""
    enc = item.get("encrypted_content")
    return 8 + (len(enc) * 3 // 4 // 4 if isinstance(enc, str) else 0)


def items_of(body: Mapping[str, Any]) -> list[Any]:
    """``input`` as a list of items (a string input is one user message)."""
    items = body.get("input")
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    return list(items) if isinstance(items, list) else []


def count(
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
    check = check_item if prior is None else None
    if check is not None:  # a body derived from a checked one has its shape
        check_top(body)
    fmt = fmt or ChatFormat()
    tally = Tally(counter, prior)
    count = counter.count
    instructions = body.get("instructions")
    if isinstance(instructions, str):
        tally.add(-1, -1, Component.SYSTEM, count(instructions))
    count_tools(tally, body.get("tools") or [])
    items = items_of(body)
    last_user = max(
        (i for i, it in enumerate(items) if isinstance(it, dict) and it.get("role") == "user"),
        default=-1,
    )
    ctx = count_context("responses", counter, fmt, chunks)

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
    walk_items(tally, memo, prior, ctx, items, marks, fmt, chunks, check, classify, _item)
    tally.add(-1, -1, Component.LATEST_USER, fmt.reply_priming)
    result = tally.result()
    result.partial = bool(body.get("previous_response_id") or body.get("conversation"))
    return result


def _item(
    tally: Tally,
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
                    tally.add(i, j, Component.RETRIEVED, count(json_text(part)))
                else:
                    tally.add(i, j, comp, count(json_text(part)))
    elif kind == "function_call":
        name, arguments = str(it.get("name") or ""), str(it.get("arguments") or "")
        tally.add(i, -1, Component.HISTORY, call_tokens(name, arguments, count))
    elif kind == "function_call_output":
        out = it.get("output")
        text = out if isinstance(out, str) else json_text(out)
        tally.add(i, -1, Component.TOOL_RESULTS, TOOL_FRAME + count(text))
    elif kind == "compaction":
        tally.add(i, -1, Component.HISTORY, compaction_tokens(it))
    elif kind == "reasoning" and earlier:
        # an earlier turn's reasoning: the API drops it from the context (only the
        # reasoning of the turn in progress, between its calls, is carried)
        tally.add(i, -1, Component.HISTORY, 0)
    else:  # reasoning, item references, tool calls of built-in tools: their JSON
        tally.add(i, -1, Component.HISTORY, count(json_text(it)))


def requested_output(body: Mapping[str, Any]) -> int | None:
    """``max_output_tokens``."""
    return output_cap(body.get("max_output_tokens"))


# -- usage ---------------------------------------------------------------------------------------


def _compactions(u: Usage, output: Any) -> None:
    """The Responses API's compaction items in a response's output."""
    if isinstance(output, list):
        u.native_edits += sum(
            1 for o in output if isinstance(o, dict) and o.get("type") == "compaction"
        )


#: the statuses of a response that has stopped (queued and in_progress have not: a background
#: create answers with one of those, and has no finish reason yet)
ENDED = frozenset({"completed", "incomplete", "failed", "cancelled"})


def _usage(u: Usage, obj: Any) -> None:
    """A Responses API ``response`` object: usage, model, and why it stopped."""
    if not isinstance(obj, dict):
        return
    usage_of(u, obj.get("usage"), "input_tokens", "output_tokens")
    if isinstance(obj.get("model"), str):
        u.response_model = obj["model"]
    _compactions(u, obj.get("output"))
    status = obj.get("status")
    incomplete = obj.get("incomplete_details")
    if isinstance(incomplete, dict) and isinstance(incomplete.get("reason"), str):
        u.finish_reason = incomplete["reason"]
    elif status in ENDED:
        u.finish_reason = status  # a background create answers queued: it has not stopped yet


def body_usage(body: bytes) -> Usage:
    """A ``response`` object: usage, model, why it stopped, compactions."""
    u = Usage()
    _usage(u, load_json(body))
    return u


def count_usage(body: bytes) -> Usage:
    """``POST /v1/responses/input_tokens``: ``{"object": "response.input_tokens",
    "input_tokens": N}``."""
    u = Usage()
    obj = load_json(body)
    if isinstance(obj, dict):
        u.input_tokens = int_of(obj.get("input_tokens"))
    return u


class ResponsesStreamTap(StreamTap):
    """Reads usage from the Responses API's ``response.completed`` (or ``.incomplete``) event;
    forwards every event unchanged. ``response.failed`` and ``error`` are the upstream's own
    failure."""

    __slots__ = ()

    @staticmethod
    def error_event(message: str) -> bytes:
        """The Responses API's mid-stream failure: ``event: error`` whose data is an ``error``
        event (``code``, ``message``), carrying the ``error`` object the SDK raises on too."""
        err = {
            "type": "error",
            "code": "stream_failed",
            "message": message,
            "param": None,
            "error": {"message": message, "type": "server_error", "code": "stream_failed"},
        }
        return b"event: error\ndata: " + orjson.dumps(err) + b"\n\n"

    marks = (b"response.completed", b"response.incomplete", b"response.failed", b"error")

    def on_event(self, event: bytes) -> bytes | None:
        if (
            b"response.completed" not in event
            and b"response.incomplete" not in event
            and (b"response.failed" not in event and b"error" not in event[:32])
        ):
            return event
        name, data = event_data(event)
        if name in (b"response.completed", b"response.incomplete"):
            self.complete = True
            try:
                obj = orjson.loads(data)
            except orjson.JSONDecodeError:
                return event
            if isinstance(obj, dict):
                _usage(self.usage, obj.get("response"))
        elif name in (b"response.failed", b"error"):
            self.upstream_error = True
        return event


# -- the answer ----------------------------------------------------------------------------------


def expect(obj: Mapping[str, Any]) -> Expect:
    """What a Responses request asks its answer to be (``text.format``, ``tools``)."""
    text = obj.get("text")
    fmt = text.get("format") if isinstance(text, Mapping) else None
    json_, schema = False, None
    if isinstance(fmt, Mapping):
        json_ = fmt.get("type") in ("json_object", "json_schema")
        schema = fmt.get("schema")
    return expectation(json_, schema, tools_offered(obj.get("tools"), None))


def _response(a: Answer, r: Mapping[str, Any]) -> None:
    text: list[str] = []
    for item in r.get("output") or ():
        if not isinstance(item, Mapping):
            continue
        if item.get("type") == "message":
            for c in item.get("content") or ():
                if not isinstance(c, Mapping):
                    continue
                if c.get("type") == "output_text" and isinstance(c.get("text"), str):
                    text.append(c["text"])
                elif c.get("type") == "refusal":
                    a.refusal = True
        elif item.get("type") in ("function_call", "custom_tool_call"):
            args = item.get("arguments", item.get("input"))
            a.tool_calls.append(
                (str(item.get("name") or ""), args if isinstance(args, str) else "")
            )
    a.text = "".join(text)
    incomplete = r.get("incomplete_details")
    if isinstance(incomplete, Mapping) and isinstance(incomplete.get("reason"), str):
        a.finish = incomplete["reason"]
    elif isinstance(r.get("status"), str):
        a.finish = r["status"]


def read_answer(objs: Iterable[Any], stream: bool) -> Answer:
    """A ``response`` object, or a stream's events (the final one carries the whole response;
    the text deltas stand in when it does not)."""
    a = Answer()
    deltas: list[str] = []
    final = False
    for o in objs:
        if not isinstance(o, Mapping):
            continue
        if not stream:
            _response(a, o)
            return a
        kind = o.get("type")
        if kind in ("response.completed", "response.incomplete") and isinstance(
            o.get("response"), Mapping
        ):
            _response(a, o["response"])  # the whole response, as the stream ends
            a.finish = a.finish or kind.removeprefix("response.")  # its status, when it has none
            final = True
        elif kind == "response.output_text.delta" and isinstance(o.get("delta"), str):
            deltas.append(o["delta"])
        elif kind == "response.refusal.delta":
            a.refusal = True
    if not final or (not a.text and deltas):  # no final event, or one without its output
        a.text = "".join(deltas)
    return a


def prompt(body: Mapping[str, Any]) -> Prompt:
    """``instructions``, the input (a string, or its latest user message), the tools."""
    ins = body.get("instructions")
    inp = body.get("input")
    user = inp if isinstance(inp, str) else text_of(latest(inp, ("user",)))
    return Prompt(ins if isinstance(ins, str) else "", user, body.get("tools"))


# -- trimming ------------------------------------------------------------------------------------


class ResponsesRules(TrimRules):
    """The input items play the part of messages (a string input is one user message): tool
    results are ``function_call_output`` items answering ``function_call`` items, a reply is
    the assistant's message with its reasoning and calls (items of their own), and everything
    before the latest ``compaction`` item may go (OpenAI's guide: the compaction carries what
    it said)."""

    items_key = "input"
    #: a ``function_call_output``'s part is its text and the item's 3 framing tokens
    result_frame = 3
    drops_before_compaction = True

    def items(self, body: Mapping[str, Any]) -> list[Any]:
        return items_of(body)

    def with_items(self, out: dict[str, Any], items: list[Any], body: Mapping[str, Any]) -> None:
        single = isinstance(body.get("input"), str) and len(items) == 1
        out["input"] = items[0]["content"] if single else items

    def is_result(self, m: dict[str, Any]) -> bool:
        return m.get("type") == "function_call_output"

    def starts_turn(self, m: Any) -> bool:
        # function calls, their outputs and reasoning have no role
        return (
            isinstance(m, dict) and m.get("role") == "user" and m.get("type") in (None, "message")
        )

    def is_reply(self, m: dict[str, Any]) -> bool:
        return m.get("role") == "assistant" or m.get("type") in ("function_call", "reasoning")

    def reply_start(self, messages: list[Any], i: int) -> int:
        while i > 0 and _is_call_item(messages[i - 1]):
            i -= 1  # a reply's reasoning and calls are items of their own
        return i

    def tool_uses(self, messages: list[Any], tokens: Callable[[int, int], int]) -> list[ToolUse]:
        calls: dict[str, tuple[tuple[int, int], str]] = {}
        uses: list[ToolUse] = []
        for i, m in enumerate(messages):
            if not isinstance(m, dict):
                continue
            if m.get("type") == "function_call":
                calls[str(m.get("call_id"))] = ((i, -1), str(m.get("name", "")))
            elif m.get("type") == "function_call_output":
                cid = str(m.get("call_id") or "")
                where, name = calls.get(cid, (None, ""))
                uses.append(ToolUse((i, -1), where, name, cid, tokens(i, -1)))
        return uses

    def results(self, m: dict[str, Any]) -> Iterator[tuple[int, str | None]]:
        if m.get("type") == "function_call_output":
            out = m.get("output")
            yield -1, out if isinstance(out, str) else None

    def result_text(self, m: dict[str, Any], j: int) -> Any:
        return m.get("output")

    def call_input(self, m: dict[str, Any], k: int) -> Any:
        return str(m.get("arguments") or "")

    def without_inputs(self, m: dict[str, Any], calls: set[int]) -> dict[str, Any]:
        m["arguments"] = "{}"
        return m


def _is_call_item(m: Any) -> bool:
    return isinstance(m, dict) and (
        m.get("type") in ("function_call", "reasoning")
        or (m.get("type") == "message" and m.get("role") == "assistant")
    )


def _provider(_path: str) -> str:
    return "openai"


def native(ceiling: int, _policy: Policy) -> list[Any]:
    """Server-side compaction, triggered at the ceiling."""
    return [{"type": "compaction", "compact_threshold": ceiling}]


FORMAT = Format(
    shape="responses",
    api="openai",
    count=count,
    trim=ResponsesRules(),
    requested_output=requested_output,
    body_usage=body_usage,
    tap=lambda _changed: ResponsesStreamTap(),
    expect=expect,
    read_answer=read_answer,
    prompt=prompt,
    error_body=error_body,
    too_long=too_long,
    provider=_provider,
    native=Native(native, ("api.openai.com", ".openai.azure.com")),
)

ROUTES = (
    Route(FORMAT, "openai_responses", "/responses", paths=("/v1/responses",)),
    Route(
        FORMAT,
        "openai_responses_input_tokens",
        "/responses/input_tokens",
        paths=("/v1/responses/input_tokens",),
        count_only=True,
        usage=count_usage,
    ),
)
