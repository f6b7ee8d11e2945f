"""What the upstream says it used: read from a response body or tapped from a stream.

Anthropic's input is ``input_tokens + cache_read_input_tokens + cache_creation_input_tokens``
(cached tokens still occupy the window). OpenAI's is ``prompt_tokens``.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from typing import Any

import orjson

from context_ceiling.sidecar.sse import event_data


@dataclass(slots=True)
class Usage:
    input_tokens: int | None = None
    output_tokens: int | None = None
    cached_tokens: int | None = None
    finish_reason: str | None = None
    response_model: str | None = None
    #: the provider's own context management, as it reported it: edits applied (Anthropic's
    #: cleared tool uses, the Responses API's compaction items) and input tokens cleared
    native_edits: int = 0
    native_cleared_tokens: int | None = None


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _openai_usage(u: Usage, usage: Any) -> None:
    if isinstance(usage, dict):
        u.input_tokens = _int(usage.get("prompt_tokens"))
        u.output_tokens = _int(usage.get("completion_tokens"))
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict):
            u.cached_tokens = _int(details.get("cached_tokens"))


def _anthropic_usage(u: Usage, usage: Any) -> None:
    if not isinstance(usage, dict):
        return
    fresh = _int(usage.get("input_tokens"))
    read = _int(usage.get("cache_read_input_tokens")) or 0
    created = _int(usage.get("cache_creation_input_tokens")) or 0
    if fresh is not None:
        u.input_tokens = fresh + read + created
        u.cached_tokens = read
    out = _int(usage.get("output_tokens"))
    if out is not None:
        u.output_tokens = out


def _anthropic_context_management(u: Usage, cm: Any) -> None:
    """Anthropic's report of the context edits it applied (``context_management``)."""
    if not isinstance(cm, dict) or not isinstance(cm.get("applied_edits"), list):
        return
    cleared = 0
    for edit in cm["applied_edits"]:
        if isinstance(edit, dict):
            u.native_edits += 1
            cleared += _int(edit.get("cleared_input_tokens")) or 0
    u.native_cleared_tokens = cleared


def _compactions(u: Usage, output: Any) -> None:
    """The Responses API's compaction items in a response's output."""
    if isinstance(output, list):
        u.native_edits += sum(
            1 for o in output if isinstance(o, dict) and o.get("type") == "compaction"
        )


def openai_body_usage(body: bytes) -> Usage:
    u = Usage()
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return u
    if isinstance(obj, dict):
        _openai_usage(u, obj.get("usage"))
        u.response_model = obj.get("model") if isinstance(obj.get("model"), str) else None
        choices = obj.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            u.finish_reason = choices[0].get("finish_reason")
    return u


def anthropic_body_usage(body: bytes) -> Usage:
    u = Usage()
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return u
    if isinstance(obj, dict):
        _anthropic_usage(u, obj.get("usage"))
        u.response_model = obj.get("model") if isinstance(obj.get("model"), str) else None
        u.finish_reason = obj.get("stop_reason")
        _anthropic_context_management(u, obj.get("context_management"))
        if obj.get("input_tokens") is not None and u.input_tokens is None:  # count_tokens reply
            u.input_tokens = _int(obj.get("input_tokens"))
    return u


_JSON_SPACE = b" \t\r\n"


def ask_for_usage(obj: dict[str, Any], body: bytes | None) -> tuple[bytes | None, bool]:
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


class _StreamState:
    """What every stream tap tracks: the usage read so far, whether the protocol's last event
    arrived (``complete``), and whether the upstream reported its own failure in the stream."""

    __slots__ = ("complete", "upstream_error", "usage")

    def __init__(self) -> None:
        self.usage = Usage()
        self.complete = False
        self.upstream_error = False

    def on_chunk(self, chunk: bytes) -> bytes | None:
        """A whole upstream read of complete events, as one: the bytes to forward when no event
        in it carries anything this tap reads (checked with byte scans), else None and each
        event goes through :meth:`on_event`. Most reads of a stream are one plain content delta;
        this skips splitting them into events. This base forwards nothing whole."""
        return None


#: what makes a chat.completion.chunk read worth splitting and parsing: a usage or finish reason
#: that is not null, the end of the stream, an error (JSON-escaped text cannot hold the quotes)
_OPENAI_NOTABLE = re.compile(rb'"(?:usage|finish_reason)"\s*:(?!\s*null)|\[DONE\]|"error"')


class OpenAIStreamTap(_StreamState):
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

    def on_chunk(self, chunk: bytes) -> bytes | None:
        # plain: the model is known, and no usage or finish_reason in it is anything but null,
        # no end, no error (one regex scan of the read)
        if self.usage.response_model is None or _OPENAI_NOTABLE.search(chunk):
            return None
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
            _openai_usage(u, usage)
            if self.injected and not choices:
                return None
        return self._as_sent(event)

    def _as_sent(self, event: bytes) -> bytes:
        """The event as the upstream would have sent it without our ``include_usage``."""
        if self.injected:
            return event.replace(b',"usage":null', b"").replace(b', "usage": null', b"")
        return event


class AnthropicStreamTap(_StreamState):
    """Reads usage from ``message_start`` and ``message_delta`` events; forwards all unchanged."""

    __slots__ = ()  # complete: saw ``message_stop``; upstream_error: saw ``event: error``

    @staticmethod
    def error_event(message: str) -> bytes:
        """Anthropic's mid-stream failure: ``event: error`` (the SDK raises on it)."""
        err = {"type": "error", "error": {"type": "api_error", "message": message}}
        return b"event: error\ndata: " + orjson.dumps(err) + b"\n\n"

    def on_chunk(self, chunk: bytes) -> bytes | None:
        if b"message_" in chunk or b"error" in chunk:  # message_start/_delta/_stop, error
            return None
        return chunk

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
            _anthropic_usage(self.usage, msg.get("usage"))
            if isinstance(msg.get("model"), str):
                self.usage.response_model = msg["model"]
        else:
            usage = obj.get("usage")
            if isinstance(usage, dict):
                # message_delta usage is cumulative; input fields appear there on some versions
                if usage.get("input_tokens") is not None:
                    _anthropic_usage(self.usage, usage)
                elif _int(usage.get("output_tokens")) is not None:
                    self.usage.output_tokens = _int(usage.get("output_tokens"))
            delta = obj.get("delta")
            if isinstance(delta, dict) and delta.get("stop_reason"):
                self.usage.finish_reason = delta["stop_reason"]
            _anthropic_context_management(self.usage, obj.get("context_management"))
        return event


def _responses_usage(u: Usage, obj: Any) -> None:
    """A Responses API ``response`` object: usage, model, and why it stopped."""
    if not isinstance(obj, dict):
        return
    usage = obj.get("usage")
    if isinstance(usage, dict):
        u.input_tokens = _int(usage.get("input_tokens"))
        u.output_tokens = _int(usage.get("output_tokens"))
        details = usage.get("input_tokens_details")
        if isinstance(details, dict):
            u.cached_tokens = _int(details.get("cached_tokens"))
    if isinstance(obj.get("model"), str):
        u.response_model = obj["model"]
    _compactions(u, obj.get("output"))
    status = obj.get("status")
    incomplete = obj.get("incomplete_details")
    if isinstance(incomplete, dict) and isinstance(incomplete.get("reason"), str):
        u.finish_reason = incomplete["reason"]
    elif isinstance(status, str):
        u.finish_reason = status


def responses_body_usage(body: bytes) -> Usage:
    u = Usage()
    with contextlib.suppress(orjson.JSONDecodeError):
        _responses_usage(u, orjson.loads(body))
    return u


def responses_count_usage(body: bytes) -> Usage:
    """``POST /v1/responses/input_tokens``: ``{"object": "response.input_tokens",
    "input_tokens": N}``."""
    u = Usage()
    with contextlib.suppress(orjson.JSONDecodeError):
        obj = orjson.loads(body)
        if isinstance(obj, dict):
            u.input_tokens = _int(obj.get("input_tokens"))
    return u


class ResponsesStreamTap(_StreamState):
    """Reads usage from the Responses API's ``response.completed`` (or ``.incomplete``) event;
    forwards every event unchanged. ``response.failed`` and ``error`` are the upstream's own
    failure."""

    __slots__ = ()

    error_event = staticmethod(OpenAIStreamTap.error_event)

    def on_chunk(self, chunk: bytes) -> bytes | None:
        if b"response.completed" in chunk or b"response.incomplete" in chunk:
            return None
        if b"response.failed" in chunk or b"error" in chunk:
            return None
        return chunk

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
                _responses_usage(self.usage, obj.get("response"))
        elif name in (b"response.failed", b"error"):
            self.upstream_error = True
        return event


def _gemini_usage(u: Usage, obj: Any) -> None:
    if not isinstance(obj, dict):
        return
    meta = obj.get("usageMetadata")
    if isinstance(meta, dict):
        if _int(meta.get("promptTokenCount")) is not None:
            u.input_tokens = _int(meta.get("promptTokenCount"))
        if _int(meta.get("candidatesTokenCount")) is not None:
            u.output_tokens = _int(meta.get("candidatesTokenCount"))
        if _int(meta.get("cachedContentTokenCount")) is not None:
            u.cached_tokens = _int(meta.get("cachedContentTokenCount"))
    if isinstance(obj.get("modelVersion"), str):
        u.response_model = obj["modelVersion"]
    cands = obj.get("candidates")
    if isinstance(cands, list):
        for c in cands:
            if isinstance(c, dict) and isinstance(c.get("finishReason"), str):
                u.finish_reason = c["finishReason"]


def gemini_body_usage(body: bytes) -> Usage:
    """A ``generateContent`` reply, or a ``countTokens`` one (``totalTokens``)."""
    u = Usage()
    with contextlib.suppress(orjson.JSONDecodeError):
        obj = orjson.loads(body)
        _gemini_usage(u, obj)
        if isinstance(obj, dict) and u.input_tokens is None:
            u.input_tokens = _int(obj.get("totalTokens"))
    return u


class GeminiStreamTap(_StreamState):
    """``streamGenerateContent?alt=sse``: every event is a partial response; usage comes with
    the last ones, and the stream is whole once a candidate carries its ``finishReason`` (the
    API sends no end marker)."""

    __slots__ = ()

    @staticmethod
    def error_event(message: str) -> bytes:
        err = {"error": {"code": 502, "message": message, "status": "UNAVAILABLE"}}
        return b"data: " + orjson.dumps(err) + b"\n\n"

    def on_chunk(self, chunk: bytes) -> bytes | None:
        if b"usageMetadata" in chunk or b"finishReason" in chunk or b'"error"' in chunk:
            return None
        return chunk

    def on_event(self, event: bytes) -> bytes | None:
        if (
            b"usageMetadata" not in event
            and b"finishReason" not in event
            and b'"error"' not in event
        ):
            return event
        _, data = event_data(event)
        with contextlib.suppress(orjson.JSONDecodeError):
            obj = orjson.loads(data)
            if isinstance(obj, dict) and "error" in obj:
                self.upstream_error = True
                return event
            _gemini_usage(self.usage, obj)
            if self.usage.finish_reason:
                self.complete = True
        return event
