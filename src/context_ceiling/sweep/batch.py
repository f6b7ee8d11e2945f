"""The providers' batch APIs: a step of the sweep sent as one batch at half the price.

OpenAI's Batch API (a JSONL file of requests uploaded to ``/files``, a batch created on
``/batches``, its output file read when it completes) and Anthropic's Message Batches
(``/v1/messages/batches``, its ``results_url`` read when processing has ended) take the same
request bodies the synchronous calls send (:func:`context_ceiling.sweep.solver.request_of`) and
answer within 24 hours for half the list price.

Resumable: every batch is written to ``batches.jsonl`` in the run directory (its id and which
call each request is) before it is waited on, and marked done once its results are in the call
log, so a restart (``--resume``) waits on the batches still open instead of sending their calls
again. The call log is the same as a synchronous run's: one record per call, in the order the
results arrive.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import httpx

from context_ceiling.core.errors import UserError
from context_ceiling.sweep.calllog import append_line, drop_torn_tail

__all__ = [
    "ANTHROPIC",
    "OPENAI",
    "BatchApi",
    "BatchResult",
    "Ledger",
    "Pending",
    "Unconfirmed",
    "api_for",
    "chunks",
    "wait",
]

#: bytes of request bodies per batch: under both providers' upload limits (200 and 256 MB)
MAX_BATCH_BYTES = 150_000_000
#: requests per batch (OpenAI takes 50,000, Anthropic 100,000)
MAX_BATCH_REQUESTS = 10_000
#: the metadata key a batch is sent with, to find it after a restart (OpenAI's ``metadata``)
TAG_KEY = "context_ceiling_batch"
#: pages of 100 batches read to find one, newest first
FIND_PAGES = 10


@dataclass(frozen=True)
class BatchResult:
    """One request's result: the provider's response body, or why there is none."""

    custom_id: str
    body: dict[str, Any] | None
    error: str | None = None
    http_status: int | None = None


class BatchApi(Protocol):
    """One provider's batch API."""

    name: str

    async def submit(
        self,
        client: httpx.AsyncClient,
        base_url: str,
        headers: dict[str, str],
        path: str,
        requests: list[tuple[str, dict[str, Any]]],
        tag: str,
    ) -> str:
        """Send the requests (custom id, body) as one batch marked with ``tag`` where the API
        keeps a batch's metadata; its id."""
        ...

    async def find(
        self, client: httpx.AsyncClient, base_url: str, headers: dict[str, str], tag: str
    ) -> str | None:
        """The id of the batch sent with ``tag``, if the provider has it (None: it was never
        created, or the API keeps no metadata to find it by)."""
        ...

    async def poll(
        self, client: httpx.AsyncClient, base_url: str, headers: dict[str, str], batch_id: str
    ) -> list[BatchResult] | None:
        """The batch's results once it has ended (None while it runs)."""
        ...


def _check(resp: httpx.Response, what: str) -> dict[str, Any]:
    if resp.status_code >= 400:
        raise UserError(f"batch {what}: HTTP {resp.status_code}: {resp.text[:300]}")
    body: dict[str, Any] = resp.json()
    return body


def _jsonl(text: str) -> list[dict[str, Any]]:
    # split on newlines only: str.splitlines() also splits on U+2028 and U+0085, which JSON
    # writers leave unescaped inside strings (a model's answer can hold them)
    return [json.loads(line) for line in text.split("\n") if line.strip()]


class _OpenAI:
    """``POST /files`` (purpose ``batch``), ``POST /batches``, ``GET /batches/{id}``,
    ``GET /files/{id}/content``; the base URL is the one calls go to (``.../v1``)."""

    name = "openai"
    _ENDED = ("completed", "failed", "expired", "cancelled")

    async def submit(
        self,
        client: httpx.AsyncClient,
        base_url: str,
        headers: dict[str, str],
        path: str,
        requests: list[tuple[str, dict[str, Any]]],
        tag: str,
    ) -> str:
        lines = "".join(
            json.dumps({"custom_id": cid, "method": "POST", "url": path, "body": body}) + "\n"
            for cid, body in requests
        )
        up = await client.post(
            f"{base_url}/files",
            headers=headers,
            data={"purpose": "batch"},
            files={"file": ("sweep.jsonl", lines.encode(), "application/jsonl")},
        )
        file_id = _check(up, "upload")["id"]
        made = await client.post(
            f"{base_url}/batches",
            headers=headers,
            json={
                "input_file_id": file_id,
                "endpoint": path,
                "completion_window": "24h",
                "metadata": {TAG_KEY: tag},
            },
        )
        return str(_check(made, "create")["id"])

    async def find(
        self, client: httpx.AsyncClient, base_url: str, headers: dict[str, str], tag: str
    ) -> str | None:
        after: str | None = None
        for _ in range(FIND_PAGES):
            params = {"limit": "100", **({"after": after} if after else {})}
            page = _check(
                await client.get(f"{base_url}/batches", headers=headers, params=params), "list"
            )
            rows = page.get("data") or []
            for b in rows:
                if (b.get("metadata") or {}).get(TAG_KEY) == tag:
                    return str(b["id"])
            if not page.get("has_more") or not rows:
                return None
            after = str(rows[-1]["id"])
        return None

    async def poll(
        self, client: httpx.AsyncClient, base_url: str, headers: dict[str, str], batch_id: str
    ) -> list[BatchResult] | None:
        state = _check(await client.get(f"{base_url}/batches/{batch_id}", headers=headers), "poll")
        if state.get("status") not in self._ENDED:
            return None
        out: list[BatchResult] = []
        for key in ("output_file_id", "error_file_id"):
            fid = state.get(key)
            if not fid:
                continue
            resp = await client.get(f"{base_url}/files/{fid}/content", headers=headers)
            if resp.status_code >= 400:
                raise UserError(f"batch results: HTTP {resp.status_code}: {resp.text[:300]}")
            for row in _jsonl(resp.text):
                r = row.get("response") or {}
                code = int(r.get("status_code") or 0)
                if code == 200:
                    out.append(BatchResult(row["custom_id"], r.get("body") or {}))
                else:
                    err = row.get("error") or (r.get("body") or {}).get("error") or {}
                    out.append(
                        BatchResult(
                            row["custom_id"],
                            None,
                            f"HTTP {code}: {json.dumps(err)[:300]}",
                            code or None,
                        )
                    )
        return out


class _Anthropic:
    """``POST /v1/messages/batches``, ``GET /v1/messages/batches/{id}`` and its ``results_url``."""

    name = "anthropic"

    async def submit(
        self,
        client: httpx.AsyncClient,
        base_url: str,
        headers: dict[str, str],
        path: str,
        requests: list[tuple[str, dict[str, Any]]],
        tag: str,
    ) -> str:
        del path, tag  # Message Batches keep no metadata
        made = await client.post(
            f"{base_url}/v1/messages/batches",
            headers=headers,
            json={"requests": [{"custom_id": cid, "params": body} for cid, body in requests]},
        )
        return str(_check(made, "create")["id"])

    async def find(
        self, client: httpx.AsyncClient, base_url: str, headers: dict[str, str], tag: str
    ) -> str | None:
        del client, base_url, headers, tag
        return None

    async def poll(
        self, client: httpx.AsyncClient, base_url: str, headers: dict[str, str], batch_id: str
    ) -> list[BatchResult] | None:
        state = _check(
            await client.get(f"{base_url}/v1/messages/batches/{batch_id}", headers=headers), "poll"
        )
        if state.get("processing_status") != "ended":
            return None
        resp = await client.get(str(state["results_url"]), headers=headers)
        if resp.status_code >= 400:
            raise UserError(f"batch results: HTTP {resp.status_code}: {resp.text[:300]}")
        out: list[BatchResult] = []
        for row in _jsonl(resp.text):
            result = row.get("result") or {}
            if result.get("type") == "succeeded":
                out.append(BatchResult(row["custom_id"], result.get("message") or {}))
            else:
                why = result.get("error") or result.get("type") or "no result"
                out.append(BatchResult(row["custom_id"], None, f"batch: {json.dumps(why)[:300]}"))
        return out


OPENAI = _OpenAI()
ANTHROPIC = _Anthropic()


def api_for(api: str) -> BatchApi:
    return ANTHROPIC if api == "anthropic" else OPENAI


@dataclass
class Pending:
    """A batch sent and not yet in the call log: its id, and for each request (by custom id)
    what the call log records of the call besides its result."""

    id: str
    api: str
    calls: dict[str, dict[str, Any]]
    sent_at: float
    tag: str | None = None


@dataclass
class Unconfirmed:
    """A batch about to be sent whose id never reached the ledger (the process ended between
    the provider's answer and the ledger's line): its tag, to find it by, and its calls."""

    tag: str
    api: str
    calls: dict[str, dict[str, Any]]
    at: float


class Ledger:
    """``batches.jsonl``: one line before a batch is sent (its tag and calls), one when it is
    sent (its id), one when its results are logged; a batch whose send was never confirmed is
    looked up by its tag on resume, or its line closed when the provider has no such batch."""

    def __init__(self, path: Path) -> None:
        self.path = path
        drop_torn_tail(path)

    def pending(self) -> list[Pending]:
        """Batches sent whose results are not logged yet."""
        return self._read()[0]

    def unconfirmed(self) -> list[Unconfirmed]:
        """Batches about to be sent whose send was never confirmed (nor closed)."""
        return self._read()[1]

    def _read(self) -> tuple[list[Pending], list[Unconfirmed]]:
        if not self.path.exists():
            return [], []
        sent: dict[str, Pending] = {}
        sending: dict[str, Unconfirmed] = {}
        text = self.path.read_text()
        for row in _jsonl(text[: text.rfind("\n") + 1]):  # a line still being written waits
            if "sending" in row:
                sending[row["sending"]] = Unconfirmed(
                    row["sending"], row["api"], row["calls"], row["at"]
                )
            elif row.get("closed"):
                sending.pop(row["tag"], None)
            elif row.get("done"):
                sent.pop(row["id"], None)
            else:
                tag = row.get("tag")
                sent[row["id"]] = Pending(row["id"], row["api"], row["calls"], row["sent_at"], tag)
                if tag is not None:
                    sending.pop(tag, None)
        return list(sent.values()), list(sending.values())

    def _append(self, row: dict[str, Any]) -> None:
        append_line(self.path, json.dumps(row))

    def sending(self, u: Unconfirmed) -> None:
        self._append({"sending": u.tag, "api": u.api, "calls": u.calls, "at": u.at})

    def sent(self, p: Pending) -> None:
        row = {"id": p.id, "api": p.api, "calls": p.calls, "sent_at": p.sent_at}
        self._append(row | ({"tag": p.tag} if p.tag is not None else {}))

    def closed(self, tag: str) -> None:
        """The batch about to be sent under ``tag`` does not exist: its calls go again."""
        self._append({"tag": tag, "closed": True, "at": time.time()})

    def done(self, batch_id: str) -> None:
        self._append({"id": batch_id, "done": True, "at": time.time()})


def chunks(
    requests: list[tuple[str, dict[str, Any]]],
) -> list[list[tuple[str, dict[str, Any]]]]:
    """Requests split into batches within the providers' limits."""
    out: list[list[tuple[str, dict[str, Any]]]] = [[]]
    size = 0
    for cid, body in requests:
        n = len(json.dumps(body))
        if out[-1] and (size + n > MAX_BATCH_BYTES or len(out[-1]) >= MAX_BATCH_REQUESTS):
            out.append([])
            size = 0
        out[-1].append((cid, body))
        size += n
    return [c for c in out if c]


async def wait(
    api: BatchApi,
    client: httpx.AsyncClient,
    base_url: str,
    headers: dict[str, str],
    batch_id: str,
    every_s: float,
) -> list[BatchResult]:
    """Poll until the batch has ended; its results."""
    while True:
        got = await api.poll(client, base_url, headers, batch_id)
        if got is not None:
            return got
        await asyncio.sleep(every_s)
