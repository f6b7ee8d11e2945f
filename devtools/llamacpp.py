"""Run llama.cpp's ``llama-server`` on loopback as a real, local, OpenAI-compatible upstream.

Used by ``make demo`` and the real-model tests. The server runs in its own process group and is
stopped (TERM, then KILL) when the context exits or the interpreter exits, and the kernel sends
it SIGTERM when its parent process dies in any way (``PR_SET_PDEATHSIG``), so it is never left
orphaned. The window is read from the server, never assumed.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from testkit.serving import free_port

ROOT = Path(__file__).resolve().parent.parent
FETCH_SCRIPT = ROOT / "scripts" / "local_model.sh"


class LocalModelError(RuntimeError):
    pass


@dataclass(frozen=True)
class LocalModel:
    server: Path
    model: Path


def ensure_local_model() -> LocalModel:
    """Build/fetch (first time) or reuse the cached llama-server and GGUF model."""
    env = os.environ.copy()
    if os.environ.get("CEILING_LLAMA_SERVER") and os.environ.get("CEILING_LLAMA_MODEL"):
        return LocalModel(
            Path(os.environ["CEILING_LLAMA_SERVER"]), Path(os.environ["CEILING_LLAMA_MODEL"])
        )
    proc = subprocess.run(["bash", str(FETCH_SCRIPT)], env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise LocalModelError(
            f"{FETCH_SCRIPT.name} failed: {proc.stderr.strip().splitlines()[-1:]}"
        )
    found = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
    return LocalModel(Path(found["SERVER"]), Path(found["MODEL"]))


@dataclass
class RunningServer:
    url: str
    window: int
    process: subprocess.Popen[bytes]

    @property
    def openai_base_url(self) -> str:
        return self.url + "/v1"


def die_with_parent() -> None:
    """In the child: ask Linux to SIGTERM it when its parent dies, however the parent dies
    (SIGKILL included), so a crashed demo or test never leaves a server behind."""
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGTERM)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def fair_threads() -> int:
    """The server's threads: every core, or its share of them where the test suite runs other
    workers beside it (pytest-xdist's ``PYTEST_XDIST_WORKER_COUNT``). llama.cpp's threads meet at a
    barrier after every operation of every layer: with a core taken by other work, each barrier
    waits for a descheduled sibling, and a cached question took many times as long on two
    threads as on one (``-t 1`` does not slow down beside a busy core; ``--poll 0`` does not
    help)."""
    cores = os.cpu_count() or 2
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1)
    return max(1, cores // max(1, workers))


@contextlib.contextmanager
def llama_server(
    ctx_size: int,
    *,
    local: LocalModel | None = None,
    threads: int | None = None,
    cache_prompt: bool = True,
    log_path: Path | None = None,
    alias: str = "qwen2.5-coder-0.5b-instruct",
    priority: int = 0,
) -> Iterator[RunningServer]:
    """Start llama-server with ``ctx_size`` tokens of context on a free loopback port.
    ``threads``: its compute threads (default :func:`fair_threads`); ``priority``: a niceness
    to run it at (negative: ahead of other work on the machine, where this process may raise
    it; else as it is)."""
    local = local or ensure_local_model()
    port = free_port()
    args = [
        str(local.server),
        "-m",
        str(local.model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--ctx-size",
        str(ctx_size),
        "-np",
        "1",
        "-t",
        str(threads or fair_threads()),
        "--no-webui",
        "--alias",
        alias,
    ]
    if not cache_prompt:
        args += ["--cache-ram", "0", "--no-cache-prompt"]
    log = open(log_path, "wb") if log_path else subprocess.DEVNULL  # noqa: SIM115
    proc = subprocess.Popen(
        args,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=die_with_parent,
    )
    atexit.register(_stop, proc)
    if priority:
        with contextlib.suppress(PermissionError):
            os.setpriority(os.PRIO_PROCESS, proc.pid, priority)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        with httpx.Client(timeout=2.0, trust_env=False) as c:
            while True:
                if proc.poll() is not None:
                    raise LocalModelError(
                        f"llama-server exited with {proc.returncode} during start"
                    )
                try:
                    if c.get(url + "/health").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    raise LocalModelError("llama-server did not become healthy in 120 s")
                time.sleep(0.2)
            props = c.get(url + "/props").json()
        window = int(props["default_generation_settings"]["n_ctx"])
        yield RunningServer(url, window, proc)
    finally:
        _stop(proc)
        atexit.unregister(_stop)
        if log_path:
            log.close()  # type: ignore[union-attr]
