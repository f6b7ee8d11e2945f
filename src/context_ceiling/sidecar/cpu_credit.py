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
    saved up for at most ``burst`` seconds (a quiet pod still affords a burst of long work), and
    spent by :meth:`spend`. :meth:`ok` says whether the next piece may start. Safe to spend from
    one thread while another asks (the answer checker spends on its thread, the event loop
    asks)."""

    def __init__(
        self, share: float, clock: Callable[[], float] = time.monotonic, burst: float = 10.0
    ) -> None:
        self.share = share
        self._clock = clock
        self._cap = share * burst
        self._credit = self._cap
        self._at = clock()
        self._lock = threading.Lock()

    def ok(self) -> bool:
        """Whether the credit is not spent (refilled to now first)."""
        with self._lock:
            self._refill()
            return self._credit >= 0

    def spend(self, seconds: float) -> None:
        """A piece of work took ``seconds`` of CPU (the credit refilled to now first, so time
        idle before it does not pay for it beyond what the cap saves up)."""
        with self._lock:
            self._refill()
            self._credit -= seconds

    def _refill(self) -> None:
        now = self._clock()
        self._credit = min(self._cap, self._credit + (now - self._at) * self.share)
        self._at = now
