"""Finished requests recorded in batches while others are in flight.

Recording a request (its metrics, log line, span, staleness check and answer job) is cheap on
its own, but done between two requests it runs with the request path's code and data pushed
out of the processor's caches, and costs more than the same work done for many requests in a
row (docs/benchmarks.md, "Recording in batches"). So while other requests are in flight a
finished one waits, and the waiting ones are recorded together: once ``size`` are waiting, once
the oldest has waited ``delay`` seconds, or once the last request in flight has finished. A
request that finishes alone (no other in flight, none waiting) is recorded at once, so at low
rates nothing waits, and every output is at most ``delay`` behind the traffic under load: far
inside a scrape interval, so what the metrics show over one is the same.

Everything here runs on the event loop (requests open and finish there); :meth:`Batches.flush`
is also called at shutdown, so nothing that finished is lost, and before a read of the metrics
(:meth:`Batches.flush_from_any_thread`, which hands the flush to the loop), so a scrape never
misses a request that finished.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

__all__ = ["Batches"]

T = TypeVar("T")


class Batches(Generic[T]):
    """Hands finished items to ``record``: one at a time, or in batches (oldest first) while
    others are in flight.

    ``record`` must not raise (a batch would lose the items after the one that did): the
    recorder logs its own failures. :meth:`opened` when a request starts, :meth:`closed` with
    its item when it finishes, exactly once each; ``size`` 1 records every item at once."""

    def __init__(self, record: Callable[[Sequence[T]], None], size: int, delay: float) -> None:
        self.record = record
        self.size = size
        self.delay = delay
        #: requests opened and not yet closed
        self.open = 0
        self._waiting: list[T] = []
        self._timer: asyncio.TimerHandle | None = None
        #: the loop the items finish on (seen when one first waited)
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def waiting(self) -> int:
        """Items finished and not yet recorded."""
        return len(self._waiting)

    def opened(self) -> None:
        self.open += 1

    def closed(self, item: T) -> None:
        """A request finished with ``item`` to record: now, or with the batch it joins."""
        self.open = max(0, self.open - 1)
        if self.size <= 1 or (self.open == 0 and not self._waiting):
            self.record((item,))
            return
        self._waiting.append(item)
        if len(self._waiting) >= self.size or self.open == 0:
            self.flush()
        elif self._timer is None:
            loop = self._loop = _running_loop()
            if loop is None:  # no loop to wait on (a request finished outside one)
                self.flush()
                return
            self._timer = loop.call_later(self.delay, self.flush)

    def flush(self) -> None:
        """Record every waiting item, oldest first."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        items, self._waiting = self._waiting, []
        if items:
            self.record(items)

    def flush_from_any_thread(self, timeout: float = 1.0) -> None:
        """Record every waiting item before returning, called from any thread (a read of the
        metrics): on the loop's own thread, or with the loop stopped, at once; from another
        thread, on the loop, waited on for up to ``timeout`` seconds (the items stay the
        loop's alone)."""
        loop = self._loop
        if not self._waiting:
            return
        if loop is None or not loop.is_running() or _running_loop() is loop:
            self.flush()
            return
        done = threading.Event()

        def flush_then_signal() -> None:
            try:
                self.flush()
            finally:
                done.set()

        try:
            loop.call_soon_threadsafe(flush_then_signal)
        except RuntimeError:  # the loop closed meanwhile: nothing appends any more
            self.flush()
            return
        done.wait(timeout)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
