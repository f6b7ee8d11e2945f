"""Answer signals: what a proxy can tell about an answer without a judge model.

Per answer of a measured generation route (every API, streams included): why it stopped (a
normal stop, truncated at the output cap, a content filter, a refusal, tool calls, anything
else), and the problems any client would trip over: an empty answer, output that is not the JSON
(or not valid against the JSON schema) the request asked for, tool calls that name a tool the
request did not offer or whose arguments are not JSON or not valid against the tool's
parameters, and degenerate repetition (a short span repeated to the end). Each is counted by
model, workload, the request's fill bucket and its side of the running ceiling, so the rate of a
signal can be read against fill in live traffic: a rate, never a judgement of one answer.

Nothing here keeps prompt or answer text: the request's expectations (its tool names and
schemas) and the response's bytes are handed to one checker thread after the response has been
relayed, read there, counted, and dropped. The request path only appends references.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import orjson

from context_ceiling.core.wire import Shape

__all__ = [
    "PROBLEMS",
    "SIDES",
    "SIGNALS",
    "STOPS",
    "Answer",
    "AnswerChecker",
    "Counted",
    "Expect",
    "HeldBytes",
    "Job",
    "expectations",
    "problems",
    "read_answer",
    "repetition",
    "stop_of",
]

log = logging.getLogger(__name__)

Stop = Literal["stop", "truncated", "content_filter", "refusal", "tool_calls", "other_stop"]
#: why an answer ended: exactly one per answer, so these partition the answers
STOPS: tuple[Stop, ...] = (
    "stop",
    "truncated",
    "content_filter",
    "refusal",
    "tool_calls",
    "other_stop",
)
#: what was wrong with an answer, any number per answer
PROBLEMS: tuple[str, ...] = (
    "empty",
    "invalid_json",
    "schema_mismatch",
    "unknown_tool",
    "invalid_tool_arguments",
    "tool_schema_mismatch",
    "repetition",
)
#: the ``signal`` label's values
SIGNALS: tuple[str, ...] = (*STOPS, *PROBLEMS)
#: the request's input against its running ceiling (``none``: no ceiling for its model/workload)
SIDES: tuple[str, ...] = ("below", "above", "none")

#: a schema larger than this (serialized) is not validated against: only JSON-ness is checked
MAX_SCHEMA_BYTES = 64 * 1024
#: keywords whose values are regular expressions the client wrote: a schema holding one is not
#: validated (Python's ``re`` holds the interpreter lock while it matches, so a pathological
#: pattern would stall the proxy), only checked for JSON
_REGEX_KEYWORDS = frozenset({"pattern", "patternProperties", "propertyNames"})
#: how much of an answer's end the repetition check reads, and its longest repeated span
_TAIL_CHARS = 8192
_MAX_PERIOD = 256
#: a repeated suffix counts when it is at least this long and holds this many copies ...
_MIN_RUN_CHARS = 200
_MIN_COPIES = 4
#: ... and either covers half the answer or holds this many copies (a long answer that ends in a
#: loop until its output cap)
_MANY_COPIES = 10


# -- what the request asked for ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Expect:
    """What a request asked the answer to be: JSON (with a schema or without), and the tools it
    offered (name -> parameter schema, None when the tool takes any object; ``free``: tools
    whose input is free text). ``tools`` None: the request offered no tools. References into the
    client's parsed body: nothing is copied on the request path."""

    json: bool = False
    schema: Mapping[str, Any] | None = None
    tools: Mapping[str, Mapping[str, Any] | None] | None = None
    free: frozenset[str] = frozenset()


NOTHING = Expect()


def _openapi_to_json_schema(node: Any, depth: int = 0) -> Any:
    """Gemini's ``responseSchema`` and function ``parameters`` are OpenAPI 3.0 schema objects
    (upper-case ``type`` names, ``nullable``): the same schema in JSON Schema terms."""
    if depth > 64:
        return {}
    if isinstance(node, list):
        return [_openapi_to_json_schema(x, depth + 1) for x in node]
    if not isinstance(node, Mapping):
        return node
    out: dict[str, Any] = {}
    for k, v in node.items():
        if k == "type" and isinstance(v, str):
            out[k] = v.lower()
        elif k == "nullable":
            continue
        elif k in ("properties",) and isinstance(v, Mapping):
            out[k] = {p: _openapi_to_json_schema(s, depth + 1) for p, s in v.items()}
        elif k in ("items", "anyOf", "oneOf", "allOf"):
            out[k] = _openapi_to_json_schema(v, depth + 1)
        else:
            out[k] = v
    if node.get("nullable") is True and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    return out


def _mapping(v: Any) -> Mapping[str, Any] | None:
    return v if isinstance(v, Mapping) else None


def _openai_tools(tools: Any, functions: Any) -> tuple[dict[str, Any], set[str]] | None:
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
            named[fn["name"]] = _mapping(fn.get("parameters"))
        elif t.get("type") == "function" and isinstance(t.get("name"), str):  # Responses API
            named[t["name"]] = _mapping(t.get("parameters"))
        elif t.get("type") == "custom":  # free-form input
            custom = t.get("custom")
            c: Mapping[str, Any] = custom if isinstance(custom, Mapping) else t
            if isinstance(c.get("name"), str):
                named[c["name"]] = None
                free.add(c["name"])
    for f in functions if isinstance(functions, list) else []:  # legacy ``functions``
        if isinstance(f, Mapping) and isinstance(f.get("name"), str):
            named[f["name"]] = _mapping(f.get("parameters"))
    return named, free


#: (JSON asked for, its schema, (tool name -> parameter schema, free-text tools) or None)
_Asked = tuple[bool, Any, tuple[dict[str, Any], set[str]] | None]


def _asked_openai(obj: Mapping[str, Any]) -> _Asked:
    rf = obj.get("response_format")
    json_, schema = False, None
    if isinstance(rf, Mapping):
        json_ = rf.get("type") in ("json_object", "json_schema")
        js = rf.get("json_schema")
        schema = js.get("schema") if isinstance(js, Mapping) else None
    return json_, schema, _openai_tools(obj.get("tools"), obj.get("functions"))


def _asked_responses(obj: Mapping[str, Any]) -> _Asked:
    text = obj.get("text")
    fmt = text.get("format") if isinstance(text, Mapping) else None
    json_, schema = False, None
    if isinstance(fmt, Mapping):
        json_ = fmt.get("type") in ("json_object", "json_schema")
        schema = fmt.get("schema")
    return json_, schema, _openai_tools(obj.get("tools"), None)


def _asked_anthropic(obj: Mapping[str, Any]) -> _Asked:
    oc = obj.get("output_config")  # generally available; output_format: the beta
    fmt = oc.get("format") if isinstance(oc, Mapping) else obj.get("output_format")
    json_, schema = False, None
    if isinstance(fmt, Mapping) and fmt.get("type") == "json_schema":
        json_, schema = True, fmt.get("schema")
    raw = obj.get("tools")
    if not isinstance(raw, list):
        return json_, schema, None
    # client tools carry an input_schema; server tools (web search...) are answered by the
    # provider as server_tool_use blocks, never as tool calls to check
    named = {
        t["name"]: _mapping(t.get("input_schema"))
        for t in raw
        if isinstance(t, Mapping) and isinstance(t.get("name"), str)
    }
    return json_, schema, (named, set())


def _gemini_schema(node: Mapping[str, Any], json_key: str, openapi_key: str) -> Any:
    """A JSON Schema as given (``*JsonSchema``), else the OpenAPI one converted, else None."""
    js = node.get(json_key)
    if isinstance(js, Mapping):
        return js
    api = node.get(openapi_key)
    return _openapi_to_json_schema(api) if isinstance(api, Mapping) else None


def _asked_gemini(obj: Mapping[str, Any]) -> _Asked:
    gc = obj.get("generationConfig") or obj.get("generation_config")
    json_, schema = False, None
    if isinstance(gc, Mapping):
        json_ = (gc.get("responseMimeType") or gc.get("response_mime_type")) == "application/json"
        schema = _gemini_schema(gc, "responseJsonSchema", "responseSchema") or _gemini_schema(
            gc, "response_json_schema", "response_schema"
        )
    named: dict[str, Any] = {}
    for t in obj.get("tools") or () if isinstance(obj.get("tools"), list) else ():
        decls = (
            t.get("functionDeclarations") or t.get("function_declarations")
            if isinstance(t, Mapping)
            else None
        )
        for d in decls if isinstance(decls, list) else ():
            if isinstance(d, Mapping) and isinstance(d.get("name"), str):
                named[d["name"]] = _gemini_schema(
                    d, "parametersJsonSchema", "parameters"
                ) or _gemini_schema(d, "parameters_json_schema", "parameters")
    return json_, schema, ((named, set()) if named else None)


_ASKED = {
    "openai": _asked_openai,
    "responses": _asked_responses,
    "anthropic": _asked_anthropic,
    "gemini": _asked_gemini,
}


def expectations(shape: Shape, obj: Mapping[str, Any]) -> Expect:
    """What ``obj`` (a request body of ``shape``) asks the answer to be."""
    json_, schema, tools = _ASKED[shape](obj)
    return Expect(
        json=json_ or isinstance(schema, Mapping),
        schema=schema if isinstance(schema, Mapping) else None,
        tools=tools[0] if tools is not None else None,
        free=frozenset(tools[1]) if tools is not None else frozenset(),
    )


# -- what the answer was --------------------------------------------------------------------------


@dataclass(slots=True)
class Answer:
    """One answer as the client received it: its text, whether the model refused, its tool calls
    (name, arguments: JSON text, or an object the API already parsed), the provider's stop
    reason, and the output and reasoning tokens it reported."""

    text: str = ""
    refusal: bool = False
    tool_calls: list[tuple[str, Any]] = field(default_factory=list)
    finish: str | None = None
    output_tokens: int | None = None
    reasoning_tokens: int | None = None
    #: Gemini's MALFORMED_FUNCTION_CALL: a call so broken the API returned none
    malformed_call: bool = False


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _tokens(a: Answer, usage: Any, key: str) -> None:
    """Output tokens (``usage[key]``) and the reasoning tokens among them (``usage[key +
    "_details"].reasoning_tokens``): OpenAI's chat and Responses usage objects."""
    if isinstance(usage, Mapping):
        a.output_tokens = _int(usage.get(key))
        details = usage.get(key + "_details")
        if isinstance(details, Mapping):
            a.reasoning_tokens = _int(details.get("reasoning_tokens"))


def _events(raw: bytes) -> Iterator[Any]:
    """The JSON ``data:`` payloads of an SSE stream, in order (``[DONE]`` and junk skipped)."""
    for line in raw.split(b"\n"):
        if line.startswith(b"data:"):
            data = line[5:].strip()
            if data[:1] in (b"{", b"["):
                try:
                    yield orjson.loads(data)
                except orjson.JSONDecodeError:
                    continue


def _openai(objs: Iterable[Any], stream: bool) -> Answer:
    a = Answer()
    text: list[str] = []
    calls: dict[int, list[Any]] = {}  # index -> [name, argument pieces...]
    for o in objs:
        if not isinstance(o, Mapping):
            continue
        _tokens(a, o.get("usage"), "completion_tokens")
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
            for i, tc in enumerate(msg.get("tool_calls") or ()):
                if not isinstance(tc, Mapping):
                    continue
                fn = (
                    tc.get("function")
                    if isinstance(tc.get("function"), Mapping)
                    else tc.get("custom")
                )
                if not isinstance(fn, Mapping):
                    continue
                # a stream's pieces join by index; a piece without one is a call of its own
                at = _int(tc.get("index")) if stream else i
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
    a.text = "".join(text)
    a.tool_calls = [(s[0] or "", "".join(s[1:])) for _, s in sorted(calls.items())]
    return a


def _anthropic(objs: Iterable[Any], stream: bool) -> Answer:
    a = Answer()
    text: list[str] = []
    blocks: dict[int, list[Any]] = {}  # index -> [name, partial json pieces...]
    for o in objs:
        if not isinstance(o, Mapping):
            continue
        if not stream:
            for b in o.get("content") or ():
                if not isinstance(b, Mapping):
                    continue
                if b.get("type") == "text" and isinstance(b.get("text"), str):
                    text.append(b["text"])
                elif b.get("type") == "tool_use":
                    a.tool_calls.append((str(b.get("name") or ""), b.get("input")))
            a.finish = o.get("stop_reason") if isinstance(o.get("stop_reason"), str) else None
            usage = o.get("usage")
            if isinstance(usage, Mapping):
                a.output_tokens = _int(usage.get("output_tokens"))
            continue
        kind = o.get("type")
        if kind == "content_block_start" and isinstance(o.get("content_block"), Mapping):
            b = o["content_block"]
            if b.get("type") == "tool_use":
                blocks[_int(o.get("index")) or 0] = [str(b.get("name") or "")]
            elif b.get("type") == "text" and isinstance(b.get("text"), str):
                text.append(b["text"])
        elif kind == "content_block_delta" and isinstance(o.get("delta"), Mapping):
            d = o["delta"]
            if d.get("type") == "text_delta" and isinstance(d.get("text"), str):
                text.append(d["text"])
            elif d.get("type") == "input_json_delta" and isinstance(d.get("partial_json"), str):
                # a client tool's input; a server tool's (server_tool_use) is the provider's
                block = blocks.get(_int(o.get("index")) or 0)
                if block is not None:
                    block.append(d["partial_json"])
        elif kind == "message_delta":
            d = o.get("delta")
            if isinstance(d, Mapping) and isinstance(d.get("stop_reason"), str):
                a.finish = d["stop_reason"]
            usage = o.get("usage")
            if isinstance(usage, Mapping) and _int(usage.get("output_tokens")) is not None:
                a.output_tokens = _int(usage.get("output_tokens"))
    a.text = "".join(text)
    # a streamed tool_use with no input deltas has the empty object as its input
    a.tool_calls += [(s[0], "".join(s[1:]) or "{}") for _, s in sorted(blocks.items())]
    return a


def _responses_object(a: Answer, r: Mapping[str, Any]) -> None:
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
    _tokens(a, r.get("usage"), "output_tokens")
    incomplete = r.get("incomplete_details")
    if isinstance(incomplete, Mapping) and isinstance(incomplete.get("reason"), str):
        a.finish = incomplete["reason"]
    elif isinstance(r.get("status"), str):
        a.finish = r["status"]


def _responses(objs: Iterable[Any], stream: bool) -> Answer:
    a = Answer()
    deltas: list[str] = []
    final = False
    for o in objs:
        if not isinstance(o, Mapping):
            continue
        if not stream:
            _responses_object(a, o)
            return a
        kind = o.get("type")
        if kind in ("response.completed", "response.incomplete") and isinstance(
            o.get("response"), Mapping
        ):
            _responses_object(a, o["response"])  # the whole response, as the stream ends
            final = True
        elif kind == "response.output_text.delta" and isinstance(o.get("delta"), str):
            deltas.append(o["delta"])
        elif kind == "response.refusal.delta":
            a.refusal = True
    if not final or (not a.text and deltas):  # no final event, or one without its output
        a.text = "".join(deltas)
    return a


def _gemini(objs: Iterable[Any], stream: bool) -> Answer:
    a = Answer()
    text: list[str] = []
    for o in objs:
        if not isinstance(o, Mapping):
            continue
        meta = o.get("usageMetadata")
        if isinstance(meta, Mapping):
            if _int(meta.get("candidatesTokenCount")) is not None:
                a.output_tokens = _int(meta.get("candidatesTokenCount"))
            if _int(meta.get("thoughtsTokenCount")) is not None:
                a.reasoning_tokens = _int(meta.get("thoughtsTokenCount"))
        cands = o.get("candidates")
        if not isinstance(cands, list) or not cands or not isinstance(cands[0], Mapping):
            continue
        c = cands[0]
        if isinstance(c.get("finishReason"), str):
            a.finish = c["finishReason"]
        content = c.get("content")
        for p in content.get("parts") or () if isinstance(content, Mapping) else ():
            if not isinstance(p, Mapping) or p.get("thought") is True:
                continue
            if isinstance(p.get("text"), str):
                text.append(p["text"])
            fc = p.get("functionCall") or p.get("function_call")
            if isinstance(fc, Mapping):
                a.tool_calls.append((str(fc.get("name") or ""), fc.get("args", {})))
    a.text = "".join(text)
    a.malformed_call = a.finish in ("MALFORMED_FUNCTION_CALL", "UNEXPECTED_TOOL_CALL")
    return a


_READERS = {"openai": _openai, "anthropic": _anthropic, "responses": _responses, "gemini": _gemini}


def read_answer(shape: Shape, raw: bytes, stream: bool) -> Answer:
    """The answer in a response body (``stream`` False) or a stream's events, of ``shape``."""
    if stream:
        objs: Iterable[Any] = _events(raw)
    else:
        try:
            objs = [orjson.loads(raw)]
        except orjson.JSONDecodeError:
            objs = []
    return _READERS[shape](objs, stream)


_STOP_WORDS: dict[str, Stop] = {
    # OpenAI chat
    "stop": "stop",
    "length": "truncated",
    "content_filter": "content_filter",
    "tool_calls": "tool_calls",
    "function_call": "tool_calls",
    # Anthropic
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "truncated",
    "model_context_window_exceeded": "truncated",
    "refusal": "refusal",
    "tool_use": "tool_calls",
    # the Responses API (status, or the reason it is incomplete)
    "completed": "stop",
    "max_output_tokens": "truncated",
    # Gemini
    "STOP": "stop",
    "MAX_TOKENS": "truncated",
    "SAFETY": "content_filter",
    "RECITATION": "content_filter",
    "BLOCKLIST": "content_filter",
    "PROHIBITED_CONTENT": "content_filter",
    "SPII": "content_filter",
    "IMAGE_SAFETY": "content_filter",
    "LANGUAGE": "content_filter",
    "MALFORMED_FUNCTION_CALL": "tool_calls",
    "UNEXPECTED_TOOL_CALL": "tool_calls",
}


def stop_of(answer: Answer) -> Stop:
    """Why the answer ended, in one vocabulary for every API. A refusal field (OpenAI's
    ``refusal``, a Responses API refusal part) makes it a refusal whatever the stop reason
    says; tool calls in an answer that otherwise stopped normally make it a tool-call stop
    (the Responses API and Gemini report no separate reason for them)."""
    if answer.refusal:
        return "refusal"
    stop = _STOP_WORDS.get(answer.finish or "", "other_stop")
    if stop == "stop" and answer.tool_calls:
        return "tool_calls"
    return stop


def repetition(text: str) -> bool:
    """Whether ``text`` ends in degenerate repetition: one span of at most 256 characters
    repeated up to its end, at least 4 times over at least 200 characters and half the answer,
    or at least 10 times. Reads at most the last 8k characters with C-level slice comparisons (bounded work)."""
    tail = text[-_TAIL_CHARS:]
    n = len(tail)
    if n < _MIN_RUN_CHARS:
        return False
    probe = _MIN_RUN_CHARS // 2
    for p in range(1, min(_MAX_PERIOD, n // _MIN_COPIES) + 1):
        if tail[n - probe :] != tail[n - probe - p : n - p]:
            continue
        # the longest suffix with period p: a run of length L means tail[-L:] == tail[-L-p:-p]
        lo, hi = probe, n - p
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if tail[n - mid :] == tail[n - mid - p : n - p]:
                lo = mid
            else:
                hi = mid - 1
        run = lo + p  # characters covered by the repeated span
        copies = run // p
        if (
            run >= _MIN_RUN_CHARS
            and copies >= _MIN_COPIES
            and (run * 2 >= min(len(text), n) or copies >= _MANY_COPIES)
        ):
            return True
    return False


# -- the checks -----------------------------------------------------------------------------------


class _Validators:
    """JSON Schema validators by schema, built once each (bounded)."""

    def __init__(self, size: int = 256) -> None:
        self.size = size
        self._cache: dict[bytes, Any] = {}

    def get(self, schema: Mapping[str, Any]) -> Any:
        """A validator for ``schema``, or None when it is not checked (too large, holds a
        regular expression, or is not a valid schema)."""
        try:
            key = orjson.dumps(schema, option=orjson.OPT_SORT_KEYS)
        except (TypeError, orjson.JSONEncodeError):
            return None
        if key in self._cache:
            return self._cache[key]
        validator = None
        if len(key) <= MAX_SCHEMA_BYTES and not _has_regex(schema):
            from jsonschema import validators
            from jsonschema.exceptions import SchemaError

            try:
                as_dict = dict(schema)
                cls = validators.validator_for(as_dict)
                cls.check_schema(as_dict)
                validator = cls(as_dict)
            except (SchemaError, RecursionError, TypeError, ValueError):
                validator = None
        if len(self._cache) >= self.size:
            self._cache.pop(next(iter(self._cache)))
        self._cache[key] = validator
        return validator


def _has_regex(node: Any, depth: int = 0) -> bool:
    if depth > 64:
        return True
    if isinstance(node, Mapping):
        return any(k in _REGEX_KEYWORDS or _has_regex(v, depth + 1) for k, v in node.items())
    if isinstance(node, list):
        return any(_has_regex(v, depth + 1) for v in node)
    return False


def _valid(validators: _Validators, schema: Mapping[str, Any] | None, value: Any) -> bool:
    """Whether ``value`` satisfies ``schema`` (True when the schema is not checked)."""
    if schema is None:
        return True
    v = validators.get(schema)
    if v is None:
        return True
    try:
        return bool(v.is_valid(value))
    except (RecursionError, TypeError, ValueError):
        return True
    except Exception:  # a referencing error and the like: not the answer's fault
        return True


def _json(text: str) -> tuple[bool, Any]:
    try:
        return True, orjson.loads(text)
    except orjson.JSONDecodeError:
        return False, None


def problems(answer: Answer, expect: Expect, validators: _Validators | None = None) -> list[str]:
    """What is wrong with ``answer`` given what the request asked for (each problem once)."""
    v = validators or _Validators()
    found: list[str] = []
    text = answer.text
    declined = stop_of(answer) in ("refusal", "content_filter")  # said so: not "empty"
    if not text.strip() and not answer.tool_calls and not declined:
        found.append("empty")
    if expect.json and text.strip() and not answer.refusal:
        ok, value = _json(text)
        if not ok:
            found.append("invalid_json")
        elif not _valid(v, expect.schema, value):
            found.append("schema_mismatch")
    bad_args, bad_schema, unknown = answer.malformed_call, False, False
    for name, args in answer.tool_calls:
        tools = expect.tools
        if tools is None or name not in tools:
            unknown = True
            continue
        if name in expect.free:
            continue
        if isinstance(args, str):
            ok, args = _json(args)
            if not ok:
                bad_args = True
                continue
        if not isinstance(args, Mapping):
            bad_args = True
        elif not _valid(v, tools[name], args):
            bad_schema = True
    if unknown:
        found.append("unknown_tool")
    if bad_args:
        found.append("invalid_tool_arguments")
    if bad_schema:
        found.append("tool_schema_mismatch")
    if text and repetition(text):
        found.append("repetition")
    return found


# -- the checker thread ---------------------------------------------------------------------------


class HeldBytes:
    """Answer bytes held at once, bounded: kept by streams while they are relayed, and queued
    for the checker. :meth:`take` is called on the event loop (each kept stream read, each
    queued answer), :meth:`give` there and on the checker thread."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self._lock = threading.Lock()

    def take(self, n: int) -> bool:
        """Hold ``n`` more bytes if that stays within the limit."""
        with self._lock:
            if self.held + n > self.limit:
                return False
            self.held += n
            return True

    def give(self, n: int) -> None:
        with self._lock:
            self.held -= n


@dataclass(slots=True)
class Job:
    """One relayed answer to check: where it counts (labels), and what to read."""

    model: str
    workload: str
    fill: str
    side: str
    shape: Shape
    stream: bool
    expect: Expect
    #: the response body, or a stream's events as they were relayed (joined in the thread);
    #: None: over the size cap, only what the stream tap read is known
    raw: bytes | list[bytes] | None
    #: what the relay's tap already read: the stop reason and output tokens
    finish: str | None = None
    output_tokens: int | None = None
    #: the bytes of ``raw`` held against :class:`HeldBytes` while it waits (set by submit)
    size: int = 0
    #: why ``raw`` is None: ``too_large`` (over answers.max_bytes) or ``busy`` (over
    #: answers.max_held_mib)
    unread: str = "too_large"


class Counted(Protocol):
    """Where the checker counts (the sidecar's :class:`~context_ceiling.sidecar.metrics.Metrics`)."""

    def answer(
        self, job: Job, signals: list[str], output: int | None, reasoning: int | None
    ) -> None: ...

    def answer_skipped(self, reason: str) -> None: ...


class AnswerChecker:
    """Checks relayed answers on one thread, off the request path.

    :meth:`submit` (on the event loop) only appends to a bounded queue; the thread wakes every
    ``interval`` seconds and checks and counts what queued meanwhile. Waking once per interval
    rather than once per answer keeps the thread hand-off (a context switch and the interpreter
    lock changing hands, about as much CPU as a small request's whole check) off each request; the
    counters lag by at most ``interval``. A full queue drops the check and counts it."""

    def __init__(
        self,
        sink: Counted,
        queue_size: int = 256,
        interval: float = 0.05,
        held: HeldBytes | None = None,
    ) -> None:
        self.sink = sink
        #: answer bytes held at once, relaying and queued (answers.max_held_mib)
        self.held = held or HeldBytes(64 * 2**20)
        self.size = queue_size
        self.interval = interval
        self._jobs: deque[Job] = deque()
        #: answers queued, and answers counted (each written by one thread only)
        self._submitted = 0
        self._done = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.validators = _Validators()

    def submit(self, job: Job) -> None:
        if len(self._jobs) >= self.size:
            self.sink.answer_skipped("queue_full")
            return
        if job.raw is not None:
            size = len(job.raw) if isinstance(job.raw, bytes) else sum(map(len, job.raw))
            if self.held.take(size):
                job.size = size
            else:  # too much held already: counted by its stop alone
                job.raw, job.unread = None, "busy"
        self._jobs.append(job)
        self._submitted += 1

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="answer-checker", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Count what is queued, then end the thread."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout)
            self._thread = None

    def join(self, timeout: float = 10.0) -> None:
        """Until every answer queued so far is counted (tests; shutdown uses :meth:`stop`)."""
        target = self._submitted
        deadline = time.monotonic() + timeout
        while self._done < target and time.monotonic() < deadline:
            time.sleep(self.interval / 5)

    def check(self, job: Job) -> tuple[list[str], int | None, int | None]:
        """(the answer's signals: its stop, then its problems; output tokens; reasoning
        tokens)."""
        if job.raw is None:
            a = Answer(finish=job.finish)
            return [stop_of(a)], job.output_tokens, None
        raw = job.raw if isinstance(job.raw, bytes) else b"".join(job.raw)
        a = read_answer(job.shape, raw, job.stream)
        if a.finish is None:
            a.finish = job.finish
        out = a.output_tokens if a.output_tokens is not None else job.output_tokens
        return [stop_of(a), *problems(a, job.expect, self.validators)], out, a.reasoning_tokens

    def _one(self, job: Job) -> None:
        try:
            signals, out, reasoning = self.check(job)
        except Exception:  # a check must never take the thread down
            log.exception("answer check failed")
            self.sink.answer_skipped("error")
            return
        if job.raw is None:
            self.sink.answer_skipped(job.unread)
        self.sink.answer(job, signals, out, reasoning)

    def _drain(self) -> None:
        while self._jobs:
            job = self._jobs.popleft()
            try:
                self._one(job)
            finally:
                self.held.give(job.size)
                self._done += 1

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._drain()
        self._drain()
