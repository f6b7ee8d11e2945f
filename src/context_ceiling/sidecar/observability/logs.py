"""One JSON log format for everything the sidecar process writes, on stdout: its request lines
(``ceiling.requests``), its own events, uvicorn's lines and Python warnings alike, so a log
pipeline parses one format.

Only numbers, bounded names and ids are logged: never prompt or completion text, never headers.
"""

from __future__ import annotations

import contextlib
import logging
import re
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from typing import Any

import orjson

REQUEST_LOGGER = "ceiling.requests"


MAX_FIELD = 128
_UNSAFE = re.compile(r"[\x00-\x1f\x7f]")


def bounded(value: str | None, limit: int = MAX_FIELD) -> str | None:
    """A client-supplied string as it may be logged: control characters replaced, cut to
    ``limit`` characters with a marker (a 100,000-character model name is one line, not 100 kB)."""
    if value is None:
        return None
    v = _UNSAFE.sub("?", value)
    return v if len(v) <= limit else v[:limit] + f"...(+{len(v) - limit})"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if fields:
            out.update(fields)
        if record.exc_info and record.exc_info[0] is not None:
            # the type and the traceback (code locations), never the exception's arguments
            # beyond its message: a crash is worth a line an operator can act on
            etype, exc, tb = record.exc_info
            out["exc_type"] = etype.__name__
            out["exc_message"] = bounded(str(exc), 500)
            out["traceback"] = "".join(traceback.format_tb(tb))
        return orjson.dumps(out, default=str).decode()


#: the loggers that log at the configured level; everything else (httpx logs every request's
#: URL at INFO) only warnings and errors
OURS = ("ceiling", "context_ceiling", "uvicorn", "uvicorn.error", "uvicorn.access")


def configure(level: str = "info") -> None:
    # The JSON format never prints the caller's file and line, the thread or the process, so
    # no record needs them: the logging HOWTO's "Optimization" switches. Not looking them up
    # takes a third off every request line (a stack walk, a getpid, current_thread).
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    if sys.version_info >= (3, 12):
        logging.logAsyncioTasks = False  # the current task's name
    global _handler
    handler = _handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)
    for name in OURS:
        log = logging.getLogger(name)
        log.handlers.clear()  # uvicorn's own plain-text handlers, when it installed them
        log.setLevel(level.upper())
        log.propagate = True
    logging.captureWarnings(True)


#: the stdout handler :func:`configure` installed (None: not configured)
_handler: logging.StreamHandler[Any] | None = None
_requests = logging.getLogger(REQUEST_LOGGER)


class _Pending(threading.local):
    #: request lines held for one write (:func:`one_write`); None: each written at once
    lines: list[str] | None = None


_pending = _Pending()


@contextlib.contextmanager
def one_write() -> Iterator[None]:
    """Request lines logged inside (on this thread) are written together at its end: one write
    and one flush for a batch of records instead of one each (each is a system call, and the
    handler's lock taken and released)."""
    if _pending.lines is not None:  # nested: the outer one writes
        yield
        return
    _pending.lines = []
    try:
        yield
    finally:
        lines, _pending.lines = _pending.lines, None
        if lines and _handler is not None:
            _write(_handler, "".join(lines))


def log_request(fields: dict[str, Any], ts: float | None = None) -> None:
    """One request line (``ts``: when its request finished, seconds since the epoch; default
    now). While the JSON handler on stdout is the only one the line reaches
    (the configured process), it is written there directly, the same line the formatter
    writes: a log record, its dispatch and its formatting cost a request more than its
    metrics. Any other handler on the way (a test's capture, an embedding app's) gets the
    record through ``logging``."""
    logger = _requests
    if not logger.isEnabledFor(logging.INFO):
        return
    h = _handler
    if h is None or not _sole(h, logger):
        # as logger.info makes it without a caller lookup, but with the request's own time
        record = logger.makeRecord(
            logger.name,
            logging.INFO,
            "(unknown file)",
            0,
            "request",
            (),
            None,
            "(unknown function)",
            {"fields": fields},
        )
        if ts is not None:
            record.created, record.msecs = ts, (ts - int(ts)) * 1000
        logger.handle(record)
        return
    now = time.time() if ts is None else ts
    out = {"ts": round(now, 3), "level": "info", "logger": REQUEST_LOGGER}
    out["message"] = "request"
    out.update(fields)
    line = orjson.dumps(out, default=str, option=orjson.OPT_APPEND_NEWLINE).decode()
    held = _pending.lines
    if held is not None:
        held.append(line)
        return
    _write(h, line)


def _write(h: logging.StreamHandler[Any], text: str) -> None:
    """``text`` (whole lines) to the handler's stream, as the handler writes a record."""
    h.acquire()
    try:
        h.stream.write(text)
        h.stream.flush()
    except Exception:  # as the handler would: reported on stderr, the request goes on
        h.handleError(logging.makeLogRecord({"msg": "request", "name": REQUEST_LOGGER}))
    finally:
        h.release()


def _sole(h: logging.Handler, logger: logging.Logger) -> bool:
    """Whether ``h`` is the only handler (and nothing filters) between ``logger`` and the
    root: what makes writing to it directly the same as logging."""
    node: logging.Logger | None = logger
    while node is not None:
        if node.filters or node.disabled:
            return False
        if node is logging.root:
            return node.handlers == [h] and not h.filters and h.level <= logging.INFO
        if node.handlers or not node.propagate:
            return False
        node = node.parent
    return False
