"""The admin API: read, validate and replace the running ceilings.

``POST /admin/ceilings/validate`` runs every check ``PUT /admin/ceilings`` would (the version
against the running one, the windows against this sidecar's registry, the file it would persist
to) and changes nothing: what ``ceiling push --dry-run`` asks, so a dry run that passes is a push
that passes. A separate path, not a flag, so that an older sidecar answers 404 instead of
applying the document.

Off (404) unless a token is configured (``CEILING_ADMIN_TOKEN`` or ``admin_token_file``).
Requests need ``Authorization: Bearer <token>``: 401 without it, 403 with a wrong one; tokens
are compared in constant time and never logged.
"""

from __future__ import annotations

import hmac
from typing import Protocol

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from context_ceiling.ceilings.document import (
    EMPTY,
    CeilingsDocument,
    CeilingsError,
    CeilingsPersistError,
)
from context_ceiling.core.models import Registry
from context_ceiling.sidecar.ceilings.store import CeilingStore, parse_off_loop
from context_ceiling.sidecar.config import Settings
from context_ceiling.sidecar.observability.logs import bounded
from context_ceiling.sidecar.routing import action_for
from context_ceiling.sidecar.workers.group import WorkerGroup

MAX_DOCUMENT_BYTES = 4 * 1024 * 1024


class AdminDeps(Protocol):
    """What the ceilings admin API and ``GET /budget`` use: the ceilings store, the worker
    group a change is passed on to, the two tokens, the registry, the workloads and the
    settings (enforcement, for the budget's answer)."""

    ceilings: CeilingStore
    group: WorkerGroup | None
    admin_token: str | None
    budget_token: str | None
    registry: Registry
    workloads: frozenset[str]
    settings: Settings


def _error(status: int, kind: str, message: str, reasons: list[str] | None = None) -> JSONResponse:
    body: dict[str, object] = {"type": kind, "message": message}
    if reasons is not None:
        body["reasons"] = reasons
    return JSONResponse({"error": body}, status_code=status)


def check_token(state: AdminDeps, header: str | None) -> Response | None:
    """None when authorized, else the response to send."""
    if state.admin_token is None:
        return _error(404, "not_found", "the admin API is off: no admin token is configured")
    if not header or not header.lower().startswith("bearer "):
        return _error(
            401, "authentication_error", "Authorization: Bearer <admin token> is required"
        )
    given = header[7:].strip().encode()
    if not hmac.compare_digest(given, state.admin_token.encode()):
        return _error(403, "permission_error", "the admin token is not valid")
    return None


class Admin:
    def __init__(self, state: AdminDeps) -> None:
        self.state = state

    async def ceilings(self, request: Request) -> Response:
        denied = check_token(self.state, request.headers.get("authorization"))
        if denied is not None:
            return denied
        store = self.state.ceilings
        if request.method == "GET":
            return Response(
                store.current.model_dump_json(exclude_none=True), media_type="application/json"
            )
        read = await self._document(request)
        if isinstance(read, Response):
            return read
        doc, force = read
        group = self.state.group
        unused = await anyio.to_thread.run_sync(store.unused_in, doc)
        if unused and request.query_params.get("strict", "").lower() in ("1", "true", "yes"):
            store.reloads.labels(source="api", result="failure").inc()
            return _error(
                422,
                "unused_ceilings",
                "entries would enforce nothing (strict); nothing changed",
                unused,
            )
        try:
            if group is None:
                store.apply(doc, "api", force=force, unused=unused)
                digest = None
            else:
                # one push at a time across the workers, validated against the latest push
                # any of them took: versions only go up, and the file is what runs
                async with group.push_lock():
                    store.apply(doc, "api", force=force, unused=unused)
                    digest = group.publish(doc, force)
        except CeilingsPersistError as exc:
            return _error(
                503,
                "persist_failed",
                "the document could not be persisted; nothing changed",
                exc.reasons,
            )
        except CeilingsError as exc:
            return _error(
                422, "invalid_ceilings", "the document was rejected; nothing changed", exc.reasons
            )
        body: dict[str, object] = {
            "applied": True,
            "version": doc.version,
            "entries": len(doc.entries),
            "unused": unused,
        }
        if group is not None and digest is not None:
            # the other workers apply it from the shared file: answer once every one runs it,
            # and say how many do if one has not within the wait
            done, of = await group.wait_applied(digest)
            body["workers"], body["workers_applied"] = of, done
        return JSONResponse(body)

    async def validate(self, request: Request) -> Response:
        denied = check_token(self.state, request.headers.get("authorization"))
        if denied is not None:
            return denied
        read = await self._document(request, count_failure=False)
        if isinstance(read, Response):
            return read
        doc, force = read
        store = self.state.ceilings
        unchanged = store.current is not EMPTY and doc.same_content(store.current)
        reasons = [] if unchanged else store.dry_run(doc, force)
        if reasons:
            return _error(
                422, "invalid_ceilings", "the document would be rejected; nothing changed", reasons
            )
        return JSONResponse(
            {
                "valid": True,
                "unchanged": unchanged,
                "version": doc.version,
                "running_version": store.current.version,
                "entries": len(doc.entries),
                "unused": await anyio.to_thread.run_sync(store.unused_in, doc),
            }
        )

    async def _document(
        self, request: Request, count_failure: bool = True
    ) -> tuple[CeilingsDocument, bool] | Response:
        """The request's document and its ``force`` flag, or the error response (a document
        that does not parse counts as a failed reload, except in a dry run)."""
        raw = await request.body()
        if len(raw) > MAX_DOCUMENT_BYTES:
            return _error(413, "request_too_large", f"document exceeds {MAX_DOCUMENT_BYTES} bytes")
        force = request.query_params.get("force", "").lower() in ("1", "true", "yes")
        try:
            # off the event loop: a document up to the size cap takes seconds to validate
            return await anyio.to_thread.run_sync(parse_off_loop, raw, "request body"), force
        except CeilingsError as exc:
            if count_failure:
                self.state.ceilings.reloads.labels(source="api", result="failure").inc()
            return _error(
                422, "invalid_ceilings", "the document was rejected; nothing changed", exc.reasons
            )


def budget_answer(state: AdminDeps, request: Request) -> Response:
    """The read-only budget: the input budget for a model, workload and output reservation, with
    the ceiling's version and provenance and how to count against it (``context_ceiling/budget.py``)."""
    from context_ceiling.budget import answer_for

    token = state.budget_token
    if token is not None:
        header = request.headers.get("authorization") or ""
        given = header[7:].strip().encode() if header.lower().startswith("bearer ") else b""
        if not hmac.compare_digest(given, token.encode()):
            return _error(401, "authentication_error", "Authorization: Bearer <budget token>")
    q = request.query_params
    model = q.get("model")
    if not model:
        return _error(400, "invalid_request_error", "the 'model' query parameter is required")
    spec = state.registry.resolve(model)
    if spec is None:
        return _error(404, "not_found", f"no model entry matches {bounded(model)!r}")
    workload = q.get("workload") or "default"
    if workload not in state.workloads:
        workload = "default"  # as a request with an undeclared workload counts
    raw = q.get("reservation")
    if raw is None:
        reservation = state.settings.enforcement.default_output_reservation
    elif raw.isdigit() and int(raw) < spec.window:
        reservation = int(raw)
    else:
        return _error(
            400,
            "invalid_request_error",
            f"'reservation' must be a whole number of tokens below the window ({spec.window})",
        )
    action = action_for(state.settings.enforcement, workload, spec)
    fallback = [
        (name, other)
        for name in (action.fallback if action.kind in ("fallback", "trim_then_fallback") else ())
        if name != model and (other := state.registry.resolve(name)) is not None
    ]
    return JSONResponse(
        answer_for(
            spec,
            spec.metric_label,
            workload,
            reservation,
            state.ceilings.current,
            over_ceiling=action.kind,
            fallback=fallback,
        )
    )
