"""Servers on loopback for tests and benchmarks: a free port, an ASGI app on uvicorn in a thread,
and ``ceiling serve`` as a child process."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import uvicorn
import yaml

__all__ = [
    "ServeProcess",
    "ceiling_serve",
    "clean_env",
    "free_port",
    "serve",
    "start_serve",
    "upstreams_at",
    "wait_healthy",
]


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the OS's pick)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextmanager
def serve(app: Any, **kwargs: Any) -> Iterator[str]:
    """Run an ASGI app with uvicorn on a free loopback port in a thread; yields its base URL."""
    config = uvicorn.Config(
        app, host="127.0.0.1", port=0, log_level="warning", lifespan="on", **kwargs
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("loopback server did not start")
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def wait_healthy(url: str, proc: subprocess.Popen[str], timeout: float = 30.0) -> None:
    """Until ``url``/healthz answers 200; fails with the process's output if it exits first."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(url + "/healthz").status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.1)


@dataclass
class ServeProcess:
    """A ``ceiling serve`` child process: its base URL, the process, its config file and the
    files its stdout (one JSON line per event) and its stderr go to."""

    url: str
    proc: subprocess.Popen[bytes]
    config: Path
    log: Path
    err: Path

    def output(self) -> str:
        """What the process wrote to stdout so far."""
        return self.log.read_text(errors="replace")

    def errors(self) -> str:
        """What the process wrote to stderr so far."""
        return self.err.read_text(errors="replace")

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM, then the exit status (killed after ``timeout``)."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def upstreams_at(url: str) -> dict[str, Any]:
    """The ``upstreams`` setting that sends every API to one loopback double at ``url`` (the
    OpenAI SDKs' base URL ends in ``/v1``; Anthropic's and Gemini's do not)."""
    return {
        "openai": {"base_url": url + "/v1"},
        "anthropic": {"base_url": url},
        "gemini": {"base_url": url},
    }


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without ``CEILING_*`` and ``OTEL_*`` variables (a test states
    the settings it means), plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CEILING_", "OTEL_"))}
    return env | extra


def start_serve(
    config: Mapping[str, Any],
    workdir: Path,
    *,
    name: str = "sidecar",
    env: Mapping[str, str] | None = None,
    wait: bool = True,
    timeout: float = 30.0,
    new_session: bool = False,
) -> ServeProcess:
    """``ceiling serve`` as a deployment runs it, on loopback: ``config`` written to
    ``workdir/NAME.yaml`` (on a free port unless it sets ``listen.port``), stdout to
    ``workdir/NAME.log`` and stderr to ``workdir/NAME.err``, the environment :func:`clean_env`
    plus ``env`` (``new_session``: its own process group, for a benchmark that stops the whole
    tree); returned once ``/healthz`` answers (``wait``). The caller stops it
    (:func:`ceiling_serve` does)."""
    cfg = dict(config)
    listen = dict(cfg.get("listen") or {})
    listen.setdefault("host", "127.0.0.1")
    listen.setdefault("port", free_port())
    cfg["listen"] = listen
    path = workdir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    log, err = workdir / f"{name}.log", workdir / f"{name}.err"
    with log.open("wb") as out, err.open("wb") as errors:
        proc = subprocess.Popen(
            [sys.executable, "-m", "context_ceiling.cli", "serve", "--config", str(path)],
            stdout=out,
            stderr=errors,
            env=clean_env(**(env or {})),
            start_new_session=new_session,
        )
    running = ServeProcess(f"http://127.0.0.1:{listen['port']}", proc, path, log, err)
    if wait:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if httpx.get(running.url + "/healthz").status_code == 200:
                    return running
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
                raise AssertionError(
                    f"ceiling serve did not come up:\n{running.output()}{running.errors()}"
                )
            time.sleep(0.1)
    return running


@contextmanager
def ceiling_serve(
    config: Mapping[str, Any],
    workdir: Path,
    *,
    name: str = "sidecar",
    env: Mapping[str, str] | None = None,
    wait: bool = True,
    timeout: float = 30.0,
) -> Iterator[ServeProcess]:
    """:func:`start_serve` for the length of a ``with`` block: killed on the way out if it
    still runs."""
    running = start_serve(config, workdir, name=name, env=env, wait=wait, timeout=timeout)
    try:
        yield running
    finally:
        if running.proc.poll() is None:
            running.proc.kill()
            running.proc.wait()
