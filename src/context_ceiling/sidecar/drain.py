"""Shutting down without cutting streams silently.

On SIGTERM the pod leaves its Service: readiness turns unready at once (``/readyz`` 503), so no
new stream starts in the grace period, and streams in flight keep relaying. A stream still
running when the grace is nearly spent (``limits.shutdown_grace_seconds`` less a margin, before
uvicorn cancels what is left) ends the way every other failed stream ends: the provider-shaped
error event, then the connection is aborted without the final chunk, recorded with the outcome
``shutdown``. The client's SDK raises instead of taking a truncated answer for a whole one, and
retries on another replica.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import Callable
from types import FrameType
from typing import Any, Protocol

#: streams are ended this long before uvicorn's grace runs out (at least; a tenth of the grace
#: for long ones), so the error event is written before the tasks are cancelled
MARGIN_S = 0.5


class Cuttable(Protocol):
    def cut(self) -> None: ...


class Drain:
    """The sidecar's shutdown state: whether it began, and the streams to end before the grace
    runs out."""

    def __init__(self, grace: float) -> None:
        self.grace = grace
        self.started_at: float | None = None
        self.streams: set[Cuttable] = set()
        self._timer: asyncio.TimerHandle | None = None

    @property
    def draining(self) -> bool:
        return self.started_at is not None

    def begin(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Start draining (idempotent): unready now, streams ended before the grace is out."""
        if self.started_at is not None:
            return
        self.started_at = time.monotonic()
        loop = loop or asyncio.get_running_loop()
        cut_in = max(0.0, self.grace - max(MARGIN_S, self.grace / 10))
        self._timer = loop.call_later(cut_in, self.cut_all)

    def cut_all(self) -> None:
        for stream in list(self.streams):
            stream.cut()

    def install(self, loop: asyncio.AbstractEventLoop) -> Callable[[], None]:
        """Chain a SIGTERM (and SIGINT) handler in front of the server's own (uvicorn's): the
        server still shuts down as before, and the drain starts with it. Returns the undo; a
        no-op off the main thread (an app embedded in tests)."""
        undo: list[Callable[[], None]] = []
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                previous = signal.getsignal(sig)
            except ValueError:
                continue

            def handler(signum: int, frame: FrameType | None, previous: Any = previous) -> None:
                loop.call_soon_threadsafe(self.begin, loop)
                if callable(previous):
                    previous(signum, frame)

            try:
                signal.signal(sig, handler)
            except ValueError:  # not the main thread
                continue

            def put_back(sig: signal.Signals = sig, previous: Any = previous) -> None:
                signal.signal(sig, previous)

            undo.append(put_back)

        def restore() -> None:
            if self._timer is not None:
                self._timer.cancel()
            for u in undo:
                with contextlib.suppress(ValueError):
                    u()

        return restore
