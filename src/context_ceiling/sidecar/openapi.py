"""The sidecar's own API as an OpenAPI 3.1 document (``GET /openapi.json``), generated from the
pydantic models the handlers answer with, so the contract and the code cannot drift.

What it covers is the sidecar's own surface: the read-only budget (what request builders in any
language call: a client can be generated from this document), the health probes, and the admin
API that reads, pushes and validates ceilings. The proxied provider routes are the providers'
own APIs and are documented by them; ``/metrics`` is Prometheus' text format.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from pydantic import BaseModel, Field
from pydantic.json_schema import models_json_schema

from context_ceiling import __version__
from context_ceiling.budget import BudgetAnswer
from context_ceiling.ceilings.document import CeilingsDocument

__all__ = ["ErrorBody", "ErrorDetail", "Health", "document"]


class ErrorDetail(BaseModel):
    """What went wrong, in words."""

    type: str = Field(description="not_found, invalid_request_error, authentication_error, ...")
    message: str
    reasons: list[str] | None = Field(default=None, description="every problem found")


class ErrorBody(BaseModel):
    """Every error of the sidecar's own API."""

    error: ErrorDetail


class Health(BaseModel):
    """A probe's answer."""

    status: str = Field(description="ok, or why not")
    ceilings_version: int | None = None


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _errors(*statuses: int) -> dict[str, Any]:
    words = {
        400: "bad input",
        401: "a token is required",
        403: "the token is wrong",
        404: "not found (or the admin API is off)",
        409: "not newer than the running document",
        413: "too large",
        422: "the document was rejected",
    }
    return {str(s): _json(_ref("ErrorBody"), words[s]) for s in statuses}


_BEARER: list[dict[str, list[str]]] = [{"bearer": []}]


@cache
def document() -> dict[str, Any]:
    """The OpenAPI document (built once)."""
    _, schemas = models_json_schema(
        [
            (BudgetAnswer, "serialization"),
            (ErrorBody, "serialization"),
            (Health, "serialization"),
            (CeilingsDocument, "validation"),
        ],
        ref_template="#/components/schemas/{model}",
    )
    query = [
        {
            "name": "model",
            "in": "query",
            "required": True,
            "schema": {"type": "string"},
            "description": "the model as clients name it",
        },
        {
            "name": "workload",
            "in": "query",
            "required": False,
            "schema": {"type": "string", "default": "default"},
            "description": "an undeclared workload counts as default",
        },
        {
            "name": "reservation",
            "in": "query",
            "required": False,
            "schema": {"type": "integer", "minimum": 0},
            "description": "output tokens to reserve (default: the configured reservation)",
        },
    ]
    doc_body = {
        "required": True,
        "content": {"application/json": {"schema": _ref("CeilingsDocument")}},
    }
    anything = {"type": "object", "additionalProperties": True}
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "context-ceiling sidecar",
            "version": __version__,
            "description": "The sidecar's own API: the input budget for request builders, the "
            "health probes and the ceilings admin API.",
        },
        "paths": {
            "/budget": {
                "get": {
                    "operationId": "getBudget",
                    "summary": "The input budget for a model, workload and output reservation",
                    "parameters": query,
                    "security": [{}, *_BEARER],
                    "responses": {
                        "200": _json(_ref("BudgetAnswer"), "the budget"),
                        **_errors(400, 401, 404),
                    },
                }
            },
            "/healthz": {
                "get": {
                    "operationId": "getHealth",
                    "summary": "Liveness",
                    "responses": {"200": _json(_ref("Health"), "alive")},
                }
            },
            "/readyz": {
                "get": {
                    "operationId": "getReady",
                    "summary": "Readiness (503 while shutting down)",
                    "responses": {
                        "200": _json(_ref("Health"), "ready"),
                        "503": _json(_ref("Health"), "shutting down"),
                    },
                }
            },
            "/admin/ceilings": {
                "get": {
                    "operationId": "getCeilings",
                    "summary": "The ceilings document in force",
                    "security": _BEARER,
                    "responses": {
                        "200": _json(_ref("CeilingsDocument"), "the document"),
                        **_errors(401, 403, 404),
                    },
                },
                "put": {
                    "operationId": "putCeilings",
                    "summary": "Apply a newer ceilings document (?dry_run=true, ?strict=true)",
                    "security": _BEARER,
                    "requestBody": doc_body,
                    "responses": {
                        "200": _json(anything, "applied, or unchanged"),
                        **_errors(400, 401, 403, 404, 409, 413, 422),
                    },
                },
            },
            "/admin/ceilings/validate": {
                "post": {
                    "operationId": "validateCeilings",
                    "summary": "Check a ceilings document against this sidecar, change nothing",
                    "security": _BEARER,
                    "requestBody": doc_body,
                    "responses": {
                        "200": _json(anything, "the report"),
                        **_errors(400, 401, 403, 404, 413, 422),
                    },
                }
            },
        },
        "components": {
            "schemas": schemas["$defs"],
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }
