"""Request counting: the published framing rules, the component breakdown, images."""

from __future__ import annotations

import base64
import re
import struct
import zlib
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from context_ceiling.core.counting import DEFAULT_CHUNK_PATTERN
from context_ceiling.core.images import anthropic_image_tokens, image_size, openai_image_tokens
from context_ceiling.core.models import ChatFormat
from context_ceiling.core.tokenizers import TiktokenCounter
from context_ceiling.core.utilization import Component
from context_ceiling.formats.anthropic import TOOL_SYSTEM_TOKENS as ANTHROPIC_TOOL_SYSTEM_TOKENS
from context_ceiling.formats.anthropic import count as count_anthropic
from context_ceiling.formats.openai_chat import count as count_openai

ENC = TiktokenCounter("o200k_base")
CHUNKS = re.compile(DEFAULT_CHUNK_PATTERN)
n = ENC.count


def png(w: int, h: int) -> bytes:
    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + struct.pack(">I", 13)
        + b"IHDR"
        + ihdr
        + struct.pack(">I", zlib.crc32(b"IHDR" + ihdr))
    )


def test_openai_published_rule() -> None:
    messages = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "name": "alice", "content": "What is the renewal fee?"},
        {"role": "assistant", "content": "120 EUR."},
        {"role": "user", "content": "And the notice period?"},
    ]
    want = 3  # reply priming
    for m in messages:
        want += 3 + n(m["role"]) + n(m["content"])
        if "name" in m:
            want += 1 + n(m["name"])
    c = count_openai({"model": "gpt-4o", "messages": messages}, ENC)
    assert c.total == want
    assert c.components[Component.SYSTEM] == 3 + n("system") + n("You are a helpful assistant.")
    assert c.components[Component.LATEST_USER] == 3 + n("user") + n("And the notice period?") + 3
    assert c.total == sum(c.components.values())
    assert not c.exact


def test_openai_components_tools_and_retrieval() -> None:
    doc1 = '<document id="a">Contract A: fee 120 EUR.</document>'
    doc2 = '<document id="b">Contract B: fee 90 EUR.</document>'
    body = {
        "model": "gpt-4o",
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "lookup",
                    "description": "find a contract",
                    "parameters": {"type": "object", "properties": {"id": {"type": "string"}}},
                },
            }
        ],
        "messages": [
            {"role": "system", "content": "sys"},
            {"role": "user", "content": "first question"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "lookup", "arguments": '{"id":"a"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "fee: 120 EUR, notice: 90 days"},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": doc1 + "\n" + doc2},
                    {"type": "text", "text": "Which fee is lower?"},
                ],
            },
        ],
    }
    c = count_openai(body, ENC, chunks=CHUNKS)
    assert c.components[Component.RETRIEVED] == n(doc1) + n(doc2)
    assert c.components[Component.TOOL_RESULTS] == 3 + n("tool") + n(
        "fee: 120 EUR, notice: 90 days"
    )
    assert c.components[Component.TOOL_DEFINITIONS] > 0
    assert c.components[Component.HISTORY] > n("first question")
    assert c.total == sum(c.components.values())
    parts = {(p.message, p.component) for p in c.parts}
    assert (4, Component.RETRIEVED) in parts and (3, Component.TOOL_RESULTS) in parts


def test_chat_format_knobs() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    fmt = ChatFormat(per_message=5, reply_priming=3, default_system=20)
    c = count_openai(body, ENC, fmt)
    assert c.total == 5 + n("user") + n("hi") + 3 + 20
    assert c.components[Component.SYSTEM] == 20


def test_openai_image_rule() -> None:
    assert openai_image_tokens((1024, 1024), "high") == 765
    assert openai_image_tokens((2048, 4096), "high") == 1105
    assert openai_image_tokens((4000, 4000), "low") == 85
    url = "data:image/png;base64," + base64.b64encode(png(1024, 1024)).decode()
    body = {
        "model": "gpt-4o",
        "messages": [
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}
        ],
    }
    c = count_openai(body, ENC)
    assert c.components[Component.LATEST_USER] == 3 + n("user") + 765 + 3


def test_image_headers() -> None:
    assert image_size(png(640, 480)) == (640, 480)
    assert image_size(b"GIF89a" + struct.pack("<HH", 31, 17) + b"\0" * 10) == (31, 17)
    jpeg = (
        b"\xff\xd8"
        + b"\xff\xe0"
        + struct.pack(">H", 16)
        + b"\0" * 14
        + b"\xff\xc0"
        + struct.pack(">HBHH", 17, 8, 300, 400)
        + b"\0" * 10
    )
    assert image_size(jpeg) == (400, 300)
    assert image_size(b"not an image") is None
    assert anthropic_image_tokens((1000, 1000)) == 1334
    assert anthropic_image_tokens((3136, 1568)) == anthropic_image_tokens((1568, 784))


def test_anthropic_components() -> None:
    body = {
        "model": "claude-x",
        "system": [{"type": "text", "text": "You answer from the contracts."}],
        "tools": [{"name": "lookup", "description": "find", "input_schema": {"type": "object"}}],
        "messages": [
            {"role": "user", "content": "hi"},
            {
                "role": "assistant",
                "content": [
                    {"type": "tool_use", "id": "t1", "name": "lookup", "input": {"id": "a"}}
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": "fee 120"},
                    {
                        "type": "document",
                        "source": {
                            "type": "text",
                            "media_type": "text/plain",
                            "data": "Contract A text",
                        },
                        "title": "A",
                    },
                    {
                        "type": "search_result",
                        "source": "kb://b",
                        "title": "B",
                        "content": [{"type": "text", "text": "Contract B text"}],
                    },
                    {"type": "text", "text": "Which is cheaper?"},
                ],
            },
        ],
    }
    c = count_anthropic(body, ENC, chunks=CHUNKS)
    assert c.components[Component.SYSTEM] == n("You answer from the contracts.")
    assert c.components[Component.TOOL_RESULTS] == n("fee 120") + 3
    assert c.components[Component.RETRIEVED] == n("A\nContract A text") + n(
        "B\nkb://b\nContract B text"
    )
    assert c.components[Component.TOOL_DEFINITIONS] > ANTHROPIC_TOOL_SYSTEM_TOKENS
    assert c.components[Component.LATEST_USER] == 3 + n("Which is cheaper?") + 3
    assert c.total == sum(c.components.values())


def test_scaled_to_keeps_the_sum() -> None:
    c = count_openai(
        {
            "model": "m",
            "messages": [
                {"role": "system", "content": "a b c"},
                {"role": "user", "content": "d e f g"},
            ],
        },
        ENC,
    )
    s = c.scaled_to(1001, exact=True)
    assert s.total == 1001 == sum(s.components.values())
    assert s.exact


@given(
    st.lists(
        st.sampled_from(
            ["<document>", '<document id="3">', "</document>", "<doc>", "<", ">", "/", "a b ", "\n"]
        ),
        max_size=40,
    )
)
def test_default_chunk_pattern_matches_the_plain_lazy_form(pieces: list[str]) -> None:
    """The unrolled default finds exactly the spans of the obvious (slower) lazy pattern."""
    text = "".join(pieces)
    lazy = re.compile(r"(?s)<document\b[^>]*>.*?</document>")
    assert [m.span() for m in CHUNKS.finditer(text)] == [m.span() for m in lazy.finditer(text)]


def test_count_cache_is_exact_bounded_and_keyed_by_counter() -> None:
    from context_ceiling.core.tokenizers import CountCache

    cache = CountCache(max_bytes=3000, min_chars=100)
    o200k, cl100k = cache.wrap(ENC), cache.wrap(TiktokenCounter("cl100k_base"))
    a, b, c = ("alpha beta " * 100), ("gamma delta " * 100), ("short")
    assert o200k.count(a) == ENC.count(a) and cache.misses == 1
    assert o200k.count(a) == ENC.count(a) and cache.hits == 1
    # another tokenizer never sees this one's counts
    assert cl100k.count(a) == TiktokenCounter("cl100k_base").count(a) and cache.misses == 2
    # short texts are not kept
    assert o200k.count(c) == ENC.count(c) and len(cache) == 2
    # bounded by bytes of text: the least recently used goes first
    o200k.count(b)
    assert cache.bytes <= 3000 and len(cache) == 2
    hits = cache.hits
    o200k.count(b)
    assert cache.hits == hits + 1
    misses = cache.misses
    o200k.count(a)  # the least recently used entry, evicted when b came in: a miss again
    assert cache.hits == hits + 1 and cache.misses == misses + 1


def test_count_cache_bound_is_in_bytes_for_any_script() -> None:
    """Non-Latin text takes 2-4 bytes a character: the bound is on memory, not characters."""
    import sys

    from context_ceiling.core.tokenizers import CountCache

    cache = CountCache(max_bytes=20_000, min_chars=100)
    counter = cache.wrap(ENC)
    texts = [f"{k} " + "🚀語" * 600 for k in range(20)]
    for t in texts:
        counter.count(t)
    held = [t for t in texts if (ENC.name, t) in cache._lru]
    assert held and sum(sys.getsizeof(t) for t in held) <= 20_000 == cache.max_bytes
    assert cache.bytes == sum(sys.getsizeof(t) for t in held)


def _spy() -> tuple[list[str], Any]:
    """A counter that records every text it is asked to count."""
    seen: list[str] = []

    class Spy:
        name = ENC.name

        def count(self, text: str) -> int:
            seen.append(text)
            return ENC.count(text)

    return seen, Spy()


def test_request_memo_encodes_only_what_trimming_rewrote() -> None:
    """Enforcing recounts the fitted body; the texts it kept are not encoded a second time."""
    from context_ceiling.core.tokenizers import RequestMemo
    from context_ceiling.formats import fit

    encoded, spy = _spy()
    docs = [
        f'<document id="{i}">' + f"clause {i} of the agreement. " * 40 + "</document>"
        for i in range(12)
    ]
    body = {"model": "m", "messages": [{"role": "user", "content": "\n".join(docs) + "\nQ?"}]}
    memo = RequestMemo(spy, min_chars=64)
    count = count_openai(body, memo, None, CHUNKS)
    first = len(encoded)
    out, report = fit(
        body,
        shape="openai",
        budget=count.total // 2,
        counter=memo,
        count=count,
        chunk_pattern=CHUNKS,
    )
    assert report.fits and report.after == count_openai(out, ENC, None, CHUNKS).total
    again = [t for t in encoded[first:] if len(t) >= 64]
    assert not any(t in docs for t in again), "kept chunks were counted from the memo"
    plain, plain_report = fit(
        body, shape="openai", budget=count.total // 2, counter=ENC, chunk_pattern=CHUNKS
    )
    assert (plain, plain_report) == (out, report)


def test_a_derived_body_counts_only_its_new_messages() -> None:
    """A fitted body shares its untouched messages with the body counted before it; with that
    count as its prior, only the messages that are new objects are walked and encoded, and the
    count is the one a fresh walk gives, parts and all."""
    from context_ceiling.core.counting import prior_of

    old = [
        {"role": "user", "content": f"turn {i}: " + "words of an older turn " * 30}
        for i in range(6)
    ]
    body = {"model": "m", "messages": [{"role": "system", "content": "Be brief."}, *old]}
    before = count_openai(body, ENC, None, CHUNKS)
    rewritten = {"role": "user", "content": "a shortened turn"}
    derived = {**body, "messages": [body["messages"][0], old[0], rewritten, *old[3:]]}
    seen, spy = _spy()
    got = count_openai(derived, spy, None, CHUNKS, prior_of(body["messages"], before))  # type: ignore[arg-type]
    assert got == count_openai(derived, ENC, None, CHUNKS)
    assert "a shortened turn" in seen
    assert not any("older turn" in t for t in seen), "shared messages are taken over"


def test_a_shared_message_whose_role_in_the_request_changed_is_counted_again() -> None:
    """Dropping the latest user turn makes an earlier one the latest: the same object, another
    component, so its prior parts do not apply."""
    from context_ceiling.core.counting import prior_of

    a = {"role": "user", "content": "first question " * 20}
    b = {"role": "assistant", "content": "an answer"}
    c = {"role": "user", "content": "second question"}
    for fn, body in (
        (count_openai, {"model": "m", "messages": [a, b, c]}),
        (count_anthropic, {"model": "m", "max_tokens": 8, "messages": [a, b, c]}),
    ):
        before = fn(body, ENC, None, CHUNKS)
        derived = {**body, "messages": [a, b]}
        got = fn(derived, ENC, None, CHUNKS, prior_of(body["messages"], before))  # type: ignore[arg-type]
        assert got == fn(derived, ENC, None, CHUNKS)
        assert got.components[Component.LATEST_USER] > before.components[Component.LATEST_USER]


def test_the_prior_applies_to_responses_items_and_gemini_contents() -> None:
    from context_ceiling.core.counting import prior_of
    from context_ceiling.formats.gemini import count as count_gemini
    from context_ceiling.formats.responses import count as count_responses

    items = [
        {"role": "user", "content": "look this up " * 10},
        {"type": "function_call", "call_id": "c1", "name": "search", "arguments": '{"q": "x"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "result text " * 50},
        {"role": "user", "content": "and now?"},
    ]
    body = {"model": "m", "instructions": "Be brief.", "input": items}
    before = count_responses(body, ENC, None, CHUNKS)
    derived = {**body, "input": [items[0], items[1], {**items[2], "output": "cut"}, items[3]]}
    seen, spy = _spy()
    got = count_responses(derived, spy, None, CHUNKS, prior_of(items, before))
    assert got == count_responses(derived, ENC, None, CHUNKS)
    assert not any("look this up" in t for t in seen) and "cut" in seen
    contents = [
        {"role": "user", "parts": [{"text": "an old question " * 10}]},
        {"role": "model", "parts": [{"text": "an old answer"}]},
        {"role": "user", "parts": [{"text": "the question"}]},
    ]
    gbody = {"contents": contents}
    gbefore = count_gemini(gbody, ENC, None, CHUNKS)
    gderived = {"contents": [contents[0], contents[2]]}
    assert count_gemini(gderived, ENC, None, CHUNKS, prior_of(contents, gbefore)) == count_gemini(
        gderived, ENC, None, CHUNKS
    )
