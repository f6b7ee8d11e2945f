"""Azure OpenAI: OpenAI chat completions and the Responses API on Azure's paths. The wire
format is OpenAI's (:mod:`~context_ceiling.formats.openai_chat`,
:mod:`~context_ceiling.formats.responses`); what differs is where a request goes (path and query
as the client sent them, to the Azure resource its model or deployment belongs to) and that a
deployment in the path names the model when the body does not."""

from __future__ import annotations

import re

from context_ceiling.formats import openai_chat, responses
from context_ceiling.formats.base import Provider, Route

__all__ = ["AZURE", "DEPLOYMENT_CHAT", "ROUTES", "deployment"]

_DEPLOYMENT_CHAT = re.compile(r"^/openai/deployments/.+/chat/completions$")


#: Azure OpenAI: its requests go to the named upstream marked ``azure: true`` unless the model
#: names one; priced as Azure's
AZURE = Provider("azure.ai.openai", prices="azure", marked_by="azure")


def deployment(path: str) -> str:
    """``/openai/deployments/{deployment}/chat/completions`` -> the deployment name."""
    parts = path.split("/")
    return parts[3] if len(parts) > 4 and parts[1:3] == ["openai", "deployments"] else ""


#: ``/openai/deployments/{deployment}/chat/completions``: the deployment names the model
DEPLOYMENT_CHAT = Route(
    openai_chat.FORMAT,
    "azure_chat",
    "/openai/deployments/{deployment}/chat/completions",
    pattern=_DEPLOYMENT_CHAT,
    provider=AZURE,
    path_model=deployment,
)

ROUTES = (
    DEPLOYMENT_CHAT,
    # the v1 API: the model in the body
    Route(
        openai_chat.FORMAT,
        "azure_chat",
        "/openai/v1/chat/completions",
        paths=("/openai/v1/chat/completions",),
        provider=AZURE,
    ),
    # the Responses API (``/openai/responses``: the ``AzureOpenAI`` client's path)
    Route(
        responses.FORMAT,
        "azure_responses",
        "/openai/v1/responses",
        paths=("/openai/v1/responses", "/openai/responses"),
        provider=AZURE,
    ),
)
