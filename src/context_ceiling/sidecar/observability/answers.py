"""The answer checker: each relayed answer's signals (why it stopped, what a client would trip
over: :mod:`context_ceiling.sidecar.observability.answer_signals`) read on one thread, off the
request path, and counted by model, workload, the request's fill bucket and its side of the
running ceiling, so the rate of a signal can be read against fill in live traffic: a rate, never
a judgement of one answer.

Nothing here keeps prompt or answer text: the request's expectations (its tool names and
schemas) and the response's bytes are handed to the checker thread after the response has been
relayed, read there, counted, and dropped. The request path only appends references.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from context_ceiling.formats.base import Answer, Expect, Format
from context_ceiling.sidecar.cpu_credit import CpuCredit
from context_ceiling.sidecar.observability.answer_signals import (
    Validators,
    problems,
    read_answer,
    stop_of,
)

__all__ = [
    "SIDES",
    "UNREAD_PER_JOB",
    "YIELD_AFTER",
    "AnswerChecker",
    "AnswerLabels",
    "Counted",
    "HeldBytes",
    "Job",
]

log = logging.getLogger(__name__)


class HeldBytes:
    """Answer bytes held at once, bounded: kept by streams while they are relayed, and queued
    for the checker. :meth:`take` is called on the event loop (each kept stream read, each
    queued answer), :meth:`give` there and on the checker thread."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self._lock = threading.Lock()

    def take(self, n: int) -> bool:
        """Hold ``n`` more bytes if that stays within the limit."""
        with self._lock:
            if self.held + n > self.limit:
                return False
            self.held += n
            return True

    def give(self, n: int) -> None:
        with self._lock:
            self.held -= n


#: the request's input against its running ceiling (``none``: no ceiling for its model/workload)
SIDES: tuple[str, ...] = ("below", "above", "none")


class AnswerLabels(NamedTuple):
    """Where an answer counts: its model, workload, fill bucket and side of the ceiling."""

    model: str
    workload: str
    fill: str
    side: str


@dataclass(slots=True)
class Job:
    """One relayed answer to read: where it counts, and what to read. An answer that is not
    read is no job: :meth:`AnswerChecker.count_unread`."""

    labels: AnswerLabels
    #: the route's format (its framing splits a stream)
    shape: Format
    stream: bool
    expect: Expect
    #: the response body, or a stream's upstream reads as they arrived (joined in the thread)
    raw: bytes | list[bytes]
    #: what the relay's usage reader or tap read: the stop reason, output and reasoning tokens
    finish: str | None = None
    output_tokens: int | None = None
    reasoning_tokens: int | None = None
    #: the bytes of ``raw`` held against :class:`HeldBytes` while it waits (set by submit)
    size: int = 0


class Counted(Protocol):
    """Where the checker counts (the sidecar's :class:`~context_ceiling.sidecar.observability.metrics.Metrics`)."""

    def answer(
        self,
        where: AnswerLabels,
        signals: list[str],
        output: int | None,
        reasoning: int | None,
        n: int = 1,
    ) -> None: ...

    def answer_skipped(self, reason: str, n: int = 1) -> None: ...


YIELD_AFTER = 0.0002
"""Thread CPU seconds the checker reads answers for before it hands the interpreter lock back
to the event loop (a slice of several small answers, or one large one)."""

UNREAD_PER_JOB = 64
"""Answers counted by their stop reason alone that may wait per queued job (a tuple each)."""


class AnswerChecker:
    """Checks relayed answers on one thread, off the request path.

    :meth:`submit` (on the event loop) only appends to a bounded queue; the thread wakes every
    ``interval`` seconds and checks and counts what queued meanwhile. Waking once per interval
    rather than once per answer keeps the thread hand-off (a context switch and the interpreter
    lock changing hands, about as much CPU as a small request's whole check) off each request; the
    counters lag by at most ``interval``. A full queue drops the check and counts it. An answer
    not read (:meth:`count_unread`: most of them once the CPU share is spent) is queued as a
    tuple and counted by label set, not one by one."""

    def __init__(
        self,
        sink: Counted,
        queue_size: int = 256,
        interval: float = 0.05,
        held: HeldBytes | None = None,
        credit: CpuCredit | None = None,
    ) -> None:
        self.sink = sink
        #: the share of a core the thread may take (answers.cpu_share); None: no limit
        self.credit = credit
        #: answer bytes held at once, relaying and queued (answers.max_held_mib)
        self.held = held or HeldBytes(64 * 2**20)
        self.size = queue_size
        self.interval = interval
        self._jobs: deque[Job] = deque()
        #: answers counted by their stop reason alone, waiting to be tallied
        self._unread: deque[tuple[AnswerLabels, str | None, int | None, int | None, str]] = deque()
        #: answers queued, and answers counted (each written by one thread only)
        self._submitted = 0
        self._done = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.validators = Validators()

    def reading(self, busy: bool = False) -> bool:
        """Whether the next answer is read whole: the checker's CPU credit is not spent (``busy``:
        other requests are in flight, :meth:`CpuCredit.ok`). Asked before a stream's events are
        kept, so an answer past the share costs neither the keeping nor the reading; it is
        counted by its stop reason (``cpu``)."""
        return self.credit is None or self.credit.ok(busy)

    def hold(self, raw: bytes | list[bytes]) -> int | None:
        """Hold an answer's bytes against :class:`HeldBytes` until it is read: its size, or
        None when that would pass the limit (then it is counted by its stop alone, ``busy``)."""
        size = len(raw) if isinstance(raw, bytes) else sum(map(len, raw))
        return size if self.held.take(size) else None

    def submit(self, job: Job) -> None:
        """Queue ``job`` to be read; its bytes held already (``job.size``, :meth:`hold`) or
        held here."""
        if not job.size:
            size = self.hold(job.raw)
            if size is None:  # too much held already: counted by its stop alone
                self.count_unread(
                    job.labels, job.finish, job.output_tokens, job.reasoning_tokens, "busy"
                )
                return
            job.size = size
        if len(self._jobs) >= self.size:
            self.held.give(job.size)
            self.sink.answer_skipped("queue_full")
            return
        self._jobs.append(job)
        self._submitted += 1

    def count_unread(
        self,
        labels: AnswerLabels,
        finish: str | None,
        output: int | None,
        reasoning: int | None,
        unread: str,
    ) -> None:
        """An answer that is not read (``unread``: ``cpu``, ``too_large`` or ``busy``), counted by
        its stop reason ``finish`` and its tokens: one tuple appended here (on the event loop),
        tallied by label set on the thread."""
        if len(self._unread) >= self.size * UNREAD_PER_JOB:
            self.sink.answer_skipped("queue_full")
            return
        self._unread.append((labels, finish, output, reasoning, unread))
        self._submitted += 1

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="answer-checker", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Count what is queued, then end the thread."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout)
            self._thread = None

    def join(self, timeout: float = 10.0) -> None:
        """Until every answer queued so far is counted (tests; shutdown uses :meth:`stop`)."""
        target = self._submitted
        deadline = time.monotonic() + timeout
        while self._done < target and time.monotonic() < deadline:
            time.sleep(self.interval / 5)

    def check(self, job: Job) -> tuple[list[str], int | None, int | None]:
        """(the answer's signals: its stop, then its problems; output tokens; reasoning
        tokens)."""
        raw = job.raw if isinstance(job.raw, bytes) else b"".join(job.raw)
        a = read_answer(job.shape, raw, job.stream)
        if a.finish is None:
            a.finish = job.finish
        signals = [stop_of(a), *problems(a, job.expect, self.validators)]
        return signals, job.output_tokens, job.reasoning_tokens

    def _one(self, job: Job) -> None:
        try:
            signals, out, reasoning = self.check(job)
        except Exception:  # a check must never take the thread down
            log.exception("answer check failed")
            self.sink.answer_skipped("error")
            return
        self.sink.answer(job.labels, signals, out, reasoning)

    def _charge(self, since: float) -> float:
        """Spend the thread's CPU since ``since`` (its :func:`time.thread_time`) from the
        credit; the new mark."""
        if self.credit is None:
            return since
        now = time.thread_time()
        self.credit.spend(now - since)
        return now

    def _drain(self) -> None:
        if not self._jobs and not self._unread:
            return  # a wake with nothing queued costs nothing worth charging
        # the credit pays for all the thread's CPU while it drains, not only the reading: the
        # counting and the interpreter lock changing hands around each answer cost as much as
        # the reading again, and a share that left them out bounded a fraction of the cost
        mark = held_since = time.thread_time()
        while self._jobs:
            job = self._jobs.popleft()
            try:
                self._one(job)
            finally:
                self.held.give(job.size)
                self._done += 1
                mark = self._charge(mark)
            # hand the interpreter lock back once the thread has held it for a slice: a
            # request waiting on it waits a slice and one answer's read, not the interpreter's
            # whole switch interval; handing it back after every answer made each small answer
            # cost the event loop a lock hand-off, more than reading it
            if time.thread_time() - held_since >= YIELD_AFTER:
                time.sleep(0)
                held_since = time.thread_time()
        tally: dict[tuple[AnswerLabels, str | None, str], list[int]] = {}
        while self._unread:
            labels, finish, output, reasoning, unread = self._unread.popleft()
            t = tally.setdefault((labels, finish, unread), [0, 0, 0])
            t[0] += 1
            t[1] += output or 0
            t[2] += reasoning or 0
        for (labels, finish, unread), (n, output, reasoning) in tally.items():
            try:
                self.sink.answer_skipped(unread, n)
                self.sink.answer(labels, [stop_of(Answer(finish=finish))], output, reasoning, n)
            except Exception:  # counting must never take the thread down
                log.exception("answer count failed")
            finally:
                self._done += n
        self._charge(mark)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._drain()
        self._drain()
