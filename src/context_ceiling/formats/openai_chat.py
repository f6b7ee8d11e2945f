"""OpenAI chat completions (``/v1/chat/completions``; Azure OpenAI serves the same format,
see :mod:`context_ceiling.formats.azure`): the shape checks, the count, the usage and the stream
tap, what a request asks of its answer and how an answer reads, the capture's view of a request,
the error body and the trimmer's rules."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from types import MappingProxyType
from typing import Any

import orjson

from context_ceiling.core.counting import (
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
from context_ceiling.core.images import openai_image_tokens, size_from_data_url
from context_ceiling.core.models import ChatFormat
from context_ceiling.core.shape_checks import (
    RequestShapeError,
    check_depth_around,
    messages_of,
    optional_type,
    require_type,
)
from context_ceiling.core.tokenizers import CountCache, TextCounter
from context_ceiling.core.trim_rules import ToolUse, TrimRules, block_texts
from context_ceiling.core.utilization import Component
from context_ceiling.formats.base import (
    Answer,
    ApiInfo,
    Ask,
    Expect,
    Format,
    Prompt,
    Route,
    StreamTap,
    Tools,
    Usage,
    as_mapping,
    earliest,
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
    "FORMAT",
    "PASSTHROUGH_ROUTES",
    "ROUTES",
    "ChatRules",
    "ChatStreamTap",
    "ask",
    "body_usage",
    "check_message",
    "check_top",
    "count",
    "count_tools",
    "error_body",
    "expect",
    "prepare_stream",
    "prompt",
    "read_answer",
    "requested_output",
    "too_long",
    "tools_offered",
    "usage_of",
]

# -- shape ---------------------------------------------------------------------------------------


def check_top(body: Mapping[str, Any]) -> None:
    """Everything of a chat completions body but its messages' insides."""
    check_depth_around(body, "messages")
    messages_of(body)
    for key in ("tools", "functions"):
        if body.get(key) is not None:
            require_type(body[key], list, f"'{key}'", "an array")
            for k, t in enumerate(body[key]):
                require_type(t, dict, f"{key}[{k}]", "an object")
    optional_type(body, "stream_options", dict, "'stream_options'", "an object")


def check_message(i: int, m: Any) -> None:
    """One chat completions message (``messages[i]``)."""
    w = f"messages[{i}]"
    require_type(m, dict, w, "an object")
    if m.get("role") is None:
        raise RequestShapeError(f"{w}.role is required")
    require_type(m["role"], str, f"{w}.role", "a string")
    optional_type(m, "name", str, w, "a string")
    content = m.get("content")
    if isinstance(content, list):
        for j, part in enumerate(content):
            pw = f"{w}.content[{j}]"
            require_type(part, dict, pw, "an object")
            optional_type(part, "type", str, pw, "a string")
            kind = part.get("type")
            if kind in ("text", "input_text"):
                optional_type(part, "text", str, pw, "a string")
            elif kind == "refusal":
                optional_type(part, "refusal", str, pw, "a string")
            elif kind == "image_url":
                img = part.get("image_url")
                if isinstance(img, dict):
                    require_type(img.get("url"), str, f"{pw}.image_url.url", "a string")
                    optional_type(img, "detail", str, f"{pw}.image_url", "a string")
                else:
                    require_type(img, str, f"{pw}.image_url", "an object with a url")
            elif kind == "file":
                optional_type(part, "file", dict, pw, "an object")
    elif content is not None and not isinstance(content, str):
        raise RequestShapeError(f"{w}.content must be a string, an array or null")
    if m.get("tool_calls") is not None:
        require_type(m["tool_calls"], list, f"{w}.tool_calls", "an array")
        for k, call in enumerate(m["tool_calls"]):
            cw = f"{w}.tool_calls[{k}]"
            require_type(call, dict, cw, "an object")
            optional_type(call, "function", dict, cw, "an object")
            fn = call.get("function") or {}
            optional_type(fn, "name", str, f"{cw}.function", "a string")
            optional_type(fn, "arguments", str, f"{cw}.function", "a string")
    if m.get("function_call") is not None:
        require_type(m["function_call"], dict, f"{w}.function_call", "an object")


# -- count ---------------------------------------------------------------------------------------


def count_tools(tally: Tally, tools: Iterable[Any]) -> None:
    """Function tool definitions: their JSON and a few tokens of framing each (the Responses
    API declares them the same way)."""
    for i, tool in enumerate(tools):
        fn = tool.get("function", tool) if isinstance(tool, dict) else tool
        tally.add(-1, i, Component.TOOL_DEFINITIONS, tally.counter.count(json_text(fn)) + 8)


def count(
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
    check = check_message if prior is None else None
    if check is not None:  # a body derived from a checked one has its shape
        check_top(body)
    fmt = fmt or ChatFormat()
    messages = require_messages(body)
    tally = Tally(counter, prior)
    tools = body.get("tools") or body.get("functions") or []
    if not isinstance(tools, list):
        raise RequestShapeError("'tools' must be an array")
    count_tools(tally, tools)
    last_user = last_index(messages, "user")
    ctx = count_context("openai", counter, fmt, chunks)

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
    has_system = walk_items(
        tally, memo, prior, ctx, messages, marks, fmt, chunks, check, classify, _message
    )
    if not has_system and fmt.default_system:
        tally.add(-1, -1, Component.SYSTEM, fmt.default_system)
    tally.add(-1, -1, Component.LATEST_USER, fmt.reply_priming)
    return tally.result()


def _message(
    tally: Tally,
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
                tally.add(i, j, Component.RETRIEVED, count(json_text(part.get("file", {}))))
    elif content is not None:
        raise RequestShapeError(f"messages[{i}].content must be a string, an array or null")
    for k, call in enumerate(msg.get("tool_calls") or []):
        fn = (call.get("function") or {}) if isinstance(call, dict) else {}
        name, arguments = str(fn.get("name", "")), str(fn.get("arguments", ""))
        tally.add(i, 1000 + k, comp, call_tokens(name, arguments, count))
    if isinstance(msg.get("function_call"), dict):
        fc = msg["function_call"]
        name, arguments = str(fc.get("name", "")), str(fc.get("arguments", ""))
        tally.add(i, 999, comp, call_tokens(name, arguments, count))


def requested_output(body: Mapping[str, Any]) -> int | None:
    """``max_completion_tokens`` (or the older ``max_tokens``)."""
    return output_cap(body.get("max_completion_tokens")) or output_cap(body.get("max_tokens"))


# -- usage ---------------------------------------------------------------------------------------


def usage_of(u: Usage, usage: Any, input_key: str, output_key: str) -> None:
    """An OpenAI usage object (chat: ``prompt_tokens``/``completion_tokens``; the Responses API:
    ``input_tokens``/``output_tokens``), the cached tokens in the input's details and the
    reasoning tokens in the output's."""
    if isinstance(usage, dict):
        u.input_tokens = int_of(usage.get(input_key))
        u.output_tokens = int_of(usage.get(output_key))
        details = usage.get(input_key + "_details")
        if isinstance(details, dict):
            u.cached_tokens = int_of(details.get("cached_tokens"))
        out = usage.get(output_key + "_details")
        if isinstance(out, dict):
            u.reasoning_tokens = int_of(out.get("reasoning_tokens"))


def _usage(u: Usage, usage: Any) -> None:
    usage_of(u, usage, "prompt_tokens", "completion_tokens")


def body_usage(body: bytes) -> Usage:
    u = Usage()
    obj = load_json(body)
    if isinstance(obj, dict):
        _usage(u, obj.get("usage"))
        u.response_model = obj.get("model") if isinstance(obj.get("model"), str) else None
        choices = obj.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            u.finish_reason = choices[0].get("finish_reason")
    return u


_JSON_SPACE = b" \t\r\n"


def prepare_stream(obj: dict[str, Any], body: bytes | None) -> tuple[bytes | None, bool]:
    """An OpenAI chat stream's request with ``stream_options.include_usage`` set, so that the
    stream ends with the provider's own token counts: (the bytes to send, None to serialize
    ``obj``; whether the option was added, which the stream tap then hides from the client).

    When ``body`` is still the client's bytes and they carry no ``stream_options`` at all (the
    usual case), the option is spliced in as the object's first member and every other byte
    goes upstream as the client sent it: re-serializing the parsed body instead costs a
    measurable share of a long request's CPU (benchmarks/RESULTS.md)."""
    opts = obj.get("stream_options")
    if isinstance(opts, dict) and opts.get("include_usage"):
        return body, False
    absent = "stream_options" not in obj
    obj["stream_options"] = {**(opts if isinstance(opts, dict) else {}), "include_usage": True}
    if body is None or not absent:
        return None, True
    start = body.index(b"{") + 1  # ``obj`` parsed from it: a JSON object, blanks before it
    end = start
    while end < len(body) and body[end] in _JSON_SPACE:
        end += 1
    member = b'"stream_options":{"include_usage":true}' + (
        b"" if body[end : end + 1] == b"}" else b","
    )
    return b"".join((body[:start], member, memoryview(body)[start:])), True


def _set_at(chunk: bytes, key: bytes, opens: bytes) -> int:
    """Where ``key`` is first set in ``chunk`` (its value ``opens`` a string or an object, not
    ``null``), -1 when every ``key`` is followed by ``null`` (as OpenAI and most servers space
    it): a few substring counts, each a C scan, where a regex would try a match at every quote
    of the JSON (JSON-escaped text cannot hold the key's quotes). An odd spacing counts from the
    key's first mention on, and only costs a parse."""
    n = chunk.count(key)
    unset = chunk.count(key + b":null") + chunk.count(key + b": null")
    if n == 0 or n == unset:
        return -1
    forms = (key + b":" + opens, key + b": " + opens)
    if n - unset != sum(chunk.count(f) for f in forms):
        return chunk.find(key)  # some are spaced otherwise: the first could be any
    return earliest(chunk.find(f) for f in forms)


class ChatStreamTap(StreamTap):
    """Reads usage from chat.completion.chunk events.

    When the sidecar injected ``stream_options.include_usage`` the client did not ask for it, so
    the extra usage-only chunk is dropped and the ``"usage":null`` field the option adds to every
    other chunk is removed again: the client sees the stream it would have seen without us."""

    __slots__ = ("injected",)

    def __init__(self, injected: bool) -> None:
        super().__init__()  # complete: saw ``data: [DONE]``, the end of a whole stream
        self.injected = injected

    @staticmethod
    def error_event(message: str) -> bytes:
        """What the OpenAI SDK raises on: an event whose data is an ``error`` object."""
        err = {"error": {"message": message, "type": "server_error", "code": "stream_failed"}}
        return b"data: " + orjson.dumps(err) + b"\n\n"

    def _worth_parsing(self, event: bytes) -> bool:
        # Most chunks carry one content delta and nothing we record; a byte scan decides whether
        # to parse (JSON-escaped text cannot contain the raw key bytes, so a key is never missed;
        # an odd spacing only costs a parse).
        if self.usage.response_model is None:
            return True
        if b'"usage"' in event and b'"usage":null' not in event and b'"usage": null' not in event:
            return True
        if b'"finish_reason"' in event:
            return (
                b'"finish_reason":"' in event
                or b'"finish_reason": "' in event
                or (b'"finish_reason":null' not in event and b'"finish_reason": null' not in event)
            )
        return False

    whole_reads = True

    def needed(self, chunk: bytes) -> int:
        # read: the first event until the model is known; the end, an error, and a usage or
        # finish reason that is not null (a few C scans, where a regex would try a match at
        # every quote of the JSON)
        if self.usage.response_model is None:
            return 0
        return earliest(
            (
                chunk.find(b"[DONE]"),
                chunk.find(b'"error"'),
                _set_at(chunk, b'"usage"', b"{"),
                _set_at(chunk, b'"finish_reason"', b'"'),
            )
        )

    def plain(self, chunk: bytes) -> bytes:
        return self._as_sent(chunk)

    def on_event(self, event: bytes) -> bytes | None:
        """The bytes to forward for this event (None: drop it)."""
        if b"[DONE]" in event and event_data(event)[1] == b"[DONE]":
            self.complete = True
            return event
        if b'"error"' in event:
            self.upstream_error = True
        if not self._worth_parsing(event):
            return self._as_sent(event)
        _, data = event_data(event)
        if not data or data[:1] != b"{":
            return event
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            return event
        if not isinstance(obj, dict):
            return event
        u = self.usage
        if u.response_model is None and isinstance(obj.get("model"), str):
            u.response_model = obj["model"]
        choices = obj.get("choices")
        if isinstance(choices, list):
            for c in choices:
                if isinstance(c, dict) and c.get("finish_reason"):
                    u.finish_reason = c["finish_reason"]
        usage = obj.get("usage")
        if usage:
            _usage(u, usage)
            if self.injected and not choices:
                return None
        return self._as_sent(event)

    def _as_sent(self, event: bytes) -> bytes:
        """The event as the upstream would have sent it without our ``include_usage``."""
        if self.injected:
            return event.replace(b',"usage":null', b"").replace(b', "usage": null', b"")
        return event


# -- the answer ----------------------------------------------------------------------------------


def tools_offered(tools: Any, functions: Any) -> Tools | None:
    """The function and custom tools a request offers (chat completions and the Responses
    API declare them alike; ``functions``: the legacy field)."""
    if not isinstance(tools, list) and not isinstance(functions, list):
        return None
    named: dict[str, Any] = {}
    free: set[str] = set()
    for t in tools if isinstance(tools, list) else []:
        if not isinstance(t, Mapping):
            continue
        fn = t.get("function")
        if (
            t.get("type") == "function"
            and isinstance(fn, Mapping)
            and isinstance(fn.get("name"), str)
        ):
            named[fn["name"]] = as_mapping(fn.get("parameters"))
        elif t.get("type") == "function" and isinstance(t.get("name"), str):  # Responses API
            named[t["name"]] = as_mapping(t.get("parameters"))
        elif t.get("type") == "custom":  # free-form input
            custom = t.get("custom")
            c: Mapping[str, Any] = custom if isinstance(custom, Mapping) else t
            if isinstance(c.get("name"), str):
                named[c["name"]] = None
                free.add(c["name"])
    for f in functions if isinstance(functions, list) else []:  # legacy ``functions``
        if isinstance(f, Mapping) and isinstance(f.get("name"), str):
            named[f["name"]] = as_mapping(f.get("parameters"))
    return named, free


def expect(obj: Mapping[str, Any]) -> Expect:
    """What a chat completions request asks its answer to be."""
    rf = obj.get("response_format")
    json_, schema = False, None
    if isinstance(rf, Mapping):
        json_ = rf.get("type") in ("json_object", "json_schema")
        js = rf.get("json_schema")
        schema = js.get("schema") if isinstance(js, Mapping) else None
    return expectation(json_, schema, tools_offered(obj.get("tools"), obj.get("functions")))


def _calls(msg: Mapping[str, Any], stream: bool, calls: dict[int, list[Any]]) -> None:
    """A message's (or a delta's) tool calls into ``calls``: index -> [name, argument
    pieces...]. A stream's pieces join by index; a piece without one is a call of its own."""
    for i, tc in enumerate(msg.get("tool_calls") or ()):
        if not isinstance(tc, Mapping):
            continue
        fn = tc.get("function") if isinstance(tc.get("function"), Mapping) else tc.get("custom")
        if not isinstance(fn, Mapping):
            continue
        at = int_of(tc.get("index")) if stream else i
        slot = calls.setdefault(at if at is not None else -2 - len(calls), [None])
        if isinstance(fn.get("name"), str):
            slot[0] = fn["name"]
        args = fn.get("arguments", fn.get("input"))
        if isinstance(args, str):
            slot.append(args)
    fc = msg.get("function_call")  # legacy
    if isinstance(fc, Mapping):
        slot = calls.setdefault(-1, [None])
        if isinstance(fc.get("name"), str):
            slot[0] = fc["name"]
        if isinstance(fc.get("arguments"), str):
            slot.append(fc["arguments"])


def read_answer(objs: Iterable[Any], stream: bool) -> Answer:
    """The first choice of a chat completion, or of its chunks."""
    a = Answer()
    text: list[str] = []
    calls: dict[int, list[Any]] = {}
    for o in objs:
        if not isinstance(o, Mapping):
            continue
        for c in o.get("choices") or ():
            if not isinstance(c, Mapping) or c.get("index", 0) != 0:
                continue  # the first choice is the answer (n > 1: the others are alternatives)
            if c.get("finish_reason"):
                a.finish = str(c["finish_reason"])
            msg = c.get("delta" if stream else "message")
            if not isinstance(msg, Mapping):
                continue
            if isinstance(msg.get("content"), str):
                text.append(msg["content"])
            if msg.get("refusal"):
                a.refusal = True
            _calls(msg, stream, calls)
    a.text = "".join(text)
    a.tool_calls = [(s[0] or "", "".join(s[1:])) for _, s in sorted(calls.items())]
    return a


def prompt(body: Mapping[str, Any]) -> Prompt:
    """System and developer messages, the latest user message, the tools."""
    msgs = body.get("messages")
    system = ""
    if isinstance(msgs, list):
        system = "\n".join(
            text_of(m.get("content"))
            for m in msgs
            if isinstance(m, Mapping) and m.get("role") in ("system", "developer")
        )
    return Prompt(system, text_of(latest(msgs, ("user",))), body.get("tools"))


# -- errors --------------------------------------------------------------------------------------

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    500: "server_error",
    502: "api_error",
    503: "api_error",
    504: "timeout",
}


def error_body(status: int, message: str, code: str | None = None) -> bytes:
    """OpenAI's error object (the SDK raises the class its ``type`` and status name)."""
    return orjson.dumps(
        {
            "error": {
                "message": message,
                "type": ERROR_TYPES.get(status, "api_error"),
                "param": None,
                "code": code,
            }
        }
    )


def too_long(tokens: int, budget: int, detail: str) -> str:
    """OpenAI's words for a prompt over the window."""
    return (
        f"This request has {tokens} input tokens, more than this model's usable context allows "
        f"({detail}). Please reduce the length of the messages."
    )


# -- trimming ------------------------------------------------------------------------------------


class ChatRules(TrimRules):
    """Tool results are ``tool`` (or legacy ``function``) messages answering an assistant
    message's ``tool_calls``; every user message starts a turn."""

    def is_result(self, m: dict[str, Any]) -> bool:
        return m.get("role") in ("tool", "function")

    def starts_turn(self, m: Any) -> bool:
        return isinstance(m, dict) and m.get("role") == "user"

    def tool_uses(self, messages: list[Any], tokens: Callable[[int, int], int]) -> list[ToolUse]:
        calls: dict[str, tuple[tuple[int, int], str]] = {}
        uses: list[ToolUse] = []
        for i, m in enumerate(messages):
            if not isinstance(m, dict):
                continue
            if m.get("role") == "assistant" and isinstance(m.get("tool_calls"), list):
                for k, tc in enumerate(m["tool_calls"]):
                    fn = tc.get("function") if isinstance(tc, dict) else None
                    if isinstance(fn, dict):
                        calls[str(tc.get("id"))] = ((i, k), str(fn.get("name", "")))
            elif m.get("role") in ("tool", "function"):
                cid = str(m.get("tool_call_id") or "")
                where, name = calls.get(cid, (None, str(m.get("name") or "")))
                uses.append(ToolUse((i, -1), where, name, cid, tokens(i, -1)))
        return uses

    def results(self, m: dict[str, Any]) -> Iterator[tuple[int, str | None]]:
        if m.get("role") in ("tool", "function"):
            yield -1, block_texts(m.get("content"))

    def call_input(self, m: dict[str, Any], k: int) -> Any:
        return str((m["tool_calls"][k].get("function") or {}).get("arguments") or "")

    def without_inputs(self, m: dict[str, Any], calls: set[int]) -> dict[str, Any]:
        m["tool_calls"] = [
            {**tc, "function": {**tc["function"], "arguments": "{}"}} if k in calls else tc
            for k, tc in enumerate(m["tool_calls"])
        ]
        return m


def _provider(_path: str) -> str:
    return "openai"


#: the provider's other routes (passed through): first path segment -> the ``route`` label
PASSTHROUGH_ROUTES = MappingProxyType(
    {
        "embeddings": "embeddings",
        "completions": "completions",
        "responses": "responses",
        "files": "files",
        "uploads": "uploads",
        "batches": "batches",
        "models": "models",
        "moderations": "moderations",
        "images": "images",
        "audio": "audio",
        "fine_tuning": "fine_tuning",
        "vector_stores": "vector_stores",
        "assistants": "assistants",
        "threads": "threads",
        "chat": "chat_completions",
        "conversations": "conversations",
        "evals": "evals",
        "containers": "containers",
        "realtime": "realtime",
    }
)


def ask(a: Ask) -> tuple[str, dict[str, Any]]:
    """A chat completion that asks ``a``: the system and user messages; reasoning models get
    ``max_completion_tokens`` (the output plus the reasoning reservation) and no
    ``temperature`` or ``seed`` (OpenAI caches a repeated prefix by itself)."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": a.system}] if a.system else []
    body: dict[str, Any] = {
        "model": a.model,
        "messages": [*messages, {"role": "user", "content": a.user}],
    }
    if a.reasoning:
        body["max_completion_tokens"] = a.max_tokens + a.thinking
    else:
        body |= {"max_tokens": a.max_tokens, "temperature": a.temperature, "seed": 0}
    if a.json:
        body["response_format"] = {"type": "json_object"}
    return "/chat/completions", body


#: the OpenAI-style API (OpenAI, Azure OpenAI, vLLM, llama.cpp, LiteLLM ...)
API = ApiInfo(
    "openai",
    "the default upstream of OpenAI-style routes (chat completions, Responses, the pass-through)",
    "https://api.openai.com/v1",
    prices="openai",
    key_env="OPENAI_API_KEY",
)

FORMAT = Format(
    shape="openai",
    api="openai",
    ask=ask,
    count=count,
    trim=ChatRules(),
    requested_output=requested_output,
    body_usage=body_usage,
    tap=ChatStreamTap,
    expect=expect,
    read_answer=read_answer,
    prompt=prompt,
    error_body=error_body,
    too_long=too_long,
    prepare_stream=prepare_stream,
    provider=_provider,
    chat_template=True,
    passthrough_routes=PASSTHROUGH_ROUTES,
)

ROUTES = (Route(FORMAT, "openai_chat", "/chat/completions", paths=("/v1/chat/completions",)),)
