"""The running ceilings: validated, swapped atomically, persisted, reloaded without restarts.

Sources: the ceilings file (watched, including Kubernetes' ConfigMap symlink swap), SIGHUP, and
``PUT /admin/ceilings``. Every change goes validate -> persist (temp file + rename, when the
file is the source of truth and persisting is on) -> swap. The swap is a single reference
assignment on the event loop, so a request that started with the old document finishes with it,
and a document that fails any step leaves the running one untouched.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import logging
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Literal

import anyio

from context_ceiling.ceilings.document import (
    EMPTY,
    CeilingsDocument,
    CeilingsError,
    CeilingsPersistError,
    dump_document,
    fit_problems,
    parse_document,
    unused_entries,
    write_atomically,
)
from context_ceiling.core.models import Registry
from context_ceiling.sidecar.observability.metrics import Metrics
from context_ceiling.sidecar.observability.staleness import StalenessTracker

log = logging.getLogger(__name__)

#: how long the ceilings file must stay the same before a change is applied, and how often that
#: is tried before giving up until its next change
SETTLE_S = 0.25
SETTLE_TRIES = 40
#: how long a file rewritten in place (the same inode as the last one read) must stay the same:
#: a writer that pauses mid-write leaves a truncated file that can parse as a smaller valid
#: document; a file moved into place (a rename, Kubernetes' ConfigMap swap) is whole at once
IN_PLACE_S = 6.0
#: the largest ceilings document read, parsed off the event loop (a document is a few KB per
#: hundred entries; YAML parses at about a second per MB)
MAX_DOCUMENT_BYTES = 4 * 2**20
#: worker: a push taken by another worker of this pod (``workers`` > 1), see sidecar/workers/group.py
Source = Literal["startup", "file", "sighup", "api", "worker"]


class CeilingStore:
    def __init__(
        self,
        registry: Registry,
        metrics: Metrics,
        staleness: StalenessTracker,
        path: Path | None = None,
        persist: bool = True,
    ) -> None:
        self.registry = registry
        self.path = path
        self.persist = persist
        self.staleness = staleness
        self.current: CeilingsDocument = EMPTY
        self._digest: bytes | None = None
        self.reloads = metrics.config_reloads
        self.last_success = metrics.config_last_success
        self.version = metrics.config_version
        #: called with every document applied (the worker group's snapshot)
        self.listeners: list[Callable[[CeilingsDocument], None]] = []
        #: the inode of the file as last read: the same one again means a rewrite in place
        self._inode: int | None = None
        self.in_place_s = IN_PLACE_S
        self.max_bytes = MAX_DOCUMENT_BYTES
        #: why each entry of the running document enforces nothing here (reported, counted)
        self.unused: list[str] = []
        self._unused_gauge = metrics.ceilings_unused
        self.workloads: list[str] = ["default"]
        metrics.watch_ceilings(self)

    # -- validation and apply --------------------------------------------------------------

    def problems(self, doc: CeilingsDocument, force: bool = False) -> list[str]:
        """Why ``doc`` cannot replace the running document (empty: it can)."""
        reasons: list[str] = []
        if not force and not doc.is_newer_than(self.current):
            reasons.append(
                f"version {doc.version} is not newer than the running version {self.current.version} "
                "(increase it, or force)"
            )
        windows = {s.metric_label: s.window for s in self.registry.specs}
        return reasons + fit_problems(doc, windows)

    def unused_in(self, doc: CeilingsDocument) -> list[str]:
        """Why each entry of ``doc`` would enforce nothing on this sidecar."""
        labels = {s.metric_label for s in self.registry.specs}
        return unused_entries(doc, labels, self.workloads)

    def dry_run(self, doc: CeilingsDocument, force: bool = False) -> list[str]:
        """Everything :meth:`apply` would refuse, the file it would write included; changes
        nothing and counts no reload."""
        reasons = self.problems(doc, force)
        if self.persist and self.path is not None:
            folder = self.path.parent
            target = self.path if self.path.exists() else folder
            if not os.access(target, os.W_OK):
                reasons.append(f"cannot persist to {self.path}: not writable")
        return reasons

    def apply(
        self,
        doc: CeilingsDocument,
        source: Source,
        *,
        force: bool = False,
        persist: bool = True,
        unused: list[str] | None = None,
    ) -> None:
        """Validate, persist, swap; raises :class:`CeilingsError` and changes nothing on failure."""
        reasons = self.problems(doc, force)
        if reasons:
            self.reloads.labels(source=source, result="failure").inc()
            log.warning(
                "ceilings rejected", extra={"fields": {"source": source, "reasons": reasons}}
            )
            raise CeilingsError(source, reasons)
        if persist and self.persist and self.path is not None:
            text = dump_document(doc)
            try:
                write_atomically(self.path, text)
            except OSError as exc:
                self.reloads.labels(source=source, result="failure").inc()
                raise CeilingsPersistError(
                    source, [f"cannot persist to {self.path}: {exc.strerror or exc}"]
                ) from exc
            self._digest = hashlib.sha256(text.encode()).digest()
        old = self.current
        unused = self.unused_in(doc) if unused is None else unused
        self.current = doc  # the swap: one reference, read once per request
        self.unused = unused
        self._unused_gauge.set(len(unused))
        if unused:
            log.warning(
                "ceilings entries enforce nothing",
                extra={"fields": {"source": source, "count": len(unused), "unused": unused[:20]}},
            )
        self.reloads.labels(source=source, result="success").inc()
        self.last_success.set(time.time())
        self.version.set(doc.version)
        for listener in self.listeners:
            listener(doc)
        log.info(
            "ceilings applied",
            extra={
                "fields": {
                    "source": source,
                    "version": doc.version,
                    "previous_version": old.version,
                    "entries": len(doc.entries),
                }
            },
        )

    def _read(self, source: Source) -> bytes | str:
        """The file's bytes, or ``missing`` / ``failure`` (unreadable, or over
        ``MAX_DOCUMENT_BYTES``)."""
        assert self.path is not None
        try:
            with self.path.open("rb") as f:
                self._inode = os.fstat(f.fileno()).st_ino
                data = f.read(self.max_bytes + 1)
        except FileNotFoundError:
            return "missing"
        except OSError as exc:
            self.reloads.labels(source=source, result="failure").inc()
            log.warning(
                "ceilings file unreadable",
                extra={"fields": {"path": str(self.path), "error": str(exc)}},
            )
            return "failure"
        if len(data) > self.max_bytes:
            self.reloads.labels(source=source, result="failure").inc()
            log.warning(
                "ceilings file too large; not read",
                extra={"fields": {"path": str(self.path), "max_bytes": self.max_bytes}},
            )
            return "failure"
        return data

    async def settled(self, source: Source) -> bytes | str:
        """The file once it has stopped changing: read until reads ``SETTLE_S`` apart agree
        (``IN_PLACE_S`` long when the file was rewritten in place) or ``SETTLE_TRIES`` more
        reads than that. A file written in place passes through partial states (truncated,
        half written); one of those can parse as a smaller valid document, which must never
        run."""
        assert self.path is not None
        known = self._inode
        data = self._read(source)
        hold = self.in_place_s if known is not None and self._inode == known else SETTLE_S
        steady = 0.0
        for _ in range(SETTLE_TRIES + int(hold / SETTLE_S)):
            await anyio.sleep(SETTLE_S)
            again = self._read(source)
            if again != data:
                data, steady = again, 0.0
                continue
            steady += SETTLE_S
            if steady >= hold:
                return data
        return "unsettled"

    def _file_rejected(self, source: Source, reasons: list[str]) -> None:
        """A file that cannot run: counted as a failed reload and logged with its reasons."""
        self.reloads.labels(source=source, result="failure").inc()
        log.warning(
            "ceilings file rejected", extra={"fields": {"path": str(self.path), "reasons": reasons}}
        )

    async def reload_off_loop(self, source: Source, data: bytes) -> str:
        """:meth:`reload_file` with the parse (and the report of unused entries) on a worker
        thread, so serving goes on while a large document is read; the swap itself happens back
        on the event loop."""

        def parse() -> tuple[CeilingsDocument | CeilingsError, list[str] | None]:
            got = _parse_or_error(data, str(self.path))
            return got, (self.unused_in(got) if isinstance(got, CeilingsDocument) else None)

        parsed, unused = await anyio.to_thread.run_sync(parse)
        return self.reload_file(source, data, parsed, unused)

    def reload_file(
        self,
        source: Source,
        data: bytes | None = None,
        parsed: CeilingsDocument | CeilingsError | None = None,
        unused: list[str] | None = None,
    ) -> str:
        """Re-read the file (or take ``data``, read from it, and ``parsed``, its parse); returns
        ``success``, ``unchanged``, ``missing`` or ``failure``."""
        if self.path is None:
            return "missing"
        if data is None:
            read = self._read(source)
            if isinstance(read, str):
                return read
            data = read
        digest = hashlib.sha256(data).digest()
        if digest == self._digest and source != "sighup":  # SIGHUP always re-reads
            return "unchanged"
        changed = digest != self._digest
        self._digest = digest  # success or not, the same bytes are not retried on every event
        try:
            if parsed is None:
                parsed = _parse_or_error(data, str(self.path))
            if isinstance(parsed, CeilingsError):
                raise parsed
            doc = parsed
        except CeilingsError as exc:
            self._file_rejected(source, exc.reasons)
            if source == "startup":
                raise
            return "failure"
        if self.current is not EMPTY and doc == self.current:
            self.reloads.labels(source=source, result="unchanged").inc()
            return "unchanged"
        if self.current is not EMPTY and doc.version < self.current.version and changed:
            # the file was rewritten with an older document: a failed reload, never a rollback
            self._file_rejected(
                source,
                [f"version {doc.version} is older than the running version {self.current.version}"],
            )
            return "failure"
        if self.current is not EMPTY and doc.version < self.current.version:
            # a push through the admin API with persisting off: the file is simply behind the
            # running document, which is not a failed reload (the alert would fire on a healthy
            # sidecar)
            self.reloads.labels(source=source, result="unchanged").inc()
            log.info(
                "ceilings file is older than the running document; keeping the running one",
                extra={
                    "fields": {"file_version": doc.version, "running_version": self.current.version}
                },
            )
            return "unchanged"
        try:
            self.apply(doc, source, persist=False, unused=unused)
        except CeilingsError:
            if source == "startup":
                raise
            return "failure"
        return "success"

    async def watch(self, poll_interval: float = 1.0) -> None:
        """Follow the file: any change in its directory (writes, renames, the ConfigMap ``..data``
        symlink swap) triggers a re-read; content hashing makes spurious events free."""
        if self.path is None:
            return
        from watchfiles import awatch

        directory = self.path.parent
        while True:
            if not directory.exists():
                await anyio.sleep(poll_interval)
                continue
            with contextlib.suppress(FileNotFoundError, RuntimeError):
                async for _ in awatch(
                    directory,
                    debounce=100,
                    step=50,
                    rust_timeout=int(poll_interval * 1000),
                    yield_on_timeout=True,
                    recursive=False,
                    force_polling=None,
                ):
                    data = await self.settled("file")
                    if isinstance(data, bytes):
                        await self.reload_off_loop("file", data)
                    elif data == "unsettled":
                        log.warning(
                            "ceilings file keeps changing; not applied until it settles "
                            "(write it by rename)",
                            extra={"fields": {"path": str(self.path)}},
                        )
            await anyio.sleep(poll_interval)


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """The cyclic garbage collector paused while a document is parsed on a thread: parsing
    allocates about a million short-lived objects, which set off full collections of the whole
    heap, each holding the interpreter (and so the serving event loop) for hundreds of
    milliseconds. Nothing the parse allocates forms a cycle: reference counting frees it."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def parse_off_loop(data: bytes | str, where: str) -> CeilingsDocument:
    """:func:`parse_document` for a worker thread beside the event loop (the collector paused
    meanwhile); raises :class:`CeilingsError`."""
    with _collector_paused():
        return parse_document(data, where)


def _parse_or_error(data: bytes, where: str) -> CeilingsDocument | CeilingsError:
    try:
        return parse_off_loop(data, where)
    except CeilingsError as exc:
        return exc
