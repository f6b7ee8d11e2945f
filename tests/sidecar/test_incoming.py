"""The proxy path's request object answers what Starlette's ``Request`` answered for the same
scope: header lookups (the first of a repeated header), every header in order for forwarding,
the path as ``request.url.path`` gives it, the client's raw path, the query's parameters, and
the body (a hang-up while it arrives is ``ClientDisconnect``)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from starlette.requests import Request

from context_ceiling.sidecar.incoming import ClientDisconnect, Incoming


def _scope(
    path: str = "/v1/chat/completions",
    headers: list[tuple[bytes, bytes]] | None = None,
    query: bytes = b"",
    raw_path: bytes | None = None,
) -> dict[str, Any]:
    scope: dict[str, Any] = {
        "type": "http",
        "method": "POST",
        "path": path,
        "query_string": query,
        "headers": headers if headers is not None else [(b"host", b"sidecar:8080")],
        "server": ("127.0.0.1", 8080),
        "scheme": "http",
        "root_path": "",
    }
    if raw_path is not None:
        scope["raw_path"] = raw_path
    return scope


async def _no_body() -> dict[str, Any]:
    raise AssertionError("not read")


async def _chunks(request: Incoming) -> list[bytes]:
    return [c async for c in request.stream()]


def test_headers_as_starlette_reads_them() -> None:
    raw = [
        (b"host", b"sidecar:8080"),
        (b"x-request-id", b"first"),
        (b"authorization", b"Bearer sk-test"),
        (b"x-request-id", b"second"),
        (b"accept-encoding", b"gzip, br"),
    ]
    ours, theirs = Incoming(_scope(headers=raw), _no_body), Request(_scope(headers=raw))
    for name in ("x-request-id", "authorization", "accept-encoding", "x-ceiling-workload"):
        assert ours.headers.get(name) == theirs.headers.get(name)
        assert (name in ours.headers) == (name in theirs.headers)
    assert ours.headers["x-request-id"] == "first"
    # forwarded upstream: every header, repeats included, in the client's order
    assert ours.headers.pairs == list(theirs.headers.items())
    assert ours.headers.raw is raw
    assert sum(len(k) + len(v) for k, v in ours.headers.raw) == sum(
        len(k) + len(v) for k, v in theirs.headers.raw
    )


@pytest.mark.parametrize(
    "path",
    [
        "/v1/chat/completions",
        "/v1beta/models/gemini-2.5-flash:generateContent",
        "/model/arn:aws:bedrock:us-east-1:123:inference-profile/x/converse",
        "/v1/odd?name#frag\\back",
        "//double/slash",
    ],
)
def test_path_as_starlette_url_path(path: str) -> None:
    ours = Incoming(_scope(path=path), _no_body)
    if not path.startswith("//"):  # Starlette reads "//x" as a host without a Host header
        assert ours.path == Request(_scope(path=path)).url.path
    assert ours.path.count("?") == 0 and ours.path.count("#") == 0


def test_raw_path_keeps_the_clients_escapes() -> None:
    escaped = b"/model/arn%3Aaws%3Abedrock/converse"
    ours = Incoming(_scope(path="/model/arn:aws:bedrock/converse", raw_path=escaped), _no_body)
    assert ours.raw_path == escaped.decode()
    assert Incoming(_scope(path="/v1/messages"), _no_body).raw_path == "/v1/messages"


@given(
    st.lists(
        st.tuples(
            st.text("abcxyz_-.~%20+&=", min_size=0, max_size=6),
            st.text("abc123_-.~%2F+ =", min_size=0, max_size=8),
        ),
        max_size=5,
    )
)
def test_query_as_starlette_multi_items(items: list[tuple[str, str]]) -> None:
    query = "&".join(f"{k}={v}" for k, v in items).encode("latin-1")
    ours = Incoming(_scope(query=query), _no_body).query()
    assert ours == list(Request(_scope(query=query)).query_params.multi_items())


def test_body_read_once_as_it_arrives() -> None:
    messages: list[dict[str, Any]] = [
        {"type": "http.request", "body": b'{"model":', "more_body": True},
        {"type": "http.request", "body": b"", "more_body": True},
        {"type": "http.request", "body": b'"m"}', "more_body": False},
    ]

    async def receive() -> dict[str, Any]:
        return messages.pop(0)

    request = Incoming(_scope(), receive)
    assert asyncio.run(_chunks(request)) == [b'{"model":', b'"m"}']
    with pytest.raises(RuntimeError, match="already read"):
        asyncio.run(_chunks(request))


def test_a_hang_up_mid_body_is_client_disconnect() -> None:
    messages: list[dict[str, Any]] = [
        {"type": "http.request", "body": b"{", "more_body": True},
        {"type": "http.disconnect"},
    ]

    async def receive() -> dict[str, Any]:
        return messages.pop(0)

    with pytest.raises(ClientDisconnect):
        asyncio.run(_chunks(Incoming(_scope(), receive)))
