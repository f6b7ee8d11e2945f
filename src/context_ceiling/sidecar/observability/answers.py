"""Answer signals: what a proxy can tell about an answer without a judge model.

Per answer of a measured generation route (every API, streams included): why it stopped (a
normal stop, truncated at the output cap, a content filter, a refusal, tool calls, anything
else), and the problems any client would trip over: an empty answer, output that is not the JSON
(or not valid against the JSON schema) the request asked for, tool calls that name a tool the
request did not offer or whose arguments are not JSON or not valid against the tool's
parameters, and degenerate repetition (a short span repeated to the end). Each is counted by
model, workload, the request's fill bucket and its side of the running ceiling, so the rate of a
signal can be read against fill in live traffic: a rate, never a judgement of one answer.

Nothing here keeps prompt or answer text: the request's expectations (its tool names and
schemas) and the response's bytes are handed to one checker thread after the response has been
relayed, read there, counted, and dropped. The request path only appends references.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, Protocol

import orjson

from context_ceiling.core.vocabulary import Shape
from context_ceiling.formats import format_of
from context_ceiling.formats.base import Answer, Expect, Format
from context_ceiling.sidecar.cpu_credit import CpuCredit

__all__ = [
    "PROBLEMS",
    "SIDES",
    "SIGNALS",
    "STOPS",
    "AnswerChecker",
    "AnswerLabels",
    "Counted",
    "HeldBytes",
    "Job",
    "expectations",
    "problems",
    "read_answer",
    "repetition",
    "stop_of",
]

log = logging.getLogger(__name__)

Stop = Literal["stop", "truncated", "content_filter", "refusal", "tool_calls", "other_stop"]
#: why an answer ended: exactly one per answer, so these partition the answers
STOPS: tuple[Stop, ...] = (
    "stop",
    "truncated",
    "content_filter",
    "refusal",
    "tool_calls",
    "other_stop",
)
#: what was wrong with an answer, any number per answer
PROBLEMS: tuple[str, ...] = (
    "empty",
    "invalid_json",
    "schema_mismatch",
    "unknown_tool",
    "invalid_tool_arguments",
    "tool_schema_mismatch",
    "repetition",
)
#: the ``signal`` label's values
SIGNALS: tuple[str, ...] = (*STOPS, *PROBLEMS)
#: the request's input against its running ceiling (``none``: no ceiling for its model/workload)
SIDES: tuple[str, ...] = ("below", "above", "none")

#: a schema larger than this (serialized) is not validated against: only JSON-ness is checked
MAX_SCHEMA_BYTES = 64 * 1024
#: keywords whose values are regular expressions the client wrote: a schema holding one is not
#: validated (Python's ``re`` holds the interpreter lock while it matches, so a pathological
#: pattern would stall the proxy), only checked for JSON
_REGEX_KEYWORDS = frozenset({"pattern", "patternProperties", "propertyNames"})
#: how much of an answer's end the repetition check reads, and its longest repeated span
_TAIL_CHARS = 8192
_MAX_PERIOD = 256
#: a repeated suffix counts when it is at least this long and holds this many copies ...
_MIN_RUN_CHARS = 200
_MIN_COPIES = 4
#: ... and either covers half the answer or holds this many copies (a long answer that ends in a
#: loop until its output cap)
_MANY_COPIES = 10


def expectations(shape: Shape | Format, obj: Mapping[str, Any]) -> Expect:
    """What ``obj`` (a request body of ``shape``) asks the answer to be."""
    return format_of(shape).expect(obj)


def read_answer(shape: Shape | Format, raw: bytes, stream: bool) -> Answer:
    """The answer in a response body (``stream`` False) or a stream's events (split by the
    format's framing), of ``shape``."""
    fmt = format_of(shape)
    if stream:
        objs: Iterable[Any] = fmt.framing.events(raw)
    else:
        try:
            objs = [orjson.loads(raw)]
        except orjson.JSONDecodeError:
            objs = []
    return fmt.read_answer(objs, stream)


_STOP_WORDS: dict[str, Stop] = {
    # OpenAI chat
    "stop": "stop",
    "length": "truncated",
    "content_filter": "content_filter",
    "tool_calls": "tool_calls",
    "function_call": "tool_calls",
    # Anthropic
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "truncated",
    "model_context_window_exceeded": "truncated",
    "refusal": "refusal",
    "tool_use": "tool_calls",
    # the Responses API (status, or the reason it is incomplete)
    "completed": "stop",
    "max_output_tokens": "truncated",
    # Gemini
    "STOP": "stop",
    "MAX_TOKENS": "truncated",
    "SAFETY": "content_filter",
    "RECITATION": "content_filter",
    "BLOCKLIST": "content_filter",
    "PROHIBITED_CONTENT": "content_filter",
    "SPII": "content_filter",
    "IMAGE_SAFETY": "content_filter",
    "LANGUAGE": "content_filter",
    "MALFORMED_FUNCTION_CALL": "tool_calls",
    "UNEXPECTED_TOOL_CALL": "tool_calls",
}


def stop_of(answer: Answer) -> Stop:
    """Why the answer ended, in one vocabulary for every API. A refusal field (OpenAI's
    ``refusal``, a Responses API refusal part) makes it a refusal whatever the stop reason
    says; tool calls in an answer that otherwise stopped normally make it a tool-call stop
    (the Responses API and Gemini report no separate reason for them)."""
    if answer.refusal:
        return "refusal"
    stop = _STOP_WORDS.get(answer.finish or "", "other_stop")
    if stop == "stop" and answer.tool_calls:
        return "tool_calls"
    return stop


def repetition(text: str) -> bool:
    """Whether ``text`` ends in degenerate repetition: one span of at most 256 characters
    repeated up to its end, at least 4 times over at least 200 characters and half the answer,
    or at least 10 times. Reads at most the last 8k characters with C-level slice comparisons (bounded work)."""
    tail = text[-_TAIL_CHARS:]
    n = len(tail)
    if n < _MIN_RUN_CHARS:
        return False
    probe = _MIN_RUN_CHARS // 2
    for p in range(1, min(_MAX_PERIOD, n // _MIN_COPIES) + 1):
        if tail[n - probe :] != tail[n - probe - p : n - p]:
            continue
        # the longest suffix with period p: a run of length L means tail[-L:] == tail[-L-p:-p]
        lo, hi = probe, n - p
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if tail[n - mid :] == tail[n - mid - p : n - p]:
                lo = mid
            else:
                hi = mid - 1
        run = lo + p  # characters covered by the repeated span
        copies = run // p
        if (
            run >= _MIN_RUN_CHARS
            and copies >= _MIN_COPIES
            and (run * 2 >= min(len(text), n) or copies >= _MANY_COPIES)
        ):
            return True
    return False


# -- the checks -----------------------------------------------------------------------------------


class _Validators:
    """JSON Schema validators by schema, built once each (bounded)."""

    def __init__(self, size: int = 256) -> None:
        self.size = size
        self._cache: dict[bytes, Any] = {}

    def get(self, schema: Mapping[str, Any]) -> Any:
        """A validator for ``schema``, or None when it is not checked (too large, holds a
        regular expression, or is not a valid schema)."""
        try:
            key = orjson.dumps(schema, option=orjson.OPT_SORT_KEYS)
        except (TypeError, orjson.JSONEncodeError):
            return None
        if key in self._cache:
            return self._cache[key]
        validator = None
        if len(key) <= MAX_SCHEMA_BYTES and not _has_regex(schema):
            from jsonschema import validators
            from jsonschema.exceptions import SchemaError

            try:
                as_dict = dict(schema)
                cls = validators.validator_for(as_dict)
                cls.check_schema(as_dict)
                validator = cls(as_dict)
            except (SchemaError, RecursionError, TypeError, ValueError):
                validator = None
        if len(self._cache) >= self.size:
            self._cache.pop(next(iter(self._cache)))
        self._cache[key] = validator
        return validator


def _has_regex(node: Any, depth: int = 0) -> bool:
    if depth > 64:
        return True
    if isinstance(node, Mapping):
        return any(k in _REGEX_KEYWORDS or _has_regex(v, depth + 1) for k, v in node.items())
    if isinstance(node, list):
        return any(_has_regex(v, depth + 1) for v in node)
    return False


def _valid(validators: _Validators, schema: Mapping[str, Any] | None, value: Any) -> bool:
    """Whether ``value`` satisfies ``schema`` (True when the schema is not checked)."""
    if schema is None:
        return True
    v = validators.get(schema)
    if v is None:
        return True
    try:
        return bool(v.is_valid(value))
    except (RecursionError, TypeError, ValueError):
        return True
    except Exception:  # a referencing error and the like: not the answer's fault
        return True


def _json(text: str) -> tuple[bool, Any]:
    try:
        return True, orjson.loads(text)
    except orjson.JSONDecodeError:
        return False, None


def _tool_problems(answer: Answer, expect: Expect, v: _Validators) -> list[str]:
    """What is wrong with the answer's tool calls: a tool the request did not offer, arguments
    that are not a JSON object, arguments the tool's schema refuses (each once)."""
    bad_args, bad_schema, unknown = answer.malformed_call, False, False
    for name, args in answer.tool_calls:
        tools = expect.tools
        if tools is None or name not in tools:
            unknown = True
            continue
        if name in expect.free:
            continue
        value = args
        if isinstance(args, str):
            ok, value = _json(args)
            if not ok:
                bad_args = True
                continue
        if not isinstance(value, Mapping):
            bad_args = True
        elif not _valid(v, tools[name], value):
            bad_schema = True
    named = {
        "unknown_tool": unknown,
        "invalid_tool_arguments": bad_args,
        "tool_schema_mismatch": bad_schema,
    }
    return [name for name, found in named.items() if found]


def problems(answer: Answer, expect: Expect, validators: _Validators | None = None) -> list[str]:
    """What is wrong with ``answer`` given what the request asked for (each problem once)."""
    v = validators or _Validators()
    found: list[str] = []
    text = answer.text
    declined = stop_of(answer) in ("refusal", "content_filter")  # said so: not "empty"
    if not text.strip() and not answer.tool_calls and not declined:
        found.append("empty")
    if expect.json and text.strip() and not answer.refusal:
        ok, value = _json(text)
        if not ok:
            found.append("invalid_json")
        elif not _valid(v, expect.schema, value):
            found.append("schema_mismatch")
    found += _tool_problems(answer, expect, v)
    if text and repetition(text):
        found.append("repetition")
    return found


# -- the checker thread ---------------------------------------------------------------------------


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
        self.validators = _Validators()

    def reading(self) -> bool:
        """Whether the next answer is read whole: the checker's CPU credit is not spent. Asked
        before a stream's events are kept, so an answer past the share costs neither the
        keeping nor the reading; it is counted by its stop reason (``cpu``)."""
        return self.credit is None or self.credit.ok()

    def submit(self, job: Job) -> None:
        if len(self._jobs) >= self.size:
            self.sink.answer_skipped("queue_full")
            return
        size = len(job.raw) if isinstance(job.raw, bytes) else sum(map(len, job.raw))
        if not self.held.take(size):  # too much held already: counted by its stop alone
            self.count_unread(
                job.labels, job.finish, job.output_tokens, job.reasoning_tokens, "busy"
            )
            return
        job.size = size
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
        mark = time.thread_time()
        while self._jobs:
            job = self._jobs.popleft()
            try:
                self._one(job)
            finally:
                self.held.give(job.size)
                self._done += 1
                mark = self._charge(mark)
            # hand the interpreter lock back between answers: a request waiting on it waits
            # one answer's read, not the interpreter's whole switch interval
            time.sleep(0)
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
