"""RAG-shaped chat messages for tests: ``<document>`` chunks in the user turn."""

from __future__ import annotations

CHUNK = (
    '<document id="d{i}">' + "The renewal fee of contract C-{i} is {i} EUR. " * 8 + "</document>\n"
)


def rag_messages(n: int) -> list[dict[str, str]]:
    """A system prompt and one user turn of ``n`` retrieved chunks and a question."""
    return [
        {"role": "system", "content": "Answer from the documents."},
        {"role": "user", "content": "".join(CHUNK.format(i=i) for i in range(n)) + "Fee of C-1?"},
    ]
