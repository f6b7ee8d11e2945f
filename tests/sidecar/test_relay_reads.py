"""The stream relay's fast path: a read of whole events that no tap needs is forwarded as one,
without splitting it into events. Property: for every protocol's streams, cut into reads at any
points, the client gets byte for byte what the event-by-event path gives it, and the tap ends
with the same usage, completeness and upstream-error verdict."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from context_ceiling.formats.anthropic import MessagesStreamTap as AnthropicStreamTap
from context_ceiling.formats.framing import EventSplitter, Splitter
from context_ceiling.formats.gemini import GenerateStreamTap as GeminiStreamTap
from context_ceiling.formats.openai_chat import ChatStreamTap as OpenAIStreamTap
from context_ceiling.formats.responses import ResponsesStreamTap
from context_ceiling.sidecar.upstream.relay import Tap, forward_read

TEXTS = st.sampled_from(["hel", "lo", " usage", "error: none", "[DONE] is text", 'a "quote"', ""])


def _sse(obj: Any, name: str | None = None, sep: str = "\n\n", spaced: bool | str = False) -> bytes:
    head = f"event: {name}\n" if name else ""
    # spaced: as Python's json writes it; "odd": a space before the colon too (legal JSON)
    colon = " : " if spaced == "odd" else ": " if spaced else ":"
    text = json.dumps(obj, separators=(", " if spaced else ",", colon))
    return (head + "data: " + text + sep).encode()


SPACINGS: list[bool | str] = [False, True, "odd"]


@st.composite
def openai_stream(draw: st.DrawFn) -> list[bytes]:
    base = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "gpt-4o"}
    nulls = draw(st.booleans())  # an upstream asked for include_usage: "usage":null everywhere
    out = []
    for _ in range(draw(st.integers(0, 8))):
        kind = draw(st.sampled_from(["delta", "delta", "finish", "usage", "error"]))
        choice: dict[str, Any] = {"index": 0, "delta": {"content": draw(TEXTS)}}
        choice["finish_reason"] = "stop" if kind == "finish" else None
        ev: dict[str, Any] = {**base, "choices": [choice]}
        if kind == "usage":
            ev = {**base, "choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 2}}
        elif kind == "error":
            ev = {"error": {"message": "overloaded", "type": "server_error"}}
        elif nulls:
            ev["usage"] = None
        sep = draw(st.sampled_from(["\n\n", "\n\n", "\r\n\r\n"]))
        out.append(_sse(ev, sep=sep, spaced=draw(st.sampled_from(SPACINGS))))
    if draw(st.booleans()):
        out.append(b"data: [DONE]\n\n")
    return out


@st.composite
def anthropic_stream(draw: st.DrawFn) -> list[bytes]:
    out = [
        _sse(
            {"type": "message_start", "message": {"model": "claude", "usage": {"input_tokens": 5}}},
            "message_start",
        )
    ]
    for _ in range(draw(st.integers(0, 6))):
        kind = draw(st.sampled_from(["delta", "delta", "ping", "stop_block", "error"]))
        if kind == "delta":
            delta = {"type": "text_delta", "text": draw(TEXTS)}
            out.append(_sse({"type": "content_block_delta", "delta": delta}, "content_block_delta"))
        elif kind == "ping":
            out.append(_sse({"type": "ping"}, "ping"))
        elif kind == "stop_block":
            out.append(_sse({"type": "content_block_stop", "index": 0}, "content_block_stop"))
        else:
            out.append(_sse({"type": "error", "error": {"type": "overloaded_error"}}, "error"))
    if draw(st.booleans()):
        delta = {"type": "message_delta", "delta": {"stop_reason": "end_turn"}}  # type: ignore[dict-item]
        out.append(_sse({**delta, "usage": {"output_tokens": 7}}, "message_delta"))
        out.append(_sse({"type": "message_stop"}, "message_stop"))
    return out


@st.composite
def responses_stream(draw: st.DrawFn) -> list[bytes]:
    out = []
    for _ in range(draw(st.integers(0, 6))):
        out.append(_sse({"delta": draw(TEXTS)}, "response.output_text.delta"))
    end = draw(st.sampled_from(["response.completed", "response.incomplete", "error", None]))
    if end is not None:
        resp = {"model": "gpt-4o", "status": "completed", "usage": {"input_tokens": 3}}
        out.append(_sse({"response": resp}, end))
    return out


@st.composite
def gemini_stream(draw: st.DrawFn) -> list[bytes]:
    out = []
    for _ in range(draw(st.integers(0, 6))):
        part = {"content": {"parts": [{"text": draw(TEXTS)}]}}
        out.append(_sse({"candidates": [part]}))
    if draw(st.booleans()):
        last = {"candidates": [{"finishReason": "STOP"}], "usageMetadata": {"promptTokenCount": 4}}
        out.append(_sse(last))
    if draw(st.booleans()):
        out.append(_sse({"error": {"code": 503}}))
    return out


class EventByEvent:
    """The same tap with the fast path off: every read is split into events."""

    whole_reads = False

    def __init__(self, inner: Tap) -> None:
        self.inner = inner

    def on_chunk(self, chunk: bytes) -> bytes | None:
        return None

    def on_event(self, event: bytes) -> bytes | None:
        return self.inner.on_event(event)


def _relay(tap: Any, reads: list[bytes], splitter: Splitter | None = None) -> bytes:
    splitter = splitter or EventSplitter()
    return b"".join(forward_read(splitter, tap, r) for r in reads)


def _cuts(data: bytes, draw: st.DrawFn) -> list[bytes]:
    """``data`` cut into reads: mostly on event boundaries (as upstreams send), sometimes not."""
    points = sorted(draw(st.sets(st.integers(1, max(1, len(data) - 1)), max_size=6)))
    bounds = [0, *(p for p in points if p < len(data)), len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds) if b > a]


def _check(make: Callable[[], Any], events: list[bytes], draw: st.DrawFn) -> None:
    # an event per read, the whole answer in one read (a fast upstream), or cut anywhere
    how = draw(st.sampled_from(["events", "one", "cuts"]))
    joined = b"".join(events)
    reads = (
        events if how == "events" else [joined] if how == "one" and joined else _cuts(joined, draw)
    )
    fast, slow = make(), make()
    assert _relay(fast, reads) == _relay(EventByEvent(slow), reads)
    assert (fast.usage, fast.complete, fast.upstream_error) == (
        slow.usage,
        slow.complete,
        slow.upstream_error,
    )


@settings(max_examples=300, deadline=None)
@given(st.data(), st.booleans())
def test_openai_reads_forwarded_whole_match_event_by_event(
    data: st.DataObject, injected: bool
) -> None:
    events = data.draw(openai_stream())
    _check(lambda: OpenAIStreamTap(injected), events, data.draw)  # type: ignore[arg-type]


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_anthropic_reads_forwarded_whole_match_event_by_event(data: st.DataObject) -> None:
    _check(AnthropicStreamTap, data.draw(anthropic_stream()), data.draw)  # type: ignore[arg-type]


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_responses_reads_forwarded_whole_match_event_by_event(data: st.DataObject) -> None:
    _check(ResponsesStreamTap, data.draw(responses_stream()), data.draw)  # type: ignore[arg-type]


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_gemini_reads_forwarded_whole_match_event_by_event(data: st.DataObject) -> None:
    _check(GeminiStreamTap, data.draw(gemini_stream()), data.draw)  # type: ignore[arg-type]


@settings(max_examples=100, deadline=None)
@given(st.data(), st.integers(1, 12), st.sampled_from(["events", "one", "cuts"]))
def test_bedrock_reads_forwarded_whole_match_frame_by_frame(
    data: st.DataObject, deltas: int, how: str
) -> None:
    """The same property on the AWS event stream's binary frames (Converse)."""
    from context_ceiling.formats.bedrock import ConverseStreamTap
    from context_ceiling.formats.eventstream import EventStreamSplitter
    from testkit.doubles.bedrock_provider import BedrockProviderDouble

    frames = BedrockProviderDouble(text=" ".join(["w"] * deltas)).converse_events()
    joined = b"".join(frames)
    reads = (
        frames if how == "events" else [joined] if how == "one" else _cuts(joined, data.draw)  # type: ignore[arg-type]
    )
    fast, slow = ConverseStreamTap(), ConverseStreamTap()
    out = _relay(fast, reads, EventStreamSplitter())
    assert out == _relay(EventByEvent(slow), reads, EventStreamSplitter()) == joined
    assert (fast.usage, fast.complete) == (slow.usage, slow.complete) and fast.complete


def test_a_plain_delta_is_forwarded_without_being_split() -> None:
    """The fast path is taken (not only equivalent): a read of plain deltas never reaches
    ``on_event``, and the injected ``"usage":null`` is still removed."""
    seen: list[bytes] = []

    class Spy(OpenAIStreamTap):
        def on_event(self, event: bytes) -> bytes | None:
            seen.append(event)
            return super().on_event(event)

    tap = Spy(injected=True)
    tap.usage.response_model = "gpt-4o"  # the first event, already seen
    read = b'data: {"choices":[{"delta":{"content":"a"},"finish_reason":null}],"usage":null}\n\n'
    out = forward_read(EventSplitter(), tap, read * 3)
    assert seen == []
    assert out == read.replace(b',"usage":null', b"") * 3
    spaced = b'data: {"choices": [{"delta": {"content": "a"}, "finish_reason": null}], "usage": null}\n\n'
    assert forward_read(EventSplitter(), tap, spaced) == spaced.replace(b', "usage": null', b"")
    assert seen == []  # spaced nulls are plain too


def test_a_read_of_many_events_splits_off_only_the_ones_the_tap_reads() -> None:
    """A whole answer that arrived in one read (a fast upstream, or reads coalesced under load):
    the read is cut only around the events the tap reads (the first, with the model; the
    finish, the usage, the end), found by one byte scan each, so only they reach ``on_event``,
    the plain deltas between them leave as one part, and the bytes forwarded are the
    event-by-event ones."""
    seen: list[bytes] = []
    scans: list[int] = []

    class Spy(OpenAIStreamTap):
        def on_event(self, event: bytes) -> bytes | None:
            seen.append(event)
            return super().on_event(event)

        def needed(self, chunk: bytes) -> int:
            scans.append(len(chunk))
            return super().needed(chunk)

    first = _sse({"model": "gpt-4o", "choices": [{"delta": {"role": "assistant"}}], "usage": None})
    delta = _sse({"choices": [{"delta": {"content": "a"}, "finish_reason": None}], "usage": None})
    end = _sse({"choices": [{"delta": {}, "finish_reason": "stop"}], "usage": None})
    usage = _sse({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 64}})
    events = [first, *[delta] * 64, end, usage, b"data: [DONE]\n\n"]
    read = b"".join(events)
    tap, slow = Spy(injected=True), OpenAIStreamTap(injected=True)
    assert forward_read(EventSplitter(), tap, read) == _relay(EventByEvent(slow), [read])
    assert (tap.usage, tap.complete) == (slow.usage, slow.complete) and tap.complete
    assert tap.usage.input_tokens == 5
    assert seen == [first, end, usage, b"data: [DONE]\n\n"]
    # one scan per event read, each of what is left: the whole read once, then its tail
    assert len(scans) == 4 and scans[0] == len(read), scans
    assert sum(scans[1:]) < len(read) + 3 * len(end), scans


def test_an_oddly_spaced_finish_before_a_usage_is_still_read() -> None:
    """A finish reason spaced otherwise (``"finish_reason" : "stop"``, legal JSON) ahead of a
    usage written the usual way, in one read: the scan cannot place the finish by its usual
    form, so it reads from the key's first mention on and the finish is not forwarded unread."""
    first = _sse({"model": "gpt-4o", "choices": [{"delta": {"role": "assistant"}}]})
    delta = _sse({"choices": [{"delta": {"content": "a"}, "finish_reason": None}]})
    end = _sse({"choices": [{"delta": {}, "finish_reason": "stop"}]}, spaced="odd")
    usage = _sse({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 3}})
    read = b"".join([first, *[delta] * 8, end, usage, b"data: [DONE]\n\n"])
    tap, slow = OpenAIStreamTap(False), OpenAIStreamTap(False)
    assert forward_read(EventSplitter(), tap, read) == _relay(EventByEvent(slow), [read])
    assert tap.usage.finish_reason == slow.usage.finish_reason == "stop"
    assert tap.usage == slow.usage and tap.complete


def test_a_special_event_mid_read_is_still_split_off() -> None:
    """A read whose middle holds an event the tap reads (an upstream error between deltas) is
    halved once the ends are taken off: the error is seen, the bytes are the event-by-event
    ones."""
    first = _sse({"model": "gpt-4o", "choices": [{"delta": {"role": "assistant"}}]})
    delta = _sse({"choices": [{"delta": {"content": "a"}, "finish_reason": None}]})
    error = _sse({"error": {"message": "overloaded", "type": "server_error"}})
    read = b"".join([first, *[delta] * 20, error, *[delta] * 20])
    tap, slow = OpenAIStreamTap(False), OpenAIStreamTap(False)
    assert forward_read(EventSplitter(), tap, read) == _relay(EventByEvent(slow), [read])
    assert tap.upstream_error and slow.upstream_error


def test_a_splitter_bounds_the_event_around_an_offset() -> None:
    """Both framings find the event of a read of whole events that holds a given byte: its
    first byte and the byte past its end, so what lies before it is whole events."""
    from context_ceiling.formats.eventstream import EventStreamSplitter, encode

    events = [_sse({"n": k}) for k in range(5)]
    sse = b"".join(events)
    starts = [sum(map(len, events[:k])) for k in range(6)]
    for k in range(5):
        for at in (starts[k], starts[k] + 3, starts[k + 1] - 3):
            assert EventSplitter.around(sse, at) == (starts[k], starts[k + 1])
    # boundaries a byte search for a blank line does not see: a wider span, split by feed()
    crlf = b"".join(e.replace(b"\n\n", b"\r\n\r\n") for e in events)
    assert EventSplitter.around(crlf, len(crlf) // 2) == (0, len(crlf))
    frames = [encode({":event-type": "chunk"}, b'{"k": %d}' % k) for k in range(5)]
    binary = b"".join(frames)
    starts = [sum(map(len, frames[:k])) for k in range(6)]
    for k in range(5):
        assert EventStreamSplitter.around(binary, starts[k] + 5) == (starts[k], starts[k + 1])
