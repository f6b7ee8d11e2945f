"""The call log (``calls.jsonl``): one typed record per completed call, append-only.

Every call is keyed ``item@level#repeat`` (``item@closed`` for the closed-book control) and
appended as soon as it completes, flushed and fsynced: a crash or SIGKILL loses only calls in
flight, and ``--resume`` skips every key already logged, so nothing is lost and nothing runs
twice. A call that still fails after its retries is logged as an error and retried on the next
resume (the last record of a key wins). Records are validated on the way in and on the way out,
so a log from another version or a hand-edited line is an error that names the line, not a
``KeyError`` deep in the statistics.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, TypedDict, cast

from pydantic import Field, ValidationError

from context_ceiling.core.errors import UserError
from context_ceiling.core.strict import Strict
from context_ceiling.core.vocabulary import SweepApi


def sample_key(item_id: str, level: float | None, repeat: int) -> str:
    """The one definition of a call's identity (the log, resume and the analysis use it)."""
    return f"{item_id}@closed" if level is None else f"{item_id}@{level:.4f}#{repeat}"


class Row(TypedDict, total=False):
    """A call record as the analysis reads it (:meth:`CallRecord.row`, or a simulated call),
    with its grade once graded (``correct``, ``bucket``): typed, so a misspelt key is a type
    error rather than a silent ``None``."""

    key: str
    item: str
    level: float | None
    repeat: int
    control: bool
    target_tokens: int
    prompt_tokens: int
    utilization: float
    window: int
    gold_position: float | None
    n_docs: int
    shown: list[str]
    group_size: int
    counter: str
    ts: float
    status: Literal["ok", "error"]
    text: str | None
    finish_reason: str | None
    model_reported: str | None
    usage_prompt: int | None
    usage_completion: int | None
    cached_tokens: int | None
    cache_write_tokens: int | None
    latency_s: float | None
    attempts: int
    error: str | None
    http_status: int | None
    reasoning_mode: str | None
    #: the grade (:func:`~context_ceiling.sweep.analysis.graded`)
    correct: bool
    bucket: str


class CallRecord(Strict):
    """One completed call: what was sent (the sample and its measured prompt) and what came back.
    Grading is not stored: the scorer is applied to the log, so re-grading is free."""

    key: str
    item: str
    level: float | None  # None: the closed-book control
    repeat: int
    control: bool
    target_tokens: int = 0
    prompt_tokens: int = 0
    utilization: float = 0.0
    window: int = 0
    gold_position: float | None = None
    n_docs: int = 0
    shown: list[str] = Field(default_factory=list)
    group_size: int = 1
    counter: str = ""
    ts: float = 0.0
    status: Literal["ok", "error"]
    text: str | None = None
    finish_reason: str | None = None
    model_reported: str | None = None
    usage_prompt: int | None = None
    usage_completion: int | None = None
    #: input read from the provider's prompt cache, and written to it (Anthropic)
    cached_tokens: int | None = None
    cache_write_tokens: int | None = None
    latency_s: float | None = None
    attempts: int = 1
    error: str | None = None
    http_status: int | None = None
    reasoning_mode: SweepApi | None = None

    def row(self) -> Row:
        """The record as the statistics read it (a mapping they add grades to)."""
        return cast(Row, self.model_dump())


def drop_torn_tail(path: Path) -> None:
    """A kill mid-write leaves a partial last line in an append-only log: drop it before
    appending again (the record it began never completed)."""
    if not path.exists():
        return
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        with open(path, "r+b") as f:
            f.truncate(data.rfind(b"\n") + 1)


def append_line(path: Path, line: str) -> None:
    """One line appended to an append-only log and flushed to disk before it returns."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


_PARSED_FILES = 8
"""Logs whose parsed records are kept (a run's own, and the shards a merge reads)."""


@dataclass(frozen=True)
class _Parsed:
    """What was parsed of one log file: how far, and the records (frozen models, shared by
    every read)."""

    offset: int = 0
    lines: int = 0
    #: a digest of the bytes parsed, to tell a log appended to from one rewritten in place
    digest: bytes = b""
    records: dict[str, CallRecord] = field(default_factory=dict)


_PARSED: dict[Path, _Parsed] = {}


def _digest(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=16).digest()


class CallLog:
    """``calls.jsonl``: append-only, one JSON record per completed call."""

    def __init__(self, path: Path) -> None:
        self.path = path  # its folder is made by the first append: a dry run creates nothing
        self._repair()

    def _repair(self) -> None:
        drop_torn_tail(self.path)

    def records(self) -> dict[str, CallRecord]:
        """The last record of every key. The log is only ever appended to, so a read parses only
        the lines added since the last read of the same file (a run reads its log after every
        batch and its analysis again; parsing every record each time grew with the square of the
        calls); a file whose part read before changed (cut back, rewritten or replaced) is parsed
        again."""
        try:
            content = self.path.read_bytes()
        except FileNotFoundError:
            return {}
        seen = _PARSED.get(self.path) or _Parsed()
        if seen.offset and _digest(content[: seen.offset]) != seen.digest:
            seen = _Parsed()
        data = content[seen.offset :]
        whole = data[: data.rfind(b"\n") + 1]  # a line still being written waits
        out = dict(seen.records)
        n = seen.lines
        for raw in whole.split(b"\n")[:-1]:  # newlines only: U+2028 may sit inside a string
            n += 1
            line = raw.decode()
            if line.strip():
                try:
                    rec = CallRecord.model_validate(json.loads(line))
                except ValidationError as exc:
                    err = exc.errors()[0]
                    where = ".".join(str(p) for p in err["loc"]) or "(record)"
                    raise UserError(
                        f"{self.path}:{n}: not a call record: {where}: {err['msg']}"
                    ) from exc
                except ValueError as exc:
                    raise UserError(f"{self.path}:{n}: not JSON ({exc})") from exc
                out[rec.key] = rec
        if whole:
            end = seen.offset + len(whole)
            seen = _Parsed(end, n, _digest(content[:end]), out)
        _PARSED.pop(self.path, None)
        _PARSED[self.path] = seen
        while len(_PARSED) > _PARSED_FILES:
            _PARSED.pop(next(iter(_PARSED)))
        return dict(out)

    def done(self) -> set[str]:
        return {k for k, r in self.records().items() if r.status == "ok"}

    def append(self, record: CallRecord) -> None:
        append_line(self.path, record.model_dump_json())
