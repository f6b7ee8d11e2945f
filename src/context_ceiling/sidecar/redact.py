"""Redaction before anything captured is written: built-in patterns for secrets (always on),
the configured patterns, and the configured JSON fields; each replaced value is counted."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

REDACTED = "[REDACTED]"
#: secrets that must never be stored, whatever the configuration says
BUILTIN_PATTERNS = (
    r"sk-(?:ant-|proj-|svcacct-)?[A-Za-z0-9_\-]{16,}",  # OpenAI / Anthropic keys
    r"AIza[0-9A-Za-z_\-]{30,}",  # Google API keys
    r"AKIA[0-9A-Z]{16}",  # AWS access key ids
    r"[Bb][Ee][Aa][Rr][Ee][Rr]\s+[A-Za-z0-9._~+/=\-]{12,}",
    r"eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}",  # JWTs
    r"gh[pousr]_[A-Za-z0-9]{30,}",  # GitHub tokens
    r"xox[abposr]-[A-Za-z0-9\-]{10,}",  # Slack tokens
)


class Redactor:
    def __init__(
        self, patterns: list[str], fields: list[str], count: Callable[[str, int], None]
    ) -> None:
        self.builtin = re.compile("|".join(f"(?:{p})" for p in BUILTIN_PATTERNS))
        self.custom = re.compile("|".join(f"(?:{p})" for p in patterns)) if patterns else None
        self.fields = frozenset(fields)
        self._count = count

    def text(self, s: str) -> tuple[str, int]:
        s, a = self.builtin.subn(REDACTED, s)
        b = 0
        if self.custom is not None:
            s, b = self.custom.subn(REDACTED, s)
        if a:
            self._count("builtin", a)
        if b:
            self._count("pattern", b)
        return s, a + b

    def body(self, obj: Any) -> tuple[Any, int]:
        """``obj`` with the values of the configured fields replaced, at any depth."""
        out, n = self._body(obj)
        if n:
            self._count("field", n)
        return out, n

    def _body(self, obj: Any) -> tuple[Any, int]:
        n = 0
        if isinstance(obj, Mapping):
            out: dict[str, Any] = {}
            for k, v in obj.items():
                if k in self.fields:
                    out[k] = REDACTED
                    n += 1
                else:
                    out[k], m = self._body(v)
                    n += m
            return out, n
        if isinstance(obj, list):
            items = []
            for v in obj:
                r, m = self._body(v)
                items.append(r)
                n += m
            return items, n
        return obj, 0
