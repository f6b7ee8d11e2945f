"""Errors in the client's own API format.

An OpenAI SDK raises the right exception class only for an OpenAI-shaped body, an Anthropic SDK
only for an Anthropic-shaped one; so every error the sidecar itself produces is rendered in the
format of the API the client called.
"""

from __future__ import annotations

import re

from starlette.responses import Response

from context_ceiling.core.vocabulary import Api
from context_ceiling.formats import API_FORMATS, error_body

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
    """An error the sidecar answers itself, in ``api``'s body and with the headers its SDK
    reads the error's type from."""
    own = API_FORMATS[api].error_headers(status, code)
    return Response(
        error_body(api, status, scrub(message), code),
        status_code=status,
        media_type="application/json",
        headers={**own, **(headers or {})} or None,
    )
