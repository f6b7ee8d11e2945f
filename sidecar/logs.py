"""One structured JSON line per request, on the ``ceiling.requests`` logger.

Only numbers, bounded names and ids are logged: never prompt or completion text, never headers.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import orjson

REQUEST_LOGGER = "ceiling.requests"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        fields: dict[str, Any] = getattr(record, "fields", None) or {"message": record.getMessage()}
        out = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
        }
        out.update(fields)
        return orjson.dumps(out).decode()


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
