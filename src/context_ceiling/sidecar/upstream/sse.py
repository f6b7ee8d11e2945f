"""Split a byte stream into whole Server-Sent Events without buffering the response.

Events end at a blank line (``\\n\\n``, ``\\r\\n\\r\\n`` or ``\\r\\r``). Each complete event is
yielded as the exact bytes that arrived (terminator included), so forwarding them unchanged is
byte-identical to forwarding the raw stream; only an incomplete tail is held back.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from context_ceiling.core.errors import CeilingError

_BOUNDARY = re.compile(rb"\r\n\r\n|\n\n|\r\r")


class EventTooLarge(CeilingError, ValueError):
    """One event grew past the cap without a boundary."""


class EventSplitter:
    """Linear in the bytes fed: a held-back tail is never scanned again from its start (only
    its last 3 bytes, where a boundary split across reads can begin), and it is capped."""

    __slots__ = ("_max", "_parts", "_size")

    def __init__(self, max_event_bytes: int = 8 * 1024 * 1024) -> None:
        self._parts: list[bytes] = []  # an incomplete event, as it arrived
        self._size = 0
        self._max = max_event_bytes

    @property
    def idle(self) -> bool:
        """No incomplete event is held back: a read that ends on a blank line is whole events."""
        return not self._parts

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
