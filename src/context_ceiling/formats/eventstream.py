"""The AWS event stream (``application/vnd.amazon.eventstream``): the binary framing of
Bedrock's streamed answers (ConverseStream, InvokeModelWithResponseStream).

A message is a 12-byte prelude (total length, headers length, the prelude's CRC-32), typed
headers (``:message-type``, ``:event-type``, ``:exception-type``, ``:content-type``), the
payload and the message's CRC-32, all big-endian. The relay splits a stream at message ends
(the prelude says where) without decoding it; a tap decodes the few messages it reads. The
codec is small and fully specified; the tests hold it to botocore's own decoder.
"""

from __future__ import annotations

import binascii
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from context_ceiling.formats.framing import EventTooLarge, Splitter

__all__ = [
    "EventStreamFraming",
    "EventStreamSplitter",
    "Message",
    "decode",
    "encode",
    "messages",
]

_PRELUDE = 12
_MIN = _PRELUDE + 4
#: header value types (the AWS event stream's): their sizes where fixed
_FIXED = {0: 0, 1: 0, 2: 1, 3: 2, 4: 4, 5: 8, 8: 8, 9: 16}
_STRING, _BYTES = 7, 6


@dataclass(frozen=True, slots=True)
class Message:
    """One decoded message: its string headers and its payload."""

    headers: dict[str, str]
    payload: bytes

    @property
    def kind(self) -> str:
        """``:message-type``: ``event``, ``exception`` or ``error``."""
        return self.headers.get(":message-type", "event")

    @property
    def event(self) -> str:
        """``:event-type`` (an event) or ``:exception-type`` (an exception)."""
        return self.headers.get(":event-type") or self.headers.get(":exception-type") or ""

    def json(self) -> Any:
        """The payload's JSON (None when it is not JSON)."""
        try:
            return orjson.loads(self.payload)
        except orjson.JSONDecodeError:
            return None


def _headers(raw: bytes) -> dict[str, str]:
    out: dict[str, str] = {}
    pos = 0
    while pos < len(raw):
        n = raw[pos]
        name = raw[pos + 1 : pos + 1 + n].decode("utf-8", "replace")
        pos += 1 + n
        kind = raw[pos]
        pos += 1
        if kind in (_STRING, _BYTES):
            (size,) = struct.unpack_from(">H", raw, pos)
            value = raw[pos + 2 : pos + 2 + size]
            pos += 2 + size
            if kind == _STRING:
                out[name] = value.decode("utf-8", "replace")
        elif kind in _FIXED:
            pos += _FIXED[kind]
        else:
            raise ValueError(f"event stream header of unknown type {kind}")
    return out


def decode(frame: bytes) -> Message:
    """One whole message (its CRCs checked: ``ValueError`` when they do not match)."""
    if len(frame) < _MIN:
        raise ValueError("an event stream message is at least 16 bytes")
    total, hlen, crc = struct.unpack_from(">III", frame)
    if total != len(frame) or binascii.crc32(frame[:8]) != crc:
        raise ValueError("event stream prelude does not match the message")
    if binascii.crc32(frame[:-4]) != struct.unpack_from(">I", frame, total - 4)[0]:
        raise ValueError("event stream message CRC does not match")
    headers = _headers(frame[_PRELUDE : _PRELUDE + hlen])
    return Message(headers, frame[_PRELUDE + hlen : total - 4])


def encode(headers: dict[str, str], payload: bytes) -> bytes:
    """One message with string headers (what the sidecar itself sends: an exception that ends
    a stream it cannot finish)."""
    raw = b"".join(
        bytes([len(k.encode())])
        + k.encode()
        + bytes([_STRING])
        + struct.pack(">H", len(v.encode()))
        + v.encode()
        for k, v in headers.items()
    )
    total = _MIN + len(raw) + len(payload)
    head = struct.pack(">II", total, len(raw))
    prelude = head + struct.pack(">I", binascii.crc32(head))
    body = prelude + raw + payload
    return body + struct.pack(">I", binascii.crc32(body))


class EventStreamSplitter:
    """Splits at message ends, read from each message's prelude: linear in the bytes fed, an
    incomplete message held back up to the cap."""

    __slots__ = ("_buf", "_max")

    def __init__(self, max_event_bytes: int = 8 * 1024 * 1024) -> None:
        self._buf = b""
        self._max = max_event_bytes

    @property
    def idle(self) -> bool:
        return not self._buf

    @staticmethod
    def _walk(chunk: bytes, until: int) -> tuple[int, int] | None:
        """Message by message from each prelude's length, up to ``until``: (where the last
        message reached begins, where it ends); None at a prelude shorter than a message."""
        pos = last = 0
        while pos + 4 <= len(chunk) and pos < until:
            (total,) = struct.unpack_from(">I", chunk, pos)
            if total < _MIN:
                return None
            last, pos = pos, pos + total
        return last, pos

    @staticmethod
    def around(chunk: bytes, at: int) -> tuple[int, int]:
        walked = EventStreamSplitter._walk(chunk, at + 1)  # up to the message holding ``at``
        if walked is None or walked[1] <= at:
            return 0, len(chunk)
        return walked[0], min(walked[1], len(chunk))

    def whole(self, chunk: bytes) -> bool:
        walked = self._walk(chunk, len(chunk))
        return walked is not None and walked[1] == len(chunk)

    def feed(self, chunk: bytes) -> Iterator[bytes]:
        buf = self._buf + chunk if self._buf else chunk
        pos = 0
        while len(buf) - pos >= 4:
            (total,) = struct.unpack_from(">I", buf, pos)
            if total > self._max:
                raise EventTooLarge(f"an event exceeded {self._max} bytes")
            if total < _MIN:
                raise EventTooLarge("an event stream message shorter than its prelude")
            if len(buf) - pos < total:
                break
            yield buf[pos : pos + total]
            pos += total
        self._buf = buf[pos:]

    def flush(self) -> bytes:
        rest, self._buf = self._buf, b""
        return rest


def messages(raw: bytes) -> Iterator[Message]:
    """The messages of a whole stream (a message that does not decode is skipped)."""
    splitter = EventStreamSplitter(max(len(raw), _MIN))
    for frame in splitter.feed(raw):
        try:
            yield decode(frame)
        except ValueError:
            continue


class EventStreamFraming:
    """An event stream's framing; ``payload``: the JSON object a message stands for (None:
    skip it), for the answer checker and the capture store."""

    def __init__(self, payload: Callable[[Message], Any]) -> None:
        self._payload = payload

    @staticmethod
    def splitter(max_event_bytes: int) -> Splitter:
        return EventStreamSplitter(max_event_bytes)

    def events(self, raw: bytes) -> Iterator[Any]:
        for m in messages(raw):
            obj = self._payload(m)
            if obj is not None:
                yield obj
