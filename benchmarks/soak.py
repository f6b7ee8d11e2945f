"""Soak: does the sidecar's memory and file-descriptor count stay flat under mixed, failing load?

The sidecar runs as ``ceiling serve`` (its own process, as deployed) in front of the
fault-injecting provider double (``testkit/doubles/fault_provider.py``, a loopback stand-in for a
hosted API). Client threads send a mix for ``--seconds``: plain and streamed requests of both
APIs, streams that reset, stall, end early or carry an oversized event, 429s and 500s, and
responses over the response cap (``--huge-mib`` each: the first phase sends 100 MiB of them in
all). RSS and open file descriptors of the sidecar are sampled every few seconds (psutil).
Reported: idle RSS, RSS after the big responses, at the end, and its maximum; fds at start and
end; requests by status. Targets (issue 15): RSS within 50 MB of idle, fds flat.

``python -m benchmarks.soak [--seconds 600] [--clients 8]`` (part of ``make bench-soak``).
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import psutil

from testkit.doubles.fault_provider import FaultyProviderDouble
from testkit.serving import free_port, serve, start_serve

ROOT = Path(__file__).resolve().parent.parent

MSG = [{"role": "user", "content": "hello " * 200}]
MIX = [
    ("openai", False, "none"),
    ("openai", True, "none"),
    ("anthropic", False, "none"),
    ("anthropic", True, "none"),
    ("openai", True, "reset"),
    ("anthropic", True, "no_end"),
    ("openai", True, "truncated_event"),
    ("anthropic", True, "oversized_event"),
    ("openai", True, "stall"),
    ("openai", False, "429"),
    ("anthropic", False, "500"),
    ("openai", False, "huge"),
]


def request(client: httpx.Client, url: str, api: str, stream: bool, fault: str) -> str:
    body: dict[str, Any]
    if api == "openai":
        path, body = "/v1/chat/completions", {"model": "gpt-4o", "messages": MSG}
    else:
        path = "/v1/messages"
        body = {"model": "claude-x", "max_tokens": 20, "messages": MSG}
    body["stream"] = stream
    headers = {"x-fault": fault, "anthropic-version": "2023-06-01"}
    try:
        if stream:
            with client.stream("POST", url + path, json=body, headers=headers) as r:
                for _ in r.iter_raw():
                    pass
                return str(r.status_code)
        return str(client.post(url + path, json=body, headers=headers).status_code)
    except httpx.HTTPError as exc:
        return type(exc).__name__


def sample(proc: psutil.Process) -> tuple[float, int]:
    return proc.memory_info().rss / 2**20, proc.num_fds()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=600)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--huge-mib", type=int, default=4)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    import logging

    logging.getLogger("uvicorn.error").setLevel(logging.CRITICAL)  # the double's injected resets
    double = FaultyProviderDouble(huge_bytes=args.huge_mib * 2**20, stall_seconds=5)
    with serve(double) as durl, tempfile.TemporaryDirectory() as d:
        port = free_port()
        timeouts = {"connect": 2, "read": 2, "total": 10}
        cfg: dict[str, Any] = {
            "listen": {"host": "127.0.0.1", "port": port},
            "upstreams": {
                "openai": {"base_url": durl + "/v1", "timeouts": timeouts},
                "anthropic": {"base_url": durl, "timeouts": timeouts},
            },
            "models": [
                {"match": "gpt-4o", "window": 128000},
                {"match": "claude-*", "label": "claude", "window": 200000},
            ],
            "limits": {"max_response_bytes": 2**20, "max_event_bytes": 2**20},
            "log_level": "warning",
        }
        sp = start_serve(cfg, Path(d), timeout=10)
        proc, url = sp.proc, sp.url
        try:
            ps = psutil.Process(proc.pid)
            with httpx.Client(timeout=30) as c:
                for api, stream, fault in MIX[:4]:
                    request(c, url, api, stream, fault)  # warm
            idle_rss, idle_fds = sample(ps)
            statuses: Counter[str] = Counter()
            # phase 1: 100 MiB of over-cap responses
            with httpx.Client(timeout=30) as c:
                for _ in range(max(1, 100 // args.huge_mib)):
                    statuses[request(c, url, "openai", False, "huge")] += 1
            after_huge, _ = sample(ps)
            # phase 2: the mixed soak
            stop = time.monotonic() + args.seconds
            lock = threading.Lock()

            def client(seed: int) -> None:
                rng = random.Random(seed)
                with httpx.Client(timeout=30) as c:
                    while time.monotonic() < stop:
                        got = request(c, url, *rng.choice(MIX))
                        with lock:
                            statuses[got] += 1

            threads = [threading.Thread(target=client, args=(k,)) for k in range(args.clients)]
            for t in threads:
                t.start()
            series = []
            while any(t.is_alive() for t in threads):
                time.sleep(5)
                series.append(sample(ps))
            for t in threads:
                t.join()
            time.sleep(1)
            end_rss, end_fds = sample(ps)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    res = {
        "seconds": args.seconds,
        "requests": sum(statuses.values()),
        "statuses": dict(statuses),
        "idle_rss_mb": round(idle_rss, 1),
        "after_100mib_rss_mb": round(after_huge, 1),
        "end_rss_mb": round(end_rss, 1),
        "max_rss_mb": round(max([idle_rss, after_huge, end_rss] + [r for r, _ in series]), 1),
        "idle_fds": idle_fds,
        "end_fds": end_fds,
        "max_fds": max([idle_fds, end_fds] + [f for _, f in series]),
    }
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))
    print(json.dumps(res, indent=2))
    ok = (
        res["end_rss_mb"] - res["idle_rss_mb"] <= 50
        and res["after_100mib_rss_mb"] - res["idle_rss_mb"] <= 50
    )
    print(
        f"RSS idle {idle_rss:.0f} MB, after 100 MiB of responses {after_huge:.0f} MB, end "
        f"{end_rss:.0f} MB (max {res['max_rss_mb']} MB); fds {idle_fds} -> {end_fds}: "
        + ("within 50 MB of idle" if ok else "NOT within 50 MB of idle")
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
