"""What a captured exchange says, per wire format: the request's shape (system prompt, tool
definitions, the latest user question, the retrieved chunks in rank order) and the answer's text
and finish reason, from a response body or a stream's events. Pure functions over parsed JSON:
the capture writer calls them off the request path."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from context_ceiling.core.vocabulary import Shape
from context_ceiling.formats import format_of
from context_ceiling.formats.base import Format
from context_ceiling.sidecar.observability.answer_signals import read_answer

_DOC_ID = re.compile(r"""<document\b[^>]*\bid=["']([^"']+)["']""")
_DOC_BODY = re.compile(r"^<document\b[^>]*>(.*)</document>$", re.S)


@dataclass
class Extract:
    system: str = ""
    tools: str = ""
    question: str = ""
    chunks: list[tuple[str, str | None]] | None = None


def extract(
    shape: Shape | Format, body: Mapping[str, Any], chunk_pattern: re.Pattern[str] | None
) -> Extract:
    """System prompt, tool definitions, latest user question and retrieved chunks (rank order:
    as they appear) of one request body."""
    ex = Extract()
    p = format_of(shape).prompt(body)
    ex.system, user, tools = p.system, p.question, p.tools
    chunks: list[tuple[str, str | None]] = list(p.documents)
    if chunk_pattern is not None and user:
        found = [(m.start(), m.end(), m.group(0)) for m in chunk_pattern.finditer(user)]
        for _, _, raw in found:
            idm = _DOC_ID.search(raw)
            inner = _DOC_BODY.match(raw)
            chunks.append(
                ((inner.group(1) if inner else raw).strip(), idm.group(1) if idm else None)
            )
        for start, end, _ in reversed(found):
            user = user[:start] + user[end:]
    ex.question = re.sub(r"\n{3,}", "\n\n", user).strip()
    ex.tools = json.dumps(tools, sort_keys=True) if tools else ""
    ex.chunks = chunks
    return ex


def response_text(shape: Shape | Format, raw: bytes, stream: bool) -> tuple[str, str | None]:
    """(the answer's text, its finish reason) from a response body or a stream's events."""
    answer = read_answer(shape, raw, stream)
    return answer.text, answer.finish
