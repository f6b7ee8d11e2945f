"""Whose credentials a request carries, and which upstreams may see them.

A client's key and prompt must only reach the provider they belong to. Some requests say so
whatever route they take: an AWS SigV4 signature (Bedrock), an Azure ``api-key`` header or an
Azure deployment path, a Google ``x-goog-api-key``. Such a request goes only to an upstream of
that provider; where this sidecar has none it is refused in the client's own error shape, with
the configuration line to add, and never forwarded to another provider's upstream (a sidecar
with only an OpenAI upstream would otherwise send an Azure key, or a signed Bedrock call, to
api.openai.com).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal
from urllib.parse import urlsplit

from starlette.responses import JSONResponse, Response

from context_ceiling.core.vocabulary import Api
from context_ceiling.sidecar.config import Upstream
from context_ceiling.sidecar.errors import error_response

__all__ = ["Owner", "accepts", "owner_of", "refusal", "refusal_message"]

Owner = Literal["aws", "azure", "gemini"]

#: hosts of Azure OpenAI and Azure AI resources
AZURE_HOSTS = (".openai.azure.com", ".cognitiveservices.azure.com", ".services.ai.azure.com")

_ADD = {
    "aws": "AWS Bedrock is not an upstream this sidecar serves: call Bedrock directly",
    "azure": (
        "add an Azure upstream: upstreams.named.<name>: {api: openai, azure: true, "
        "base_url: https://<resource>.openai.azure.com}"
    ),
    "gemini": "add upstreams.gemini: {base_url: https://generativelanguage.googleapis.com}",
}
_WHAT = {
    "aws": "AWS SigV4 credentials (an AWS Bedrock call)",
    "azure": "Azure OpenAI credentials (an api-key header or a deployment path)",
    "gemini": "a Google API key (x-goog-api-key)",
}


def owner_of(headers: Mapping[str, str], path: str) -> Owner | None:
    """The provider a request's credentials or path belong to, where only it may see them
    (None: any upstream of the route's API)."""
    auth = headers.get("authorization", "")
    if auth.startswith("AWS4-") or "x-amz-date" in headers or "x-amz-security-token" in headers:
        return "aws"
    if "api-key" in headers or path.startswith("/openai/deployments/"):
        return "azure"
    if "x-goog-api-key" in headers:
        return "gemini"
    return None


def accepts(owner: Owner | None, api: str, upstream: Upstream) -> bool:
    """Whether an upstream (of ``api``) may receive a request whose credentials are ``owner``'s."""
    if owner is None:
        return True
    if owner == "azure":
        host = urlsplit(upstream.base_url).hostname or ""
        return bool(getattr(upstream, "azure", False)) or host.endswith(AZURE_HOSTS)
    if owner == "gemini":
        return api == "gemini"
    return False  # no upstream of this sidecar is AWS Bedrock


def refusal_message(owner: Owner) -> str:
    return (
        f"this request carries {_WHAT[owner]} and this sidecar has no upstream of that provider; "
        f"it was not forwarded anywhere ({_ADD[owner]})"
    )


def refusal(
    owner: Owner, api: Api, status: int = 404, headers: dict[str, str] | None = None
) -> Response:
    """The refusal in the client's own shape: botocore's (``x-amzn-ErrorType`` and a JSON
    ``message``) for a signed AWS call, else the API's error body."""
    message = refusal_message(owner)
    if owner == "aws":
        return JSONResponse(
            {"message": message},
            status_code=status,
            headers={**(headers or {}), "x-amzn-ErrorType": "ResourceNotFoundException"},
        )
    return error_response(api, status, message, headers=headers)
