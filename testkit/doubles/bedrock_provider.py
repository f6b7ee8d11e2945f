"""A test double for AWS Bedrock's runtime (``bedrock-runtime.REGION.amazonaws.com``), served
for real on loopback.

It stands in only for what cannot run here: the hosted Bedrock API. It speaks its wire formats
(Converse and ConverseStream, InvokeModel and InvokeModelWithResponseStream on an Anthropic
model: JSON bodies, AWS event-stream frames, errors with ``x-amzn-ErrorType``), and it checks
every request's SigV4 signature as AWS does, with the credentials it was given (botocore's
signer recomputes it over the request as it arrived: host, path, query, signed headers, body).
A request signed for another host, with other keys, or with a body changed after signing is
answered 403 ``InvalidSignatureException``. A Bedrock API key (``Authorization: Bearer``) equal
to ``api_key`` is taken instead.

The event-stream frames are written here, with their CRCs, independently of the product's
codec, so a client's parse of them (boto3's) checks the product against the format, not
against itself.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hmac
import re
import struct
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

__all__ = ["BedrockProviderDouble", "Signed", "frame"]

_AUTH = re.compile(
    r"^AWS4-HMAC-SHA256 Credential=(?P<key>[^/]+)/(?P<date>\d{8})/(?P<region>[^/]+)/"
    r"(?P<service>[^/]+)/aws4_request, SignedHeaders=(?P<headers>[^,]+), "
    r"Signature=(?P<sig>[0-9a-f]{64})$"
)


def frame(headers: dict[str, str], payload: bytes) -> bytes:
    """One AWS event-stream message with string headers (prelude, headers, payload, CRCs)."""
    raw = b""
    for k, v in headers.items():
        kb, vb = k.encode(), v.encode()
        raw += bytes([len(kb)]) + kb + b"\x07" + struct.pack(">H", len(vb)) + vb
    total = 16 + len(raw) + len(payload)
    prelude = struct.pack(">II", total, len(raw))
    prelude += struct.pack(">I", binascii.crc32(prelude) & 0xFFFFFFFF)
    message = prelude + raw + payload
    return message + struct.pack(">I", binascii.crc32(message) & 0xFFFFFFFF)


def _event(name: str, payload: dict[str, Any]) -> bytes:
    return frame(
        {":event-type": name, ":content-type": "application/json", ":message-type": "event"},
        orjson.dumps(payload),
    )


@dataclass
class Signed:
    """One request as the double received it, and what its signature check found."""

    path: str
    headers: dict[str, str]
    body: bytes
    #: ``sigv4`` (a valid signature by ``access_key``), ``api_key``, or why it was refused
    auth: str

    @property
    def json(self) -> Any:
        return orjson.loads(self.body)


@dataclass
class BedrockProviderDouble:
    """Loopback stand-in for Bedrock's runtime. ``input_tokens`` is the usage it reports."""

    access_key: str = "AKIDBEDROCKDOUBLE01"
    secret_key: str = "bedrock/double/secret/key/0000000000000"
    region: str = "us-east-1"
    api_key: str = "ABSKQmVkcm9ja0FQSUtleS1kb3VibGU="
    input_tokens: int = 1234
    output_tokens: int = 7
    cache_read: int = 0
    text: str = "The answer is 42."
    received: list[Signed] = field(default_factory=list)

    # -- the signature -----------------------------------------------------------------------

    def check(self, request: Request, body: bytes) -> str:
        """``sigv4``, ``api_key``, or the reason the request is refused."""
        from botocore.auth import SigV4Auth
        from botocore.awsrequest import AWSRequest
        from botocore.credentials import Credentials

        auth = request.headers.get("authorization", "")
        if auth.startswith("Bearer "):
            ok = hmac.compare_digest(auth[7:].encode(), self.api_key.encode())
            return "api_key" if ok else "unknown API key"
        m = _AUTH.match(auth)
        if m is None:
            return "no SigV4 signature"
        if m["key"] != self.access_key:
            return "unknown access key"
        if m["region"] != self.region or m["service"] != "bedrock":
            return f"signed for {m['region']}/{m['service']}"
        signed = m["headers"].split(";")
        raw_path = request.scope["raw_path"].decode("latin-1")
        query = request.scope.get("query_string", b"").decode("latin-1")
        host = request.headers.get("host", "")
        url = f"http://{host}{raw_path}" + (f"?{query}" if query else "")
        headers = {h: request.headers.get(h, "") for h in signed}
        req = AWSRequest(method=request.method, url=url, data=body, headers=headers)
        req.context["timestamp"] = request.headers.get("x-amz-date", "")
        signer = SigV4Auth(Credentials(self.access_key, self.secret_key), "bedrock", self.region)
        canonical = signer.canonical_request(req)
        expected = signer.signature(signer.string_to_sign(req, canonical), req)
        return "sigv4" if hmac.compare_digest(expected, m["sig"]) else "signature mismatch"

    async def _receive(self, request: Request) -> tuple[Signed, Response | None]:
        body = await request.body()
        got = Signed(request.url.path, dict(request.headers), body, self.check(request, body))
        self.received.append(got)
        if got.auth in ("sigv4", "api_key"):
            return got, None
        return got, Response(
            orjson.dumps({"message": f"The request signature is not valid: {got.auth}"}),
            status_code=403,
            media_type="application/json",
            headers={"x-amzn-ErrorType": "InvalidSignatureException:http://internal.amazon.com/"},
        )

    # -- canned answers ----------------------------------------------------------------------

    def _usage(self) -> dict[str, int]:
        return {
            "inputTokens": self.input_tokens,
            "outputTokens": self.output_tokens,
            "totalTokens": self.input_tokens + self.output_tokens + self.cache_read,
            "cacheReadInputTokens": self.cache_read,
            "cacheWriteInputTokens": 0,
        }

    def converse_body(self) -> dict[str, Any]:
        return {
            "output": {"message": {"role": "assistant", "content": [{"text": self.text}]}},
            "stopReason": "end_turn",
            "usage": self._usage(),
            "metrics": {"latencyMs": 12},
        }

    def converse_events(self, fail_after: int | None = None) -> list[bytes]:
        words = self.text.split(" ")
        out = [_event("messageStart", {"role": "assistant"})]
        for k, w in enumerate(words):
            piece = w if k == 0 else " " + w
            out.append(
                _event("contentBlockDelta", {"delta": {"text": piece}, "contentBlockIndex": 0})
            )
        out.append(_event("contentBlockStop", {"contentBlockIndex": 0}))
        out.append(_event("messageStop", {"stopReason": "end_turn"}))
        out.append(_event("metadata", {"usage": self._usage(), "metrics": {"latencyMs": 12}}))
        return out[:fail_after] if fail_after is not None else out

    def anthropic_message(self, model: str) -> dict[str, Any]:
        return {
            "id": "msg_bdrk_double",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [{"type": "text", "text": self.text}],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens},
        }

    def invoke_events(self, model: str) -> list[bytes]:
        start = self.anthropic_message(model)
        start["content"], start["stop_reason"] = [], None
        start["usage"] = {"input_tokens": self.input_tokens, "output_tokens": 1}
        events: list[dict[str, Any]] = [
            {"type": "message_start", "message": start},
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": self.text},
            },
            {"type": "content_block_stop", "index": 0},
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": {"output_tokens": self.output_tokens},
            },
            {
                "type": "message_stop",
                "amazon-bedrock-invocationMetrics": {
                    "inputTokenCount": self.input_tokens,
                    "outputTokenCount": self.output_tokens,
                    "invocationLatency": 12,
                    "firstByteLatency": 5,
                },
            },
        ]
        return [
            _event("chunk", {"bytes": base64.b64encode(orjson.dumps(e)).decode()}) for e in events
        ]

    # -- routes ------------------------------------------------------------------------------

    @staticmethod
    def _stream(frames: list[bytes], pace: float = 0.0) -> StreamingResponse:
        async def gen() -> AsyncIterator[bytes]:
            for f in frames:
                if pace:
                    await asyncio.sleep(pace)
                yield f

        return StreamingResponse(gen(), media_type="application/vnd.amazon.eventstream")

    async def converse(self, request: Request) -> Response:
        _, refused = await self._receive(request)
        if refused is not None:
            return refused
        return Response(orjson.dumps(self.converse_body()), media_type="application/json")

    async def converse_stream(self, request: Request) -> Response:
        _, refused = await self._receive(request)
        if refused is not None:
            return refused
        cut = request.headers.get("x-double-cut-after")
        return self._stream(self.converse_events(int(cut) if cut else None))

    async def invoke(self, request: Request) -> Response:
        got, refused = await self._receive(request)
        if refused is not None:
            return refused
        model = request.path_params["model"]
        if "anthropic_version" not in got.json:
            return Response(
                orjson.dumps({"message": "anthropic_version is required"}),
                status_code=400,
                media_type="application/json",
                headers={"x-amzn-ErrorType": "ValidationException"},
            )
        return Response(
            orjson.dumps(self.anthropic_message(model)),
            media_type="application/json",
            headers={
                "x-amzn-bedrock-input-token-count": str(self.input_tokens),
                "x-amzn-bedrock-output-token-count": str(self.output_tokens),
            },
        )

    async def invoke_stream(self, request: Request) -> Response:
        _, refused = await self._receive(request)
        if refused is not None:
            return refused
        return self._stream(self.invoke_events(request.path_params["model"]))

    async def count_tokens(self, request: Request) -> Response:
        _, refused = await self._receive(request)
        if refused is not None:
            return refused
        return Response(
            orjson.dumps({"inputTokens": self.input_tokens}), media_type="application/json"
        )

    async def async_invokes(self, request: Request) -> Response:
        """``GET /async-invoke``: the asynchronous invocations (none)."""
        _, refused = await self._receive(request)
        if refused is not None:
            return refused
        return Response(orjson.dumps({"asyncInvokeSummaries": []}), media_type="application/json")

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/model/{model:path}/converse", self.converse, methods=["POST"]),
                Route(
                    "/model/{model:path}/converse-stream", self.converse_stream, methods=["POST"]
                ),
                Route("/model/{model:path}/invoke", self.invoke, methods=["POST"]),
                Route(
                    "/model/{model:path}/invoke-with-response-stream",
                    self.invoke_stream,
                    methods=["POST"],
                ),
                Route("/model/{model:path}/count-tokens", self.count_tokens, methods=["POST"]),
                Route("/async-invoke", self.async_invokes, methods=["GET"]),
            ]
        )
