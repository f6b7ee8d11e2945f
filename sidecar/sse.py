"""Split a byte stream into whole Server-Sent Events without buffering the response.

Events end at a blank line (``\\n\\n``, ``\\r\\n\\r\\n`` or ``\\r\\r``). Each complete event is
yielded as the exact bytes that arrived (terminator included), so forwarding them unchanged is
byte-identical to forwarding the raw stream; only an incomplete tail is held back.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

_BOUNDARY = re.compile(rb"\r\n\r\n|\n\n|\r\r")


class EventSplitter:
    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, chunk: bytes) -> Iterator[bytes]:
        buf = self._buf + chunk if self._buf else chunk
        start = 0
        for m in _BOUNDARY.finditer(buf):
            yield buf[start : m.end()]
            start = m.end()
        self._buf = buf[start:]

    def flush(self) -> bytes:
        rest, self._buf = self._buf, b""
        return rest


def event_data(event: bytes) -> tuple[bytes | None, bytes]:
    """The ``event:`` name (or None) and the joined ``data:`` payload of one event."""
    name: bytes | None = None
    data: list[bytes] = []
    for line in event.splitlines():
        if line.startswith(b"data:"):
            data.append(line[6:] if line[5:6] == b" " else line[5:])
        elif line.startswith(b"event:"):
            name = line[6:].strip()
    return name, b"\n".join(data)
