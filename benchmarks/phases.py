"""``python -m benchmarks.phases``: where one request's CPU goes in the sidecar, by phase, and
its CPU per request against the bare pass-through.

Everything runs in one process on one event loop, with no sockets: a client (httpx over
``ASGITransport``) sends the benchmark's RAG requests (``bodies.py``) one at a time to a target,
and each target reaches the benchmark's upstream double (``upstream_double.py``) through
``ASGITransport`` too. Targets: ``direct`` (the client on the double), ``bare`` (the bare
pure-ASGI pass-through of ``passthrough.py``), and the sidecar in the configurations of
``targets.py`` (``sidecar``: the default config with the count cache off, so every request is
counted from scratch; ``bounded``: ``counting.strategy: bounded``). CPU per request is
``time.process_time`` over ``--requests`` requests after a warm-up, the median of ``--rounds``
passes taken with the targets in turn; a proxy's own CPU is its
target's less ``direct``'s (the client and the double cost the same in both), so the ratio to
the bare pass-through compares what each proxy adds. The network hop to the upstream is httpx's
in-process transport here, not the aiohttp transport the sidecar deploys with, and uvicorn's
HTTP parsing is absent from every target alike: the figures are the request path's own work.

The phases come from ``cProfile`` over a second pass of the same requests (its own overhead
grows with the number of Python calls, so the shares are the profile's and the CPU figures are
the unprofiled pass's; it times by the wall clock, so run it on a quiet machine): each function's own time (``tottime``) goes to the phase its module
belongs to (:data:`PHASES`; a built-in to its callers' phases), less the same phase's time in the ``direct`` pass (the client and
the double). Prints a Markdown table per size and writes ``--json``.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import logging
import os
import pstats
import statistics
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx

from benchmarks import targets as tg
from benchmarks import upstream_double
from benchmarks.bodies import body_of
from benchmarks.passthrough import make_app
from context_ceiling.sidecar.app import create_app
from context_ceiling.sidecar.config import Settings
from context_ceiling.sidecar.observability import logs

#: (phase, substrings of a function's file path or name); the first phase that matches wins
PHASES: list[tuple[str, tuple[str, ...]]] = [
    ("harness", ("benchmarks/", "testkit/")),
    (
        "count",
        ("core/counting", "core/tokenizers", "riptoken", "tiktoken", "gigatoken", "thread_time"),
    ),
    ("parse", ("orjson.loads", "json/decoder", "shape_checks")),
    (
        "decision",
        ("sidecar/enforce", "sidecar/schedule", "sidecar/routing", "core/trim", "bounded_count"),
    ),
    ("logging", ("observability/logs", "/logging/", "json/encoder", "orjson.dumps")),
    (
        "metrics",
        ("prometheus_client", "observability/metrics", "observability/record", "staleness"),
    ),
    ("tracing", ("opentelemetry", "observability/tracing", "observability/semconv")),
    ("answers", ("observability/answer", "jsonschema", "sidecar/capture")),
    (
        "relay",
        (
            "sidecar/upstream",
            "/httpx/",
            "/httpcore/",
            "/aiohttp/",
            "/h11/",
            "formats/framing",
            "http/cookiejar",
            "email/",
            "urllib/",
        ),
    ),
    ("format", ("context_ceiling/formats/",)),
    (
        "request path",
        ("sidecar/proxy", "sidecar/exchange", "sidecar/app", "sidecar/outcomes", "uuid"),
    ),
    ("framework", ("/starlette/", "/anyio/", "asyncio", "selectors")),
]
ORDER = [p for p, _ in PHASES if p != "harness"] + ["other"]

#: an ASGI application (the double, the pass-through and the sidecar type theirs apart)
App = Any


def phase_of(where: str) -> str:
    """The phase a function belongs to, by its file path and name (``pstats``' key joined)."""
    for phase, needles in PHASES:
        if any(n in where for n in needles):
            return phase
    return "other"


def by_phase(profile: cProfile.Profile) -> dict[str, float]:
    """Seconds of own time (``tottime``) per phase. A built-in (``str.encode``, ``dict.get``)
    that no phase names by itself goes to the phases of its callers, in proportion to the time
    each caller spent in it."""
    out: dict[str, float] = {}
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]

    def where(key: tuple[str, int, str]) -> str:
        return f"{key[0].replace(os.sep, '/')}:{key[2]}"

    for key, row in stats.items():
        tottime, callers = row[2], row[4]
        phase = phase_of(where(key))
        if phase == "other" and key[0] == "~" and callers:
            spent = sum(c[2] for c in callers.values()) or 1.0
            for caller, c in callers.items():
                share = tottime * c[2] / spent
                to = phase_of(where(caller))
                out[to] = out.get(to, 0.0) + share
            continue
        out[phase] = out.get(phase, 0.0) + tottime
    return out


async def _started(app: App) -> Callable[[], Awaitable[None]]:
    """Run ``app``'s lifespan startup; the returned call shuts it down."""
    inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    outbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    task: asyncio.Future[None] = asyncio.ensure_future(
        app({"type": "lifespan", "asgi": {"version": "3.0"}}, inbox.get, outbox.put)
    )
    await inbox.put({"type": "lifespan.startup"})
    started = await outbox.get()
    if started["type"] != "lifespan.startup.complete":
        raise RuntimeError(f"the app did not start: {started}")

    async def stop() -> None:
        await inbox.put({"type": "lifespan.shutdown"})
        await outbox.get()
        await task

    return stop


async def _send(client: httpx.AsyncClient, body: bytes, target: str) -> None:
    r = await client.post(
        "/v1/chat/completions", content=body, headers={"content-type": "application/json"}
    )
    await r.aread()
    if r.status_code != 200:
        raise RuntimeError(f"{target}: {r.status_code} {r.text[:200]}")


#: the sidecar configs this benchmark profiles (:func:`sidecar_settings`)
SIDECAR_TARGETS = ("sidecar", "bounded")


def sidecar_settings(name: str) -> Settings:
    """The sidecar as ``targets.py`` starts it for ``name`` (``sidecar`` or ``bounded``)."""
    return Settings(
        upstreams={"openai": {"base_url": "http://upstream.bench/v1"}},
        models=[
            {"match": tg.model_name(s), "window": 128000, "max_output_tokens": 16384}
            for s in tg.SIZES
        ],
        log_level="info",
        enforcement={"mode": "observe"},
        counting={
            "cache_mib": 0,
            "strategy": "bounded" if name == "bounded" else "exact",
            "sample_every": 16,
            "overlap_bytes": 65536,
            "bpe": "riptoken",
        },
    )


async def measure(
    names: list[str], sizes: list[int], requests: int, warmup: int, stream: bool, rounds: int = 5
) -> dict[str, Any]:
    """CPU ms per request of every target and size, and the sidecar targets' phase shares."""
    double: App = upstream_double.app
    upstream = httpx.ASGITransport(app=double)
    apps: dict[str, App] = {"direct": double}
    bare_client = httpx.AsyncClient(
        base_url="http://upstream.bench", transport=upstream, trust_env=False
    )
    apps["bare"] = make_app(bare_client)
    stops = []
    for name in names:
        app = create_app(sidecar_settings(name), upstream)
        stops.append(await _started(app))
        apps[name] = app
    out: dict[str, Any] = {"cpu_ms": {}, "phases": {}}
    clients = {
        t: httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://target.bench", trust_env=False
        )
        for t, app in apps.items()
    }
    try:
        for size in sizes:
            body, _ = body_of(size, stream)
            for target, client in clients.items():
                for _ in range(warmup):
                    await _send(client, body, target)
            # rounds with the targets in turn, each target's CPU the median over rounds: the
            # machine's drift reaches every target alike
            samples: dict[str, list[float]] = {t: [] for t in clients}
            for _ in range(rounds):
                for target, client in clients.items():
                    t0 = time.process_time()
                    for _ in range(requests):
                        await _send(client, body, target)
                    samples[target].append((time.process_time() - t0) / requests * 1e3)
            cpu = {t: statistics.median(v) for t, v in samples.items()}
            phases: dict[str, dict[str, float]] = {}
            for target, client in clients.items():
                prof = cProfile.Profile()
                prof.enable()
                for _ in range(requests):
                    await _send(client, body, target)
                prof.disable()
                phases[target] = {k: v / requests * 1e3 for k, v in by_phase(prof).items()}
            out["cpu_ms"][size] = cpu
            out["phases"][size] = {
                t: {
                    p: max(0.0, phases[t].get(p, 0.0) - phases["direct"].get(p, 0.0)) for p in ORDER
                }
                for t in apps
                if t != "direct"
            }
    finally:
        for c in clients.values():
            await c.aclose()
        for stop in stops:
            await stop()
        await bare_client.aclose()
    return out


def table(result: dict[str, Any], size: int) -> str:
    cpu = result["cpu_ms"][size]
    phases = result["phases"][size]
    direct = cpu["direct"]
    bare = cpu["bare"] - direct
    targets = [t for t in cpu if t != "direct"]
    head = "| phase | " + " | ".join(targets) + " |"
    rows = [head, "|---|" + "---:|" * len(targets)]
    for p in ORDER:
        cells = []
        for t in targets:
            total = sum(phases[t].values()) or 1.0
            share = phases[t][p] / total
            cells.append(f"{share:.0%}" if share >= 0.005 else "-")
        if any(c != "-" for c in cells):
            rows.append(f"| {p} | " + " | ".join(cells) + " |")
    rows.append(
        "| **CPU ms per request added** | "
        + " | ".join(f"{cpu[t] - direct:.3f}" for t in targets)
        + " |"
    )
    rows.append(
        "| **vs bare pass-through** | "
        + " | ".join(f"x{(cpu[t] - direct) / bare:.2f}" if bare > 0 else "-" for t in targets)
        + " |"
    )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.phases", description=__doc__)
    p.add_argument("--sizes", default="1000,8000", help="request sizes in tokens")
    p.add_argument("--targets", default="sidecar,bounded", help="sidecar configs to profile")
    p.add_argument("--requests", type=int, default=200, help="requests per pass")
    p.add_argument("--rounds", type=int, default=5, help="measured passes per target (median)")
    p.add_argument("--warmup", type=int, default=50, help="requests before each measurement")
    p.add_argument("--stream", action="store_true", help="streamed requests")
    p.add_argument("--json", type=Path, help="write the result here")
    args = p.parse_args(argv)
    logs.configure("info")
    # as deployed, one JSON line per request is formatted and written; here to /dev/null
    devnull = open(os.devnull, "w")  # noqa: SIM115  (lives as long as the run)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.StreamHandler):
            handler.setStream(devnull)
    sizes = [int(s) for s in args.sizes.split(",")]
    names = [n for n in args.targets.split(",") if n]
    unknown = [n for n in names if n not in SIDECAR_TARGETS]
    if unknown or not names:
        # direct and bare are measured in every run, as the baselines; a sidecar config
        # under one of their names would replace the baseline it is compared with
        p.error(
            f"--targets takes sidecar configs ({', '.join(SIDECAR_TARGETS)}), not "
            f"{', '.join(unknown) or 'nothing'}; direct and bare are always measured"
        )
    result = asyncio.run(
        measure(names, sizes, args.requests, args.warmup, args.stream, args.rounds)
    )
    result["stream"] = args.stream
    for size in sizes:
        print(
            f"\n{size:,} tokens{' (streamed)' if args.stream else ''}: share of each proxy's "
            "own CPU by phase\n"
        )
        print(table(result, size))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
