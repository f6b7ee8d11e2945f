"""The structure of a chat request, checked once before anything reads it.

The counters, the image-size code and the trimmer read nested fields of the client's body. A
body that parses as JSON but has a number where an object belongs must be a 400 naming the field,
never a crash that becomes a 500 (SDKs retry a 500, so one bad payload becomes several). The
checks here cover exactly the fields the sidecar reads, in the shapes the providers document;
anything else in the body is the upstream's to judge, and passes through untouched.

Depth: JSON parsers accept bodies nested 1,024 deep, serialisers refuse past 255; no chat
request needs more than a few dozen levels, so deeper bodies are refused up front.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from context_ceiling.core.errors import CeilingError

MAX_DEPTH = 64


class RequestShapeError(CeilingError, ValueError):
    """The request body is not a valid chat request; the message names the field."""


def require_type(value: Any, types: type | tuple[type, ...], where: str, what: str) -> None:
    if not isinstance(value, types):
        raise RequestShapeError(f"{where} must be {what}")


def optional_type(
    obj: Mapping[str, Any], key: str, types: type | tuple[type, ...], where: str, what: str
) -> None:
    if obj.get(key) is not None:
        require_type(obj[key], types, f"{where}.{key}", what)


def check_depth(value: Any, limit: int = MAX_DEPTH) -> None:
    """Iterative (a recursive walk of a 1,000-deep body would itself hit Python's limit)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        v, d = stack.pop()
        if d > limit:
            raise RequestShapeError(f"the request body is nested more than {limit} levels deep")
        if isinstance(v, dict):
            stack.extend((x, d + 1) for x in v.values() if isinstance(x, dict | list))
        elif isinstance(v, list):
            stack.extend((x, d + 1) for x in v if isinstance(x, dict | list))


def check_depth_around(body: Mapping[str, Any], key: str) -> None:
    """The depth check of ``body`` except its list ``key`` (the messages), whose items are
    checked one by one (:func:`check_item_depth`) so that a message counted before, whose bytes
    are unchanged, is not walked again."""
    for k, v in body.items():
        if k != key and isinstance(v, dict | list):
            check_depth(v, MAX_DEPTH - 1)


def check_item_depth(item: Any) -> None:
    """The depth check of one item of a body's top-level list (the body is level 1, the list
    level 2)."""
    if isinstance(item, dict | list):
        check_depth(item, MAX_DEPTH - 2)


def messages_of(body: Mapping[str, Any]) -> list[Any]:
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise RequestShapeError("'messages' is required and must be an array")
    return messages
