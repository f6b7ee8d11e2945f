"""Answer signals: what a proxy can tell about an answer without a judge model.

Per answer of a measured generation route (every API, streams included): why it stopped (a
normal stop, truncated at the output cap, a content filter, a refusal, tool calls, anything
else), and the problems any client would trip over: an empty answer, output that is not the JSON
(or not valid against the JSON schema) the request asked for, tool calls that name a tool the
request did not offer or whose arguments are not JSON or not valid against the tool's
parameters, and degenerate repetition (a short span repeated to the end).

Reading only: these functions take one answer's bytes and the request's expectations and return
its signals, keeping nothing; :mod:`context_ceiling.sidecar.observability.answers` runs them on
its thread and counts them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal

import orjson

from context_ceiling.core.vocabulary import Shape
from context_ceiling.formats import format_of
from context_ceiling.formats.base import Answer, Expect, Format

__all__ = [
    "PROBLEMS",
    "SIGNALS",
    "STOPS",
    "Stop",
    "Validators",
    "expectations",
    "problems",
    "read_answer",
    "repetition",
    "stop_of",
]


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


def expectations(shape: Shape | Format, obj: Mapping[str, Any]) -> Expect:
    """What ``obj`` (a request body of ``shape``) asks the answer to be."""
    return format_of(shape).expect(obj)


def read_answer(shape: Shape | Format, raw: bytes, stream: bool) -> Answer:
    """The answer in a response body (``stream`` False) or a stream's events (split by the
    format's framing), of ``shape``."""
    fmt = format_of(shape)
    if stream:
        objs: Iterable[Any] = fmt.framing.events(raw)
    else:
        try:
            objs = [orjson.loads(raw)]
        except orjson.JSONDecodeError:
            objs = []
    return fmt.read_answer(objs, stream)


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


class Validators:
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


def _valid(validators: Validators, schema: Mapping[str, Any] | None, value: Any) -> bool:
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


def _tool_problems(answer: Answer, expect: Expect, v: Validators) -> list[str]:
    """What is wrong with the answer's tool calls: a tool the request did not offer, arguments
    that are not a JSON object, arguments the tool's schema refuses (each once)."""
    bad_args, bad_schema, unknown = answer.malformed_call, False, False
    for name, args in answer.tool_calls:
        tools = expect.tools
        if tools is None or name not in tools:
            unknown = True
            continue
        if name in expect.free:
            continue
        value = args
        if isinstance(args, str):
            ok, value = _json(args)
            if not ok:
                bad_args = True
                continue
        if not isinstance(value, Mapping):
            bad_args = True
        elif not _valid(v, tools[name], value):
            bad_schema = True
    named = {
        "unknown_tool": unknown,
        "invalid_tool_arguments": bad_args,
        "tool_schema_mismatch": bad_schema,
    }
    return [name for name, found in named.items() if found]


def problems(answer: Answer, expect: Expect, validators: Validators | None = None) -> list[str]:
    """What is wrong with ``answer`` given what the request asked for (each problem once)."""
    v = validators or Validators()
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
    found += _tool_problems(answer, expect, v)
    if text and repetition(text):
        found.append("repetition")
    return found
