"""Memory under 500 concurrent slow streams: the sidecar must relay, not buffer.

An upstream double streams each response slowly (``CHUNKS`` events ``PACE`` s apart); 500 clients
hold a stream open at once through the sidecar and, for comparison, through the bare
pass-through. The proxy's resident memory is sampled idle, at the peak while all streams are open,
and after they close; what matters is the cost per open stream and that it returns to idle.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import orjson

from benchmarks import targets as tg

STREAMS = 500
PACE = 0.1
CHUNKS = 40  # about 4 s per stream


async def _hold(url: str, n: int) -> int:
    body = orjson.dumps(
        {
            "model": tg.model_name(1000),
            "messages": [{"role": "user", "content": "stream slowly, please " * 50}],
            "stream": True,
        }
    )
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:

        async def one() -> int:
            got = 0
            async with client.stream(
                "POST", url, content=body, headers={"content-type": "application/json"}
            ) as r:
                async for chunk in r.aiter_raw():
                    got += len(chunk)
            return got

        sizes = await asyncio.gather(*(one() for _ in range(n)))
    return sum(1 for s in sizes if s > 0)


def slow_streams(work: Path, n: int = STREAMS) -> dict[str, Any]:
    up = tg.upstream(work, pace=PACE, chunks=CHUNKS)
    base = up.url.removesuffix("/v1/chat/completions")
    out: dict[str, Any] = {"streams": n, "seconds": PACE * CHUNKS, "targets": {}}
    try:
        makers: tuple[Callable[[], tg.Target], ...] = (
            lambda: tg.sidecar(base, work),
            lambda: tg.bare(base),
        )
        for make in makers:
            t = make()
            try:
                asyncio.run(_hold(t.url, 20))  # warm: imports, pools
                time.sleep(0.5)
                idle = t.rss()
                t.peak_rss = idle
                t.start_sampling(0.02)
                ok = asyncio.run(_hold(t.url, n))
                time.sleep(1.0)
                after = t.rss()
                out["targets"][t.name] = {
                    "completed": ok,
                    "idle_mib": idle / 2**20,
                    "peak_mib": t.peak_rss / 2**20,
                    "after_mib": after / 2**20,
                    "per_stream_kib": (t.peak_rss - idle) / n / 1024,
                }
            finally:
                t.stop()
    finally:
        up.stop()
    return out
