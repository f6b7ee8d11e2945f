"""``make bench``: what the sidecar costs, measured against calling the upstream directly.

Same machine, same run, same loopback upstream (``benchmarks/upstream_double.py``, a test double
for a hosted API that answers instantly). For request sizes of 1k, 8k and 64k tokens, streamed and
not, it reports the sidecar's added latency (p50, p99, at concurrency 1) and throughput (at
concurrency 8) as ratios to direct calls, each a median over interleaved rounds with the
min-max across rounds; and the token-counting time of a whole request against raw tiktoken on the
same text. Prints a Markdown table and writes ``out/bench/sidecar.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ceiling.counting import count_openai  # noqa: E402
from ceiling.llamacpp import free_port  # noqa: E402
from ceiling.tokenizers import TiktokenCounter  # noqa: E402

SENTENCE = (
    "Record {i}: the service contract between Northwind and client K{i:03d} renews on day "
    "{d} with a fee of {f} EUR and a notice period of {n} days. "
)


def body_of(tokens: int, stream: bool) -> tuple[bytes, str]:
    enc = TiktokenCounter("o200k_base")
    parts: list[str] = []
    i = 0
    while True:
        parts.append(SENTENCE.format(i=i, d=i % 365, f=100 + i % 900, n=30 + i % 60))
        i += 1
        if i % 50 == 0 and enc.count("".join(parts)) >= tokens:
            break
    text = "".join(parts)
    body = {
        "model": "gpt-4o",
        "messages": [
            {"role": "system", "content": "Answer from the records."},
            {"role": "user", "content": text + "\nWhat is the fee of K007?"},
        ],
        "max_tokens": 20,
        "stream": stream,
    }
    return orjson.dumps(body), text


def wait_up(url: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.TransportError:
            time.sleep(0.1)
    raise SystemExit(f"{url} did not come up")


async def one(
    client: httpx.AsyncClient, url: str, body: bytes, stream: bool
) -> tuple[float, float]:
    t0 = time.perf_counter()
    if stream:
        async with client.stream(
            "POST", url, content=body, headers={"content-type": "application/json"}
        ) as r:
            first = None
            async for _ in r.aiter_raw():
                if first is None:
                    first = time.perf_counter() - t0
            return time.perf_counter() - t0, first or 0.0
    r = await client.post(url, content=body, headers={"content-type": "application/json"})
    r.raise_for_status()
    return time.perf_counter() - t0, 0.0


async def latency(url: str, body: bytes, stream: bool, n: int) -> dict[str, float]:
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=1)) as c:
        for _ in range(min(10, n)):
            await one(c, url, body, stream)
        samples = [await one(c, url, body, stream) for _ in range(n)]
    lat = sorted(s[0] for s in samples)
    return {
        "p50": lat[len(lat) // 2],
        "p99": lat[min(len(lat) - 1, int(len(lat) * 0.99))],
        "ttfb_p50": statistics.median(s[1] for s in samples),
    }


async def throughput(
    url: str, body: bytes, stream: bool, concurrency: int, seconds: float
) -> float:
    done = 0
    stop = time.perf_counter() + seconds
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=concurrency)) as c:

        async def worker() -> None:
            nonlocal done
            while time.perf_counter() < stop:
                await one(c, url, body, stream)
                done += 1

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return done / (time.perf_counter() - t0)


def counting(body: bytes, text: str, reps: int) -> dict[str, float]:
    enc = TiktokenCounter("o200k_base")
    raw = enc.encoding.encode_ordinary
    obj = orjson.loads(body)

    def best(fn: Any) -> float:
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    t_raw = best(lambda: raw(text))
    t_ours = best(lambda: count_openai(orjson.loads(body), enc))
    t_count_only = best(lambda: count_openai(obj, enc))
    return {
        "raw_tiktoken_ms": t_raw * 1e3,
        "sidecar_count_ms": t_ours * 1e3,
        "count_only_ms": t_count_only * 1e3,
        "ratio": t_ours / t_raw,
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sizes", default="1000,8000,64000")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--out", default=str(ROOT / "out" / "bench"))
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    up_port, sc_port, pt_port = free_port(), free_port(), free_port()
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "benchmarks.upstream_double", str(up_port)],
            cwd=ROOT,
            env=env,
            start_new_session=True,
        )
    ]
    tmp = Path(tempfile.mkdtemp(prefix="ceiling-bench-"))
    (tmp / "sidecar.yaml").write_text(
        yaml.safe_dump(
            {
                "listen": {"host": "127.0.0.1", "port": sc_port},
                "upstreams": {"openai": {"base_url": f"http://127.0.0.1:{up_port}/v1"}},
                "models": [{"match": "gpt-4o", "window": 128000, "max_output_tokens": 16384}],
                "log_level": "warning",
            }
        )
    )
    procs.append(
        subprocess.Popen(
            [sys.executable, "-m", "ceiling.cli", "serve", "--config", str(tmp / "sidecar.yaml")],
            cwd=ROOT,
            env=env,
            start_new_session=True,
        )
    )
    procs.append(
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "benchmarks.passthrough",
                str(pt_port),
                f"http://127.0.0.1:{up_port}",
            ],
            cwd=ROOT,
            env=env,
            start_new_session=True,
        )
    )
    direct = f"http://127.0.0.1:{up_port}/v1/chat/completions"
    via = f"http://127.0.0.1:{sc_port}/v1/chat/completions"
    bare = f"http://127.0.0.1:{pt_port}/v1/chat/completions"
    results: list[dict[str, Any]] = []
    try:
        wait_up(f"http://127.0.0.1:{up_port}/")
        wait_up(f"http://127.0.0.1:{sc_port}/healthz")
        wait_up(f"http://127.0.0.1:{pt_port}/")
        for size in (int(s) for s in args.sizes.split(",")):
            for stream in (False, True):
                body, text = body_of(size, stream)
                n = 200 if size <= 1000 else 100 if size <= 8000 else 30
                rounds: list[dict[str, float]] = []
                for _ in range(args.rounds):  # interleaved so drift hits both sides alike
                    d = asyncio.run(latency(direct, body, stream, n))
                    s = asyncio.run(latency(via, body, stream, n))
                    b = asyncio.run(latency(bare, body, stream, n))
                    td = asyncio.run(throughput(direct, body, stream, 8, args.seconds))
                    ts = asyncio.run(throughput(via, body, stream, 8, args.seconds))
                    rounds.append(
                        {
                            "direct_p50_ms": d["p50"] * 1e3,
                            "sidecar_p50_ms": s["p50"] * 1e3,
                            "added_p50_ms": (s["p50"] - d["p50"]) * 1e3,
                            "added_p99_ms": (s["p99"] - d["p99"]) * 1e3,
                            "bare_added_p50_ms": (b["p50"] - d["p50"]) * 1e3,
                            "direct_rps": td,
                            "sidecar_rps": ts,
                            "rps_ratio": ts / td,
                            "ttfb_added_ms": (s["ttfb_p50"] - d["ttfb_p50"]) * 1e3,
                        }
                    )
                row: dict[str, Any] = {"tokens": size, "stream": stream, "body_bytes": len(body)}
                for key in rounds[0]:
                    vals = [r[key] for r in rounds]
                    row[key] = {
                        "median": statistics.median(vals),
                        "min": min(vals),
                        "max": max(vals),
                    }
                row["counting"] = counting(body, text, 20 if size > 8000 else 100)
                results.append(row)
                print(
                    f"{size:>6} tok stream={stream!s:5} added p50 {row['added_p50_ms']['median']:.2f} ms "
                    f"p99 {row['added_p99_ms']['median']:.2f} ms, throughput x{row['rps_ratio']['median']:.2f}, "
                    f"counting {row['counting']['sidecar_count_ms']:.2f} ms vs tiktoken "
                    f"{row['counting']['raw_tiktoken_ms']:.2f} ms",
                    flush=True,
                )
    finally:
        for p in procs:
            os.killpg(p.pid, signal.SIGTERM)
            p.wait(timeout=15)
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    (out / "sidecar.json").write_text(
        json.dumps({"machine": machine, "results": results}, indent=2)
    )

    def fmt(x: dict[str, float], nd: int = 2) -> str:
        return f"{x['median']:.{nd}f} ({x['min']:.{nd}f}-{x['max']:.{nd}f})"

    print(f"\nMachine: {machine}; {args.rounds} interleaved rounds; median (min-max)\n")
    print(
        "| tokens | stream | direct p50 ms | added p50 ms | bare pass-through added p50 ms | added p99 ms | throughput vs direct (c=8) | counting ms (sidecar / raw tiktoken) |"
    )
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    for r in results:
        c = r["counting"]
        print(
            f"| {r['tokens']:,} | {'yes' if r['stream'] else 'no'} | {fmt(r['direct_p50_ms'])} | {fmt(r['added_p50_ms'])} | "
            f"{fmt(r['bare_added_p50_ms'])} | "
            f"{fmt(r['added_p99_ms'])} | {fmt(r['rps_ratio'])} | {c['sidecar_count_ms']:.2f} / {c['raw_tiktoken_ms']:.2f} "
            f"(x{c['ratio']:.2f}) |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
