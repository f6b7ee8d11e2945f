"""Anthropic's models on Google Cloud Vertex AI: Anthropic messages (the format of
:mod:`~context_ceiling.formats.anthropic`, ``anthropic_version`` in the body) posted to
``/v1/projects/{project}/locations/{region}/publishers/anthropic/models/{model}:rawPredict``
(``:streamRawPredict`` for a stream), the model in the path; token counts at
``.../models/count-tokens:rawPredict``, the model in the body. Path and query go upstream as the
client sent them, to the Anthropic-API upstream the model names (a Vertex AI endpoint such as
``https://us-east5-aiplatform.googleapis.com``)."""

from __future__ import annotations

import re

from context_ceiling.formats import anthropic
from context_ceiling.formats.base import Provider, Route, model_in_path

__all__ = ["ROUTES", "VERTEX"]

_MODELS = r"^/v1/projects/[^/]+/locations/[^/]+/publishers/anthropic/models/"
_COUNT = re.compile(_MODELS + r"count-tokens:rawPredict$")
_GENERATE = re.compile(_MODELS + r"(?!count-tokens:)[^/:]+:(?:rawPredict|streamRawPredict)$")

#: Google Cloud Vertex AI serving Anthropic's models (the Anthropic-API upstream the model names)
VERTEX = Provider("gcp.vertex_ai")

ROUTES = (
    Route(
        anthropic.FORMAT,
        "vertex_anthropic_messages",
        "/v1/projects/{project}/locations/{region}/publishers/anthropic/models/{model}:rawPredict",
        pattern=_GENERATE,
        provider=VERTEX,
        path_model=model_in_path,
        path_model_first=True,
    ),
    Route(
        anthropic.FORMAT,
        "vertex_anthropic_count_tokens",
        "/v1/projects/{project}/locations/{region}/publishers/anthropic/models/count-tokens:rawPredict",
        pattern=_COUNT,
        count_only=True,
        provider=VERTEX,
    ),
)
