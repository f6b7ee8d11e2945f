"""The capture store: requests the sidecar sampled from live traffic, for building task sets from
them (``ceiling taskset build``). One definition of the record and of the file, shared by the
writer (the sidecar) and the reader (the sweep).

A store is one SQLite file (the standard library's, no server), marked as ours with
``PRAGMA application_id`` and versioned with ``PRAGMA user_version``: a file that is not a store,
is corrupt, or is another version is refused with one line, never half-read. It holds only what
was extracted and redacted before writing: the request's shape (system prompt, retrieved chunks
in rank order, tool definitions, the latest user question) and the response text with its usage,
model and finish reason. Never headers, never keys. Rotated by size and age.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from pydantic import Field, ValidationError

from context_ceiling.core.errors import UserError
from context_ceiling.core.strict import Strict

#: "CCAP": the SQLite application id of a context-ceiling capture store
APPLICATION_ID = 0x43434150
FORMAT_VERSION = 1


class CaptureStoreError(UserError):
    """A capture store that cannot be used; the message says which file and why."""


class Chunk(Strict):
    """One retrieved chunk as the application sent it, with its rank (0: first)."""

    rank: int = Field(ge=0)
    text: str
    #: the ``id`` attribute of an inlined ``<document id=...>``, when it had one
    source_id: str | None = None


class CaptureRecord(Strict):
    ts: float
    workload: str
    model: str  # the registry label (bounded), as on the metrics
    request_model: str
    api: str
    system: str = ""
    tools: str = ""  # the tool definitions as JSON text (empty: none)
    question: str = ""  # the latest user message, less the chunks inlined in it
    chunks: list[Chunk] = Field(default_factory=list)
    response: str | None = None
    response_model: str | None = None
    finish_reason: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    stream: bool = False
    #: how many values the redaction rules replaced in this record
    redactions: int = 0


_SCHEMA = """
CREATE TABLE captures (
  id INTEGER PRIMARY KEY,
  ts REAL NOT NULL,
  workload TEXT NOT NULL,
  model TEXT NOT NULL,
  bytes INTEGER NOT NULL,
  record TEXT NOT NULL
);
CREATE INDEX captures_ts ON captures (ts);
"""


class CaptureStore:
    """One capture store file. Not shared between threads: open one per thread."""

    def __init__(self, path: Path, conn: sqlite3.Connection) -> None:
        self.path = path
        self._conn = conn

    @classmethod
    def open(cls, path: str | Path, create: bool = False) -> CaptureStore:
        p = Path(path)
        if not p.exists() and not create:
            raise CaptureStoreError(f"{p}: no capture store there")
        if create:
            p.parent.mkdir(parents=True, exist_ok=True)
        try:
            conn = sqlite3.connect(p, timeout=10, isolation_level=None)
            app_id = conn.execute("PRAGMA application_id").fetchone()[0]
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            tables = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
            if app_id == 0 and version == 0 and tables == 0 and create:
                conn.execute("PRAGMA auto_vacuum = INCREMENTAL")  # before the first table
                conn.executescript(_SCHEMA)
                conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
                conn.execute(f"PRAGMA user_version = {FORMAT_VERSION}")
                conn.execute("PRAGMA journal_mode = WAL")
            elif app_id != APPLICATION_ID:
                conn.close()
                raise CaptureStoreError(f"{p}: not a context-ceiling capture store")
            elif version != FORMAT_VERSION:
                conn.close()
                raise CaptureStoreError(
                    f"{p}: capture store format version {version}; this ceiling reads version "
                    f"{FORMAT_VERSION}"
                )
            conn.execute("SELECT count(*) FROM captures").fetchone()
        except sqlite3.DatabaseError as exc:
            raise CaptureStoreError(f"{p}: not a readable capture store ({exc})") from exc
        return cls(p, conn)

    def close(self) -> None:
        self._conn.close()

    def add(self, records: Iterable[CaptureRecord]) -> int:
        rows = []
        for r in records:
            text = r.model_dump_json(exclude_defaults=True)
            rows.append((r.ts, r.workload, r.model, len(text), text))
        with self._conn:
            self._conn.execute("BEGIN")
            self._conn.executemany(
                "INSERT INTO captures (ts, workload, model, bytes, record) VALUES (?, ?, ?, ?, ?)",
                rows,
            )
        return len(rows)

    def rotate(self, max_bytes: int, max_age_s: float, now: float | None = None) -> int:
        """Drop records older than ``max_age_s`` and then the oldest until the records fit in
        ``max_bytes``; returns how many were dropped."""
        now = time.time() if now is None else now
        dropped = self._conn.execute("DELETE FROM captures WHERE ts < ?", (now - max_age_s,))
        n = dropped.rowcount
        total = self._conn.execute("SELECT coalesce(sum(bytes), 0) FROM captures").fetchone()[0]
        if total > max_bytes:
            excess = total - max_bytes
            cut = self._conn.execute(
                "SELECT id FROM (SELECT id, sum(bytes) OVER (ORDER BY id) AS run FROM captures)"
                " WHERE run >= ? ORDER BY id LIMIT 1",
                (excess,),
            ).fetchone()
            if cut is not None:
                n += self._conn.execute("DELETE FROM captures WHERE id <= ?", (cut[0],)).rowcount
        if n:
            self._conn.execute("PRAGMA incremental_vacuum")
        return n

    def __len__(self) -> int:
        return int(self._conn.execute("SELECT count(*) FROM captures").fetchone()[0])

    def records(self) -> Iterator[CaptureRecord]:
        for rid, text in self._conn.execute("SELECT id, record FROM captures ORDER BY id"):
            try:
                yield CaptureRecord.model_validate_json(text)
            except ValidationError as exc:
                raise CaptureStoreError(
                    f"{self.path}: record {rid}: not a capture record of this version"
                ) from exc


def store_paths(paths: Iterable[str | Path]) -> list[Path]:
    """Capture store files from files and folders (a folder: every ``*.sqlite`` in it, e.g.
    one file per sidecar replica)."""
    out: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            found = sorted(p.glob("*.sqlite"))
            if not found:
                raise CaptureStoreError(f"{p}: no capture store (*.sqlite) in this folder")
            out += found
        else:
            out.append(p)
    return out
