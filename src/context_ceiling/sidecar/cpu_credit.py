"""A share of one core, as a credit: work that is worth doing while it is cheap (the sampled
exact counts of ``counting.strategy: bounded``, the answer checker's reading of answers) spends
the CPU seconds it took, the credit refills at ``share`` seconds per second, and while it is
negative no more of that work starts. So at the rates a pod serves with CPU to spare all of it
runs, and under load its cost stops at that share instead of growing with the traffic."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

__all__ = ["CpuCredit"]


class CpuCredit:
    """CPU seconds a kind of work may still spend: refilled at ``share`` seconds per second,
    saved up for at most ``burst`` seconds, and spent by :meth:`spend`. :meth:`ok` says whether
    the next piece may start; while the pod is ``busy`` (other requests in flight), it also
    needs a second, smaller credit, of ``busy_burst`` seconds, so at most that much of the
    saving is spent at once beside other requests. Safe to spend from one thread while another
    asks (the answer checker spends on its thread, the event loop asks).

    Why two credits: a quiet pod, serving a request now and then, saves up ten seconds of its
    share and affords a burst of long work (every answer of a short run read, a burst of long
    requests counted). But what a pod saved up while idle it would otherwise spend the moment
    traffic comes back, beside the requests that just arrived (ten seconds of the two 2% shares
    is 0.4 s of a core in the first seconds of load); while others are in flight at most a
    second's worth goes. Every piece of work spends from both; the busy credit's debt stops at
    its own size, so work done while quiet delays busy work by at most ``busy_burst`` seconds
    once the main credit is paid back. The first piece of work after a pause starts at once
    either way, however long it runs: its cost is paid after it (the credits may go
    negative)."""

    def __init__(
        self,
        share: float,
        clock: Callable[[], float] = time.monotonic,
        burst: float = 10.0,
        busy_burst: float | None = None,
    ) -> None:
        self.share = share
        self._clock = clock
        self._cap = share * burst
        #: the busy credit's size (and the most it may owe)
        self._busy_cap = share * (burst if busy_burst is None else min(burst, busy_burst))
        self._credit = self._cap
        self._busy = self._busy_cap
        self._at = clock()
        self._lock = threading.Lock()

    def ok(self, busy: bool = False) -> bool:
        """Whether the next piece of work may start (refilled to now first): the credit is not
        spent, and, ``busy``, neither is the busy credit."""
        with self._lock:
            self._refill()
            return self._credit >= 0 and (not busy or self._busy >= 0)

    def spend(self, seconds: float) -> None:
        """A piece of work took ``seconds`` of CPU (the credits refilled to now first, so time
        idle before it does not pay for it beyond what the caps save up)."""
        with self._lock:
            self._refill()
            self._credit -= seconds
            self._busy = max(-self._busy_cap, self._busy - seconds)

    def _refill(self) -> None:
        now = self._clock()
        gained = (now - self._at) * self.share
        self._credit = min(self._cap, self._credit + gained)
        self._busy = min(self._busy_cap, self._busy + gained)
        self._at = now
