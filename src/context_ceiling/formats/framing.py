"""How a streamed answer's bytes split into events: Server-Sent Events (OpenAI, Anthropic,
Gemini) and the AWS event stream (Bedrock's binary frames).

A :class:`Framing` hands the relay a :class:`Splitter` per stream and reads the JSON payloads
of a whole relayed stream for the answer checker and the capture store. Each complete event is
yielded as the exact bytes that arrived, so forwarding them unchanged is byte-identical to
forwarding the raw stream; only an incomplete tail is held back, and it is capped.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any, Protocol

import orjson

from context_ceiling.core.errors import CeilingError

__all__ = [
    "SSE",
    "EventSplitter",
    "EventTooLarge",
    "Framing",
    "ServerSentEvents",
    "Splitter",
    "json_events",
]

_BOUNDARY = re.compile(rb"\r\n\r\n|\n\n|\r\r")


class EventTooLarge(CeilingError, ValueError):
    """One event grew past the cap without a boundary."""


class Splitter(Protocol):
    """Splits one stream's reads into whole events, holding back only an incomplete tail."""

    @property
    def idle(self) -> bool:
        """No incomplete event is held back."""
        ...

    def whole(self, chunk: bytes) -> bool:
        """Whether ``chunk``, read while :attr:`idle`, ends on an event boundary (then it is
        whole events and a tap may forward it without splitting it)."""
        ...

    def around(self, chunk: bytes, at: int) -> tuple[int, int]:
        """Where the event of ``chunk`` (whole events: :meth:`whole`) that holds offset ``at``
        begins and ends; a span over more events (up to all of ``chunk``) where a boundary
        cannot be told by a byte search, which the splitter's own :meth:`feed` then splits."""
        ...

    def feed(self, chunk: bytes) -> Iterator[bytes]:
        """The events ``chunk`` completes, as the bytes that arrived."""
        ...

    def flush(self) -> bytes:
        """What is held back at the end (empty: the stream ended on a boundary)."""
        ...


class Framing(Protocol):
    """A stream's framing: its splitter, and the JSON payloads of a whole stream."""

    def splitter(self, max_event_bytes: int) -> Splitter: ...

    def events(self, raw: bytes) -> Iterator[Any]:
        """The JSON payloads of a whole relayed stream, in order (anything that is not a JSON
        payload skipped)."""
        ...


class EventSplitter:
    """Server-Sent Events end at a blank line (``\\n\\n``, ``\\r\\n\\r\\n`` or ``\\r\\r``).
    Linear in the bytes fed: a held-back tail is never scanned again from its start (only its
    last 3 bytes, where a boundary split across reads can begin), and it is capped."""

    __slots__ = ("_max", "_parts", "_size")

    def __init__(self, max_event_bytes: int = 8 * 1024 * 1024) -> None:
        self._parts: list[bytes] = []  # an incomplete event, as it arrived
        self._size = 0
        self._max = max_event_bytes

    @property
    def idle(self) -> bool:
        """No incomplete event is held back: a read that ends on a blank line is whole events."""
        return not self._parts

    @staticmethod
    def whole(chunk: bytes) -> bool:
        return chunk.endswith(b"\n\n")

    @staticmethod
    def around(chunk: bytes, at: int) -> tuple[int, int]:
        # a data line cannot hold a raw newline (JSON escapes it): a blank line ends an event.
        # "\r\n\r\n" and "\r\r" are boundaries too, but a search for them is not needed: a
        # span that holds one is split by feed()
        before = chunk.rfind(b"\n\n", 0, at)
        after = chunk.find(b"\n\n", at)
        return (before + 2 if before >= 0 else 0, after + 2 if after >= 0 else len(chunk))

    def feed(self, chunk: bytes) -> Iterator[bytes]:
        if self._parts:
            # a boundary may straddle the previous read: look from its last 3 bytes on
            tail = self._parts[-1][-3:]
            m = _BOUNDARY.search(tail + chunk)
            if m is None:
                self._parts.append(chunk)
                self._size += len(chunk)
                if self._size > self._max:
                    raise EventTooLarge(f"an event exceeded {self._max} bytes")
                return
            buf = b"".join(self._parts) + chunk
            self._parts, self._size = [], 0
            start_at = len(buf) - len(chunk) - len(tail)
        else:
            buf, start_at = chunk, 0
        start = 0
        for m in _BOUNDARY.finditer(buf, start_at):
            yield buf[start : m.end()]
            start = m.end()
        rest = buf[start:]
        if rest:
            if len(rest) > self._max:
                raise EventTooLarge(f"an event exceeded {self._max} bytes")
            self._parts, self._size = [rest], len(rest)

    def flush(self) -> bytes:
        rest = b"".join(self._parts)
        self._parts, self._size = [], 0
        return rest


def json_events(raw: bytes) -> Iterator[Any]:
    """The JSON ``data:`` payloads of a whole relayed SSE stream, in order (``[DONE]`` and
    anything that is not JSON skipped)."""
    for line in raw.split(b"\n"):
        if line.startswith(b"data:"):
            data = line[5:].strip()
            if data[:1] in (b"{", b"["):
                try:
                    yield orjson.loads(data)
                except orjson.JSONDecodeError:
                    continue


class ServerSentEvents:
    """The framing of every SSE stream (``text/event-stream``)."""

    @staticmethod
    def splitter(max_event_bytes: int) -> Splitter:
        return EventSplitter(max_event_bytes)

    @staticmethod
    def events(raw: bytes) -> Iterator[Any]:
        return json_events(raw)


SSE: Framing = ServerSentEvents()
