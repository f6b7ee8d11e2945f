"""Errors in the client's own API format.

An OpenAI SDK raises the right exception class only for an OpenAI-shaped body, an Anthropic SDK
only for an Anthropic-shaped one; so every error the sidecar itself produces is rendered in the
format of the API the client called.
"""

from __future__ import annotations

import re

import orjson
from starlette.responses import Response

from context_ceiling.core.wire import Api

_OPENAI_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    500: "server_error",
    502: "api_error",
    503: "api_error",
    504: "timeout",
}
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    422: "invalid_request_error",
    502: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
}


_GOOGLE_STATUS = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    408: "DEADLINE_EXCEEDED",
    413: "INVALID_ARGUMENT",
    429: "RESOURCE_EXHAUSTED",
    431: "INVALID_ARGUMENT",
    500: "INTERNAL",
    502: "UNAVAILABLE",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


def error_body(api: Api, status: int, message: str, code: str | None = None) -> bytes:
    if api == "gemini":  # google.rpc.Status, as the Gemini API and the google-genai SDK use it
        return orjson.dumps(
            {
                "error": {
                    "code": status,
                    "message": message,
                    "status": _GOOGLE_STATUS.get(status, "UNKNOWN"),
                }
            }
        )
    if api == "anthropic":
        return orjson.dumps(
            {
                "type": "error",
                "error": {"type": _ANTHROPIC_TYPES.get(status, "api_error"), "message": message},
            }
        )
    return orjson.dumps(
        {
            "error": {
                "message": message,
                "type": _OPENAI_TYPES.get(status, "api_error"),
                "param": None,
                "code": code,
            }
        }
    )


#: credentials a message could carry from what the client sent (a Gemini ``?key=``, a key in a
#: model name or a field's value): never echoed back
_ECHOED_SECRET = re.compile(
    r"(?i)((?:^|[?&;\s'\"(])(?:key|api_key|api-key|apikey|access_token|token|sig|signature)=)"
    r"[^&\s'\")]+"
    r"|()sk-(?:ant-|proj-|svcacct-)?[A-Za-z0-9_\-]{16,}|()AIza[0-9A-Za-z_\-]{30,}"
)


def scrub(message: str) -> str:
    """``message`` without any credential the client sent in it."""
    return _ECHOED_SECRET.sub(lambda m: (m.group(1) or "") + "[REDACTED]", message)


def error_response(
    api: Api,
    status: int,
    message: str,
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> Response:
    return Response(
        error_body(api, status, scrub(message), code),
        status_code=status,
        media_type="application/json",
        headers=headers,
    )
