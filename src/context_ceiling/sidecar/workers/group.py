"""One worker's view of its siblings when the sidecar runs several (``workers: N``).

The workers share one directory (Prometheus' multiprocess directory; its ``*.db`` files are the
metric values, summed at scrape time by ``MultiProcessCollector``). Next to those this module
keeps three kinds of small JSON file, each written atomically (temp file + rename):

- ``ceilings.json``: the last document pushed through the admin API to any worker. A push is
  validated and applied by the worker that took it, then published here with a new token in
  ``ceilings.token``; every other worker reads the token every ``POLL_S`` and applies the
  document when it changed, so a push reaches all of them
  whether or not the ceilings file is persisted. A worker started later (a replacement for one
  that died) catches up from it.
- ``worker-<pid>.json``: each live worker's running document (its digest and version) and a
  snapshot of what only lives in its memory: count-cache counters and staleness states. The
  worker that took a push answers only when every live worker runs the pushed document (or
  after ``PUSH_WAIT_S``, saying how many do); a scrape, answered by whichever worker the kernel
  picks, reads every snapshot, so the scrape-time families describe the pod, not one worker.

Pushes are serialized across the group: the worker that takes one holds ``ceilings.lock`` (an
``flock``) while it catches up with the last push, validates against it (the version rule is a
compare-and-set on the group's latest document), persists, applies and publishes, so two pushes
racing into two workers are applied one after the other, in version order, and the file on disk
is the document that runs.

Nothing here is on the request path.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import logging
import os
import signal
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from prometheus_client.core import Metric
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from context_ceiling.ceilings.document import (
    CeilingsDocument,
    CeilingsError,
    dump_document,
    parse_document,
    write_atomically,
)
from context_ceiling.core.tokenizers import CountCache
from context_ceiling.sidecar.ceilings.store import CeilingStore
from context_ceiling.sidecar.observability.metrics import count_cache_families

log = logging.getLogger(__name__)

POLL_S = 0.05
SNAPSHOT_S = 1.0
PUSH_WAIT_S = 5.0
SHARED = "ceilings.json"
TOKEN = "ceilings.token"
LOCK = "ceilings.lock"


def digest_of(doc: CeilingsDocument) -> str:
    return hashlib.sha256(dump_document(doc).encode()).hexdigest()[:16]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # pragma: no cover - another user's process: it exists
        return True
    return True


class WorkerGroup:
    """This worker's membership: its file, the shared push, the siblings' snapshots."""

    def __init__(
        self, directory: Path, pid: int | None = None, supervisor: int | None = None
    ) -> None:
        self.dir = directory
        self.pid = pid or os.getpid()
        #: the supervisor's pid, passed down at spawn (read here, it may already be init's)
        self.supervisor = supervisor or os.getppid()
        self.file = directory / f"worker-{self.pid}.json"
        self.store: CeilingStore | None = None
        self.cache: CountCache | None = None
        self._seen: str | None = None  # the token of the last push looked at

    # -- membership ------------------------------------------------------------------------

    def join(self, store: CeilingStore, cache: CountCache | None) -> None:
        """Catch up with the last push, then announce this worker (startup, before serving)."""
        self.store, self.cache = store, cache
        store.listeners.append(lambda _doc: self.write_snapshot())
        self.catch_up()
        self.write_snapshot()

    def leave(self) -> None:
        with contextlib.suppress(OSError):
            self.file.unlink()

    def members(self) -> list[dict[str, Any]]:
        """The snapshots of every live worker (this one's fresh)."""
        out: list[dict[str, Any]] = []
        for path in sorted(self.dir.glob("worker-*.json")):
            try:
                pid = int(path.stem.split("-", 1)[1])
            except ValueError:
                continue
            if pid == self.pid:
                out.append(self.snapshot())
                continue
            if not alive(pid):
                continue
            with contextlib.suppress(OSError, ValueError):
                out.append(json.loads(path.read_bytes()))
        return out

    def snapshot(self) -> dict[str, Any]:
        assert self.store is not None
        doc = self.store.current
        cache = self.cache
        return {
            "pid": self.pid,
            "digest": digest_of(doc),
            "version": doc.version,
            "at": time.time(),
            "cache": [cache.hits, cache.misses, cache.bytes] if cache is not None else None,
            "stale": [
                [model, workload, reason, active]
                for (model, workload), reasons in self.store.staleness.states(doc)
                for reason, active in reasons.items()
            ],
        }

    def write_snapshot(self) -> None:
        with contextlib.suppress(OSError):
            write_atomically(self.file, json.dumps(self.snapshot()))

    # -- pushes ----------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def push_lock(self) -> Any:
        """The group's push lock, held while a push is validated, persisted, applied and
        published (waited for on a thread: the event loop keeps serving). On entry this worker
        has caught up with the last push any worker took."""
        fd = os.open(self.dir / LOCK, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            await asyncio.to_thread(fcntl.flock, fd, fcntl.LOCK_EX)
            try:
                self._seen = None  # re-read the shared push whatever was seen before
                self.catch_up()
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def publish(self, doc: CeilingsDocument, force: bool) -> str:
        """Share a document this worker has just applied; returns its digest."""
        text = json.dumps({"force": force, "from": self.pid, "document": dump_document(doc)})
        write_atomically(self.dir / SHARED, text)
        # the token says "new push" (two pushes within one clock tick share an mtime)
        self._seen = f"{self.pid}-{time.time_ns()}-{os.urandom(4).hex()}"
        write_atomically(self.dir / TOKEN, self._seen)
        self.write_snapshot()
        return digest_of(doc)

    async def wait_applied(self, digest: str) -> tuple[int, int]:
        """(workers running ``digest``, live workers), once all do or after ``PUSH_WAIT_S``."""
        deadline = time.monotonic() + PUSH_WAIT_S
        while True:
            members = self.members()
            done = sum(1 for m in members if m.get("digest") == digest)
            if done == len(members) or time.monotonic() >= deadline:
                return done, len(members)
            await asyncio.sleep(POLL_S / 2)

    def catch_up(self) -> bool:
        """Apply the shared document if it changed since this worker last looked."""
        path = self.dir / SHARED
        try:
            token = (self.dir / TOKEN).read_text()
        except FileNotFoundError:
            return False
        if token == self._seen:
            return False
        self._seen = token
        assert self.store is not None
        try:
            shared = json.loads(path.read_bytes())
            doc = parse_document(shared["document"].encode(), str(path))
        except (OSError, ValueError, KeyError, CeilingsError) as exc:
            log.warning("shared ceilings unreadable", extra={"fields": {"error": str(exc)}})
            return False
        current = self.store.current
        if doc == current:
            return False
        if not shared.get("force") and not doc.is_newer_than(current):
            return False  # a newer document is running here: the push stays unconfirmed
        try:
            self.store.apply(doc, "worker", force=True, persist=False)
        except CeilingsError:
            return False
        return True

    async def follow(self) -> None:
        """Apply pushes taken by other workers; refresh this worker's snapshot. A worker whose
        supervisor is gone (killed: no SIGTERM was passed on) shuts down gracefully rather than
        serve on as an orphan."""
        last = 0.0
        while True:
            await asyncio.sleep(POLL_S)
            if os.getppid() != self.supervisor:
                log.warning("supervisor gone; shutting down", extra={"fields": {"pid": self.pid}})
                os.kill(self.pid, signal.SIGTERM)
                return
            self.catch_up()
            if time.monotonic() - last >= SNAPSHOT_S:
                self.write_snapshot()
                last = time.monotonic()


class GroupCollector(Collector):
    """The scrape-time families that live in each worker's memory, for the whole pod: the count
    cache summed, a staleness reason active when any worker sees it, and the process families
    (CPU, memory, open fds) summed over the workers and the supervisor."""

    def __init__(self, group: WorkerGroup) -> None:
        self.group = group

    def collect(self) -> Iterator[Metric]:
        members = self.group.members()
        caches = [m["cache"] for m in members if m.get("cache")]
        if caches:
            yield from count_cache_families(
                sum(c[0] for c in caches), sum(c[1] for c in caches), sum(c[2] for c in caches)
            )
        yield from _process_families([os.getppid(), *(int(m["pid"]) for m in members)])

    def stale_states(self) -> Iterable[tuple[tuple[str, str], dict[str, bool]]]:
        merged: dict[tuple[str, str], dict[str, bool]] = {}
        for m in self.group.members():
            for model, workload, reason, active in m.get("stale", []):
                slot = merged.setdefault((model, workload), {})
                slot[reason] = slot.get(reason, False) or bool(active)
        return merged.items()


#: how each process family combines over processes (anything else is summed)
_COMBINE = {"process_start_time_seconds": min, "process_max_fds": min}


def _process_families(pids: Iterable[int]) -> Iterator[Metric]:
    values: dict[str, float] = {}
    families: dict[str, Metric] = {}
    for pid in pids:
        collector = ProcessCollector(pid=lambda pid=pid: pid, registry=None)  # type: ignore[misc]
        for fam in collector.collect():
            families.setdefault(fam.name, fam)
            for sample in fam.samples:
                combine = _COMBINE.get(sample.name)
                old = values.get(sample.name)
                values[sample.name] = (
                    sample.value
                    if old is None
                    else combine(old, sample.value)
                    if combine
                    else old + sample.value
                )
    for name, fam in families.items():
        out = Metric(name, fam.documentation, fam.type)
        for sample in fam.samples:
            out.add_sample(sample.name, {}, values[sample.name])
        yield out
