"""The benchmark's request bodies, one definition for every harness that sends them: a RAG
request of a given size (retrieved ``<document>`` chunks in the user turn), and where a run keeps
each body on disk for the load tools."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from benchmarks import targets as tg
from context_ceiling.core.tokenizers import TiktokenCounter

SENTENCE = (
    "Record {i}: the service contract between Northwind and client K{i:03d} renews on day "
    "{d} with a fee of {f} EUR and a notice period of {n} days. "
)


def body_of(tokens: int, stream: bool) -> tuple[bytes, str]:
    """A RAG request of about ``tokens`` tokens: retrieved chunks in the user turn."""
    enc = TiktokenCounter("o200k_base")
    chunks: list[str] = []
    i = 0
    while True:
        chunks.append(
            f'<document id="{i}">'
            + "".join(
                SENTENCE.format(i=i * 10 + k, d=k, f=100 + (i * 10 + k) % 900, n=30 + k)
                for k in range(8)
            )
            + "</document>"
        )
        i += 1
        if enc.count("\n".join(chunks)) >= tokens - 40:
            break
    text = "\n".join(chunks)
    body: dict[str, Any] = {
        "model": tg.model_name(tokens),
        "messages": [
            {"role": "system", "content": "Answer from the records."},
            {"role": "user", "content": text + "\nWhat is the fee of K007?"},
        ],
        "max_tokens": 20,
        "stream": stream,
    }
    return orjson.dumps(body), text


def body_path(work: Path, tokens: int, stream: bool) -> Path:
    """Where a run writes the body of ``tokens`` tokens (streamed or not) for the load tools."""
    return work / f"body-{tokens}-{stream}.json"
