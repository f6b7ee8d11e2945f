"""Whose credentials a request carries, and which upstreams may see them.

A client's key and prompt must only reach the provider they belong to. Some requests say so
whatever route they take: an API's own credentials (an AWS SigV4 signature for Bedrock, a
Google ``x-goog-api-key``: each API module says which, :attr:`ApiInfo.owns`), an Azure
``api-key`` header or an Azure deployment path. Such a request goes only to an upstream of that
provider; where this sidecar has none it is refused in that provider's own error shape, with the
configuration line to add, and never forwarded to another provider's upstream (a sidecar with
only an OpenAI upstream would otherwise send an Azure key, or a signed Bedrock call, to
api.openai.com).
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import urlsplit

from starlette.responses import Response

from context_ceiling.core.vocabulary import Api
from context_ceiling.formats import APIS
from context_ceiling.sidecar.config import Upstream
from context_ceiling.sidecar.errors import error_response

__all__ = ["AZURE", "Owner", "accepts", "owner_of", "refusal", "refusal_message"]

#: a registered API's name (its credentials go to its upstreams only), or :data:`AZURE`
Owner = str
#: Azure OpenAI: an OpenAI-style API whose credentials go only to Azure resources
AZURE = "azure"

#: hosts of Azure OpenAI and Azure AI resources
AZURE_HOSTS = (".openai.azure.com", ".cognitiveservices.azure.com", ".services.ai.azure.com")

_AZURE_ADD = (
    "add an Azure upstream: upstreams.named.<name>: {api: openai, azure: true, "
    "base_url: https://<resource>.openai.azure.com}"
)
_AZURE_WHAT = "Azure OpenAI credentials (an api-key header or a deployment path)"


def owner_of(headers: Mapping[str, str], path: str) -> Owner | None:
    """The provider a request's credentials or path belong to, where only it may see them
    (None: any upstream of the route's API)."""
    for api, info in APIS.items():
        if info.owns is not None and info.owns(headers):
            return api
    if "api-key" in headers or path.startswith("/openai/deployments/"):
        return AZURE
    return None


def accepts(owner: Owner | None, api: Api, upstream: Upstream) -> bool:
    """Whether an upstream (of ``api``) may receive a request whose credentials are ``owner``'s."""
    if owner is None:
        return True
    if owner == AZURE:
        host = urlsplit(upstream.base_url).hostname or ""
        return bool(getattr(upstream, "azure", False)) or host.endswith(AZURE_HOSTS)
    return owner == api


def refusal_message(owner: Owner) -> str:
    if owner == AZURE:
        what, add = _AZURE_WHAT, _AZURE_ADD
    else:
        info = APIS[owner]
        what, add = info.credentials, f"add upstreams.{owner}: {{base_url: {info.example}}}"
    return (
        f"this request carries {what} and this sidecar has no upstream of that provider; "
        f"it was not forwarded anywhere ({add})"
    )


def refusal(
    owner: Owner, api: Api, status: int = 404, headers: dict[str, str] | None = None
) -> Response:
    """The refusal in the shape the credentials' own SDK parses (a signed AWS call gets
    botocore's), else in the API's the client called."""
    return error_response(
        owner if owner in APIS else api,
        status,
        refusal_message(owner),
        "not_found",
        headers=headers,
    )
