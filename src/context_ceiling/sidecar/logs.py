"""One structured JSON line per request, on the ``ceiling.requests`` logger.

Only numbers, bounded names and ids are logged: never prompt or completion text, never headers.
"""

from __future__ import annotations

import logging
import re
import sys
import traceback
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
        fields: dict[str, Any] = getattr(record, "fields", None) or {"message": record.getMessage()}
        out = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
        }
        out.update(fields)
        if record.exc_info and record.exc_info[0] is not None:
            # the type and the traceback (code locations), never the exception's arguments
            # beyond its message: a crash is worth a line an operator can act on
            etype, exc, tb = record.exc_info
            out["exc_type"] = etype.__name__
            out["exc_message"] = bounded(str(exc), 500)
            out["traceback"] = "".join(traceback.format_tb(tb))
        return orjson.dumps(out, default=str).decode()


def configure(level: str = "info") -> None:
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(JsonFormatter())
    for name in ("ceiling", "sidecar"):
        log = logging.getLogger(name)
        log.handlers[:] = [handler]
        log.setLevel(level.upper())
        log.propagate = False


def log_request(fields: dict[str, Any]) -> None:
    logger = logging.getLogger(REQUEST_LOGGER)
    if logger.isEnabledFor(logging.INFO):
        logger.info("request", extra={"fields": fields})
