"""The things measured side by side, each a real server process on loopback.

``direct`` is the upstream test double itself; ``bare`` a pass-through that forwards bytes
(``bare-aiohttp`` the same through the sidecar's upstream transport);
``litellm`` LiteLLM's proxy (from its own venv, ``scripts/litellm.sh``); ``sidecar`` the sidecar in
observe mode counting every request from scratch (count cache off); ``cached`` the same with the
count cache on, which the repeated benchmark body always hits (what repeated content costs);
``enforce`` the sidecar enforcing a ceiling that makes it trim every request (cache off);
``tiktoken`` and ``gigatoken`` the ``sidecar`` target encoding with tiktoken or gigatoken instead
of riptoken (``counting.bpe``; riptoken is what the image counts with).
Every process is started in its own session and killed as a group, and its CPU time and resident
memory are read from the whole process tree (LiteLLM forks), so the figures are the proxy's alone.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import yaml

from testkit.serving import free_port, start_serve

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "context-ceiling"
LITELLM = CACHE / "litellm" / "bin" / "litellm"
SIZES = (1000, 8000, 64000)


def sizes_arg(text: str) -> list[int]:
    """An argparse type for ``--sizes``: body sizes of the benchmark's (:data:`SIZES`),
    comma-separated; anything else is argparse's usage error (exit 2)."""
    try:
        sizes = [int(s) for s in text.split(",")]
    except ValueError:
        sizes = []
    if not sizes or any(s not in SIZES for s in sizes):
        raise argparse.ArgumentTypeError(f"each of {', '.join(str(s) for s in SIZES)}")
    return sizes


def model_name(size: int) -> str:
    return f"bench-{size}"


@dataclass
class Target:
    name: str
    url: str  # the chat completions URL
    proc: subprocess.Popen[bytes]
    peak_rss: int = 0
    _sampler: threading.Thread | None = field(default=None, repr=False)
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    _tree: list[psutil.Process] = field(default_factory=list, repr=False)
    _tree_at: float = field(default=-1e9, repr=False)

    def tree(self, max_age: float = 1.0) -> list[psutil.Process]:
        """The process and its descendants, looked up at most every ``max_age`` seconds: one
        lookup scans /proc, and a sampler of ten targets at 20 Hz would take a third of a core
        from the machine under measurement (making a second thread in the sidecar wait for a
        core)."""
        now = time.monotonic()
        if now - self._tree_at > max_age:
            try:
                p = psutil.Process(self.proc.pid)
                self._tree = [p, *p.children(recursive=True)]
            except psutil.NoSuchProcess:
                self._tree = []
            self._tree_at = now
        return self._tree

    def cpu_seconds(self) -> float:
        total = 0.0
        for p in self.tree():
            with contextlib.suppress(psutil.NoSuchProcess):
                t = p.cpu_times()
                total += t.user + t.system
        return total

    def rss(self) -> int:
        total = 0
        for p in self.tree():
            with contextlib.suppress(psutil.NoSuchProcess):
                total += p.memory_info().rss
        return total

    def start_sampling(self, interval: float = 0.05) -> None:
        def loop() -> None:
            while not self._stop.wait(interval):
                self.peak_rss = max(self.peak_rss, self.rss())

        self._sampler = threading.Thread(target=loop, daemon=True)
        self._sampler.start()

    def stop(self) -> None:
        self._stop.set()
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=15)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(self.proc.pid, signal.SIGKILL)


def _spawn(args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        args,
        cwd=ROOT,
        env=os.environ | {"PYTHONPATH": str(ROOT)} | (env or {}),
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _wait(url: str, proc: subprocess.Popen[bytes], name: str, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{name} exited with {proc.returncode} before it was ready")
        try:
            httpx.get(url, timeout=2)
            return
        except httpx.TransportError:
            time.sleep(0.2)
    raise SystemExit(f"{name} did not come up at {url}")


def upstream(workdir: Path, pace: float = 0.0, chunks: int = 20, think: float = 0.0) -> Target:
    """The upstream double; ``think``: seconds before it answers (a model's time to first
    token), ``pace``: seconds between a stream's events."""
    port = free_port()
    proc = _spawn(
        [sys.executable, "-m", "benchmarks.upstream_double", str(port)],
        {"DOUBLE_PACE": str(pace), "DOUBLE_CHUNKS": str(chunks), "DOUBLE_THINK": str(think)},
    )
    base = f"http://127.0.0.1:{port}"
    _wait(base + "/", proc, "upstream double")
    return Target("direct", base + "/v1/chat/completions", proc)


def bare(up: str, aiohttp: bool = False) -> Target:
    """The bare pass-through on httpx's default transport (``bare``, the reference
    pass-through) or on the sidecar's own (``bare-aiohttp``)."""
    port = free_port()
    args = [sys.executable, "-m", "benchmarks.passthrough", str(port), up]
    proc = _spawn([*args, "aiohttp"] if aiohttp else args)
    name = "bare-aiohttp" if aiohttp else "bare"
    _wait(f"http://127.0.0.1:{port}/", proc, name)
    return Target(name, f"http://127.0.0.1:{port}/v1/chat/completions", proc)


def sidecar(
    up: str,
    workdir: Path,
    name: str = "sidecar",
    enforce: bool = False,
    cache: bool = False,
    bounded: bool = False,
    workers: int = 1,
    overlap: bool = True,
    bpe: str = "riptoken",
    answers: bool = True,
    sample_every: int = 16,
    batch_size: int = 32,
    answers_share: float = 0.02,
    credit_burst: float = 1.0,
) -> Target:
    """The sidecar, called ``name`` in the tables (its config and ceilings files too); ``cache``
    off by default so every request is counted from scratch (the benchmark repeats one body,
    which the count cache would otherwise answer); ``bounded``:
    ``counting.strategy: bounded`` (a request a bound proves within budget is not counted);
    ``workers``: worker processes behind the one port (exact counting); ``overlap`` off: every
    request counted before it is forwarded (``counting.overlap_bytes: 0``);
    ``bpe``: riptoken, as the image counts (the ``fast`` extra; ``auto`` would take gigatoken
    where the benchmark's install has it); ``tiktoken`` is the sidecar as deployed but encoding
    with tiktoken, ``gigatoken`` with gigatoken (the opt-in extra); ``answers`` off: no answer
    signals (``answers.enabled: false``), the baseline of what reading every answer costs;
    ``sample_every``: of the requests a bound let through, every n-th is counted anyway while
    2% of a core allows (16 in the figures' ``bounded``; 1, the product's default, in
    ``default``); ``batch_size``: finished requests recorded together under load at most
    (``recording.batch_size``; 1 in ``unbatched``: each one as it finishes); ``answers_share``:
    the answer checker's share of a core (``answers.cpu_share``; a thousandth in
    ``answers-tiny``: signals on, next to nothing read, no stream's reads kept);
    ``credit_burst``: the seconds of those two shares spent at once while other requests are
    in flight (``counting.sample_cpu_burst_seconds`` and ``answers.cpu_burst_seconds``; 10 in
    ``credit-10s``: all an idle sidecar saves up)."""
    port = free_port()
    cfg: dict[str, Any] = {
        "listen": {"host": "127.0.0.1", "port": port},
        "upstreams": {"openai": {"base_url": up + "/v1"}},
        "models": [
            {"match": model_name(s), "window": 128000, "max_output_tokens": 16384} for s in SIZES
        ],
        # as deployed: one JSON log line per request (to /dev/null here); its cost is the product's
        "log_level": "info",
        "workers": workers,
        "enforcement": {"mode": "enforce" if enforce else "observe"},
        "counting": {
            "cache_mib": 64 if cache else 0,
            "strategy": "bounded" if bounded else "exact",
            "sample_every": sample_every,
            "sample_cpu_burst_seconds": credit_burst,
            "overlap_bytes": 65536 if overlap else 0,
            "bpe": bpe,
        },
        "answers": {
            "enabled": answers,
            "cpu_share": answers_share,
            "cpu_burst_seconds": credit_burst,
        },
        "recording": {"batch_size": batch_size},
    }
    if enforce:
        # a ceiling at half of each request's size: every request is trimmed (retrieved chunks)
        entries = [
            {
                "model": model_name(s),
                "workload": "default",
                "ceiling_tokens": s // 2,
                "ceiling_utilization": round(s / 2 / 128000, 6),
                "window": 128000,
                "output_reservation": 64,
                "tolerance": 0.05,
                "margin": 0.1,
                "created_at": "2026-11-30T00:00:00Z",
                "provenance": {"sweep_run_id": "bench", "task_set_hash": "sha256:00"},
            }
            for s in SIZES
        ]
        (workdir / f"{name}-ceilings.yaml").write_text(
            yaml.safe_dump({"schema_version": 1, "version": 1, "entries": entries})
        )
        cfg["ceilings_file"] = str(workdir / f"{name}-ceilings.yaml")
        cfg["ceilings_persist"] = False
    # its own process group: the target stops the whole tree (workers included)
    sp = start_serve(cfg, workdir, name=name, timeout=90, new_session=True)
    return Target(name, sp.url + "/v1/chat/completions", sp.proc)


def litellm(
    up: str,
    workdir: Path,
    models: list[str] | None = None,
    router_settings: dict[str, Any] | None = None,
) -> Target | None:
    """LiteLLM's proxy, one worker, no database, logging at ERROR, serving ``models`` (default:
    the benchmark's) from the OpenAI-style API at ``up``/v1, with ``router_settings`` (its
    fallbacks, retries); None when not installed. The chaining tests start it this way too."""
    if not LITELLM.exists():
        return None
    port = free_port()
    cfg = {
        "model_list": [
            {
                "model_name": name,
                "litellm_params": {
                    "model": f"openai/{name}",
                    "api_base": up + "/v1",
                    "api_key": "sk-bench",
                },
            }
            for name in (models or [model_name(s) for s in SIZES])
        ],
        "litellm_settings": {"drop_params": True, "telemetry": False},
        **({"router_settings": router_settings} if router_settings else {}),
    }
    (workdir / "litellm.yaml").write_text(yaml.safe_dump(cfg))
    proc = _spawn(
        [
            str(LITELLM),
            "--config",
            str(workdir / "litellm.yaml"),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--num_workers",
            "1",
        ],
        {
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY": "true",
            "LITELLM_LOG": "ERROR",
            "PYTHONPATH": "",
        },
    )
    _wait(f"http://127.0.0.1:{port}/health/liveliness", proc, "litellm", timeout=180)
    return Target("litellm", f"http://127.0.0.1:{port}/v1/chat/completions", proc)


#: how each target is started in front of an upstream (its base URL) with a work directory, by
#: the name the tables give it, in the tables' order
_STARTS: dict[str, Callable[[str, Path], Target | None]] = {
    "bare": lambda up, w: bare(up),
    "bare-aiohttp": lambda up, w: bare(up, aiohttp=True),
    "litellm": lambda up, w: litellm(up, w),
    "sidecar": lambda up, w: sidecar(up, w),
    "tiktoken": lambda up, w: sidecar(up, w, "tiktoken", bpe="tiktoken"),
    "gigatoken": lambda up, w: sidecar(up, w, "gigatoken", bpe="gigatoken"),
    "first": lambda up, w: sidecar(up, w, "first", overlap=False),
    "bounded": lambda up, w: sidecar(up, w, "bounded", bounded=True),
    # the product's default counting: bounded, every request sampled while 2% of a core allows
    "default": lambda up, w: sidecar(up, w, "default", bounded=True, sample_every=1),
    "workers": lambda up, w: sidecar(up, w, "workers", workers=2),
    "cached": lambda up, w: sidecar(up, w, "cached", cache=True),
    "enforce": lambda up, w: sidecar(up, w, "enforce", enforce=True),
    "answers-off": lambda up, w: sidecar(up, w, "answers-off", answers=False),
    # the default, each request recorded as it finishes: what recording in batches saves
    "unbatched": lambda up, w: sidecar(
        up, w, "unbatched", bounded=True, sample_every=1, batch_size=1
    ),
    # the default with the answer checker at a thousandth of a core: what reading answers costs
    "answers-tiny": lambda up, w: sidecar(
        up, w, "answers-tiny", bounded=True, sample_every=1, answers_share=0.001
    ),
    # the default saving up ten seconds of its CPU shares while idle: what it spends when the
    # traffic returns after a pause (``python -m benchmarks.paired --pause 10``)
    "credit-10s": lambda up, w: sidecar(
        up, w, "credit-10s", bounded=True, sample_every=1, credit_burst=10.0
    ),
}
#: every target :func:`start` knows
NAMES = tuple(_STARTS)
#: the targets that are a paired run's baseline only (``python -m benchmarks.paired``), not in
#: the main table
PAIRED_ONLY = ("answers-off", "unbatched", "answers-tiny", "credit-10s")


def start(name: str, up: str, workdir: Path) -> Target | None:
    """The target the benchmark calls ``name`` (all but ``direct``, the upstream itself), in
    front of the upstream at ``up``; None for LiteLLM when it is not installed."""
    return _STARTS[name](up, workdir)


def binary(name: str) -> str:
    found = shutil.which(name)
    if not found:
        raise SystemExit(f"{name} is not installed: apt-get install {name} (make bench does it)")
    return found


def over_ceiling(t: Target) -> dict[str, float]:
    """The sidecar's own count of requests over their ceiling, by action (observed/trimmed)."""
    from prometheus_client.parser import text_string_to_metric_families

    base = t.url.removesuffix("/v1/chat/completions")
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(httpx.get(base + "/metrics", timeout=5).text):
        for sample in fam.samples:
            if sample.name == "llm_context_over_ceiling_total":
                a = sample.labels["action"]
                out[a] = out.get(a, 0) + sample.value
    return out
