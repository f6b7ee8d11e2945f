"""What the trimmer needs to know of a wire format: the interface each format in
``context_ceiling.formats`` implements (:class:`TrimRules`), the tool use it reports
(:class:`ToolUse`), and the texts both sides share. The stages themselves
(``context_ceiling.core.trim``) are the same for every format, so a new API is one
:class:`TrimRules` in its own module."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from context_ceiling.core.tokenizers import TextCounter

__all__ = ["PLACEHOLDER", "ToolUse", "TrimRules", "block_texts"]

PLACEHOLDER = "[retrieved documents removed by context-ceiling to fit the context budget]"


def block_texts(content: Any) -> str:
    """The text blocks of a content, joined (a string content as it is)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(b.get("text", ""))
            for b in content
            if isinstance(b, dict) and b.get("type") == "text"
        )
    return ""


@dataclass(slots=True)
class ToolUse:
    """One tool use: where its result is, where its call is, and the result's tokens."""

    result: tuple[int, int]  # (message, block); block -1: the whole message (or item)
    call: tuple[int, int] | None  # (message, index of the call in it); None: no call found
    name: str
    call_id: str
    tokens: int


class TrimRules(ABC):
    """What the trimmer needs to know of a wire format, and nothing else: where the messages
    are, what a turn is, which messages and blocks are tool calls and tool results, how a
    result is replaced and a call's input emptied. Each format in ``context_ceiling.formats``
    fills in one; the stages themselves (``context_ceiling.core.trim``) are the same for every
    format.

    A format says what is its own (the abstract methods); the defaults are those of a format
    whose messages sit in ``messages``, hold their blocks in ``content`` and carry no cache
    breakpoints."""

    #: where a message keeps its blocks
    blocks_key = "content"
    #: the body's list of messages (items, contents)
    items_key = "messages"
    #: tokens of a tool result's part that are its framing, which a shortened result keeps
    result_frame = 0
    #: the format marks cache breakpoints on blocks (``cache_control``): the prefix before the
    #: last one is protected
    cache_control = False
    #: a server-side compaction item summarises everything before it, which may then go
    drops_before_compaction = False

    def items(self, body: Mapping[str, Any]) -> list[Any]:
        """The messages, as a list the trimmer reads by index."""
        return list(body.get(self.items_key) or [])

    def with_items(self, out: dict[str, Any], items: list[Any], body: Mapping[str, Any]) -> None:
        """Write the kept messages back into ``out`` (a copy of ``body``)."""
        out[self.items_key] = items

    def empty_block(self) -> Any:
        """What a message whose every block was removed holds instead."""
        return {"type": "text", "text": PLACEHOLDER}

    @abstractmethod
    def is_result(self, m: dict[str, Any]) -> bool:
        """Whether a message carries tool results."""

    @abstractmethod
    def starts_turn(self, m: Any) -> bool:
        """Whether a message starts a turn: a user message that answers no tool call."""

    def is_reply(self, m: dict[str, Any]) -> bool:
        """Whether a message is (part of) the model's reply."""
        return m.get("role") in ("assistant", "model")

    def reply_start(self, messages: list[Any], i: int) -> int:
        """Where the reply whose last message is ``i`` starts."""
        return i

    @abstractmethod
    def tool_uses(self, messages: list[Any], tokens: Callable[[int, int], int]) -> list[ToolUse]:
        """Every tool use whose result is in the request, in order, with its call's place;
        ``tokens(i, j)``: what the result at message ``i``, block ``j`` (-1: the whole message)
        is worth."""

    def results(self, m: dict[str, Any]) -> Iterator[tuple[int, str | None]]:
        """The tool results of a message the ``tool_results`` stage may shorten: (the block, -1
        for the whole message; its text, None when it is not plain text)."""
        return iter(())

    def placeholder(self, m: dict[str, Any], j: int, text: str) -> Any:
        """A result's replacement by ``text`` that keeps its call id."""
        return text if j < 0 else {**m[self.blocks_key][j], "content": text}

    def result_overhead(self, m: dict[str, Any], j: int, counter: TextCounter) -> int:
        """Tokens of a result's part that are not its text and stay when it is replaced or
        shortened (its framing)."""
        return self.result_frame

    def result_text(self, m: dict[str, Any], j: int) -> Any:
        """A result's text as it stands (a placeholder, when it was cleared before)."""
        if j >= 0:
            return block_texts(m[self.blocks_key][j].get("content"))
        return block_texts(m.get("content"))

    @abstractmethod
    def call_input(self, m: dict[str, Any], k: int) -> Any:
        """The input of call ``k`` of message ``m`` (-1: the message is the call)."""

    @abstractmethod
    def without_inputs(self, m: dict[str, Any], calls: set[int]) -> dict[str, Any]:
        """Message ``m`` (a copy) with the inputs of its calls ``calls`` emptied."""

    def cache_point(self, block: Any) -> bool:
        """Whether a block marks a prompt-cache breakpoint (with :attr:`cache_control` set):
        Anthropic's ``cache_control`` on the block itself; a format with breakpoint blocks of
        their own says so here."""
        return isinstance(block, dict) and bool(block.get("cache_control"))

    def cites_documents(self, messages: list[Any]) -> bool:
        """Whether an assistant message cites documents by index: then a dropped document
        leaves a stub in its place, so every kept citation names the document it named."""
        return False
