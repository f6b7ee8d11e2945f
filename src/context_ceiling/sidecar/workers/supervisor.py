"""``ceiling serve`` with ``workers`` > 1: several worker processes behind one port.

One process is about one core however many the pod has: its event loop, parsing, recording
and the Python parts of counting hold the GIL (tiktoken and riptoken release it only while they
encode; gigatoken never does). With ``workers: N`` the command is a supervisor: uvicorn's own (the socket bound once
and shared, the kernel spreading connections over the workers, a dead or hung worker replaced,
SIGTERM drained in every worker), with two changes: SIGHUP reloads the ceilings in every worker
instead of restarting them, and a dead worker's live gauges are dropped from the shared metrics.
Each worker is the whole sidecar; what they share is one directory (``sidecar/workers/group.py``).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from uvicorn import Config, Server
from uvicorn.supervisors import multiprocess
from uvicorn.supervisors.multiprocess import Multiprocess, Process

from context_ceiling.sidecar.config import Settings
from context_ceiling.sidecar.server import HeaderDeadline, SidecarServer, uvicorn_options

#: prometheus_client reads it when it is imported: set before the workers start
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


def worker_app(settings: Settings, directory: Path, supervisor: int) -> Any:
    """The app of one worker (called in the worker process, by uvicorn's factory support)."""
    from context_ceiling.sidecar.app import create_app
    from context_ceiling.sidecar.observability.logs import configure
    from context_ceiling.sidecar.workers.group import WorkerGroup

    configure(settings.log_level)
    # uvicorn configured its loggers before this ran (one process: after); no access log either way
    logging.getLogger("uvicorn.access").propagate = False
    # the protocol class travels to the worker by name (pickled), its limits set here
    HeaderDeadline.header_timeout = settings.limits.header_read_timeout
    HeaderDeadline.max_head_bytes = settings.limits.max_header_bytes
    return create_app(
        settings, group=WorkerGroup(directory, supervisor=supervisor), freeze_heap=True
    )


def shared_dir() -> tuple[Path, bool]:
    """The workers' shared directory, emptied: ``PROMETHEUS_MULTIPROC_DIR`` when set (kept),
    else a fresh temporary one (removed at exit). Returns (path, created)."""
    given = os.environ.get(MULTIPROC_ENV)
    if given:
        path = Path(given)
        path.mkdir(parents=True, exist_ok=True)
        for old in [*path.glob("*.db"), *path.glob("worker-*.json"), *path.glob("ceilings.*")]:
            old.unlink(missing_ok=True)  # a previous run's values would be summed in
        return path, False
    return Path(tempfile.mkdtemp(prefix="context-ceiling-workers-")), True


class Worker(Process):
    """uvicorn's worker process, serving with :class:`SidecarServer` (a shutdown that takes
    the connections queued on the shared listener instead of resetting them)."""

    @property
    def server(self) -> Server:
        if self._server is None:
            self._server = SidecarServer(config=self.config)
        return self._server


class Supervisor(Multiprocess):
    """uvicorn's supervisor, with the sidecar's SIGHUP and metric cleanup, and workers that
    are :class:`Worker`."""

    def run(self) -> None:
        # uvicorn's supervisor builds every worker (at start, on SIGHUP, SIGTTIN and when one
        # dies) from its module's ``Process``; this process exists only to supervise, so the
        # name points at ours while it runs
        with _replaced(multiprocess, "Process", Worker):
            super().run()

    def __init__(self, config: Config, sockets: list[Any], directory: Path) -> None:
        super().__init__(config, sockets)
        self.directory = directory

    def handle_hup(self) -> None:
        """Reload the ceilings in every worker (uvicorn would restart them all)."""
        for process in self.processes:
            if process.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGHUP)

    def terminate_all(self) -> None:
        """Stop listening first, then drain every worker.

        The listening sockets are shared: while this process still holds its copies, the kernel
        keeps completing handshakes that no draining worker will accept, and those clients hang
        until the supervisor exits and are then reset. With this process's copies closed, the
        last worker to start draining closes the socket: from then on a connection is refused
        (the client retries elsewhere), as with one process, and every connection a worker
        accepted is answered."""
        for sock in self.sockets:
            sock.close()
        super().terminate_all()

    def keep_subprocess_alive(self) -> None:
        before = {p.pid for p in self.processes}
        super().keep_subprocess_alive()
        for pid in before - {p.pid for p in self.processes}:
            if pid is not None:
                self.forget(pid)

    def forget(self, pid: int) -> None:
        """A worker is gone: its live gauges leave the sum, its snapshot the group."""
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid, str(self.directory))  # type: ignore[no-untyped-call]
        (self.directory / f"worker-{pid}.json").unlink(missing_ok=True)


@contextlib.contextmanager
def _replaced(module: Any, name: str, value: Any) -> Iterator[None]:
    before = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, before)


def serve_workers(settings: Settings, loop: str) -> int:
    """Run ``settings.workers`` workers under the supervisor until SIGTERM/SIGINT."""
    directory, created = shared_dir()
    os.environ[MULTIPROC_ENV] = str(directory)
    options = uvicorn_options(settings)
    options["http"] = HeaderDeadline
    config = Config(
        functools.partial(worker_app, settings, directory, os.getpid()),
        factory=True,
        host=settings.listen.host,
        port=settings.listen.port,
        workers=settings.workers,
        loop=loop,
        log_level=settings.log_level,
        **options,
    )
    from context_ceiling.sidecar.server import sockets_for

    sockets = sockets_for(config, settings.listen.admin_port)
    try:
        Supervisor(config, sockets, directory).run()
    finally:
        for sock in sockets:
            sock.close()
        if created:
            shutil.rmtree(directory, ignore_errors=True)
    return 0
