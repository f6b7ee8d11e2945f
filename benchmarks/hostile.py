"""Hostile clients and racing operators against a real ``ceiling serve``:

- **oversized heads**: 1,000 connections at once, each sending a request head far over
  ``limits.max_header_bytes`` (1 MiB of one header), against a sidecar at rest: its RSS at the
  peak against idle (target: within 50 MB), and how many got the 431; then the same with heads
  of 5,000 tiny header fields each (under the byte cap, over ``limits.max_header_count``);
- **a large reload**: a ceilings document just under the size cap moved into place while
  requests keep coming: the slowest request during the reload (target: none delayed over 50 ms);
- **racing pushes**: 1,000 pushes over 4 workers from 32 threads, many of them of the same
  version with other content: versions accepted twice (target 0), workers serving different
  documents after the race (target 0), the file on disk against what runs.

``python -m benchmarks.hostile [--heads 1000] [--pushes 1000]``
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import random
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
import yaml

from testkit.serving import free_port, start_serve
from testkit.traffic.ceiling_docs import doc, entry

TOKEN = "bench-admin-token"


def _start(tmp: Path, **more: Any) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    cfg = {
        "listen": {"host": "127.0.0.1", "port": port},
        "upstreams": {"openai": {"base_url": "http://127.0.0.1:9/v1"}},
        "models": [{"match": "gpt-4o", "window": 128000}],
        "log_level": "warning",
        **more,
    }
    env = {}
    if more.get("workers", 1) > 1:  # the workers share their metric files there
        (tmp / f"mp-{port}").mkdir()
        env["PROMETHEUS_MULTIPROC_DIR"] = str(tmp / f"mp-{port}")
    sp = start_serve(cfg, tmp, name=f"sidecar-{port}", env=env, timeout=60)
    return sp.proc, sp.url


def _tree_rss(proc: subprocess.Popen[bytes]) -> int:
    p = psutil.Process(proc.pid)
    return sum(x.memory_info().rss for x in [p, *p.children(recursive=True)])


BIG_HEAD = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (1 << 20) + b"\r\n\r\n"
#: 5,000 header fields of 9-12 bytes: about 55 KB, under the 64 KiB byte cap
MANY_HEADERS = (
    b"GET /healthz HTTP/1.1\r\nHost: x\r\n"
    + b"".join(b"X-%d: 1\r\n" % k for k in range(5000))
    + b"\r\n"
)


def heads(n: int, tmp: Path, head: bytes = BIG_HEAD, what: str = "a 1 MiB header") -> None:
    proc, url = _start(tmp, limits={"max_connections": 4096})
    try:
        time.sleep(1.0)
        idle = _tree_rss(proc)
        peak = idle
        stop = threading.Event()

        def sample() -> None:
            nonlocal peak
            while not stop.is_set():
                peak = max(peak, _tree_rss(proc))
                time.sleep(0.02)

        sampler = threading.Thread(target=sample)
        sampler.start()
        host, port = url.removeprefix("http://").split(":")

        def one(_: int) -> bytes:
            with socket.create_connection((host, int(port)), timeout=30) as s:
                with contextlib.suppress(OSError):  # refused mid-send: the answer is there
                    s.sendall(head)
                try:
                    return s.recv(64)
                except OSError:
                    return b""

        with concurrent.futures.ThreadPoolExecutor(200) as pool:
            answers = list(pool.map(one, range(n)))
        stop.set()
        sampler.join()
        refused = sum(1 for a in answers if a.startswith(b"HTTP/1.1 431"))
        print(
            f"hostile heads: {n} connections with {what}: {refused} answered 431; "
            f"RSS idle {idle / 2**20:.0f} MiB, peak {peak / 2**20:.0f} MiB "
            f"(+{(peak - idle) / 2**20:.1f} MiB; target within 50 MB)"
        )
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def reload_stall(tmp: Path) -> None:
    """A ceilings document just under the size cap moved into place while requests keep
    coming: the slowest answer during the reload (target: no request delayed by more than
    50 ms)."""
    from context_ceiling.sidecar.ceilings.store import MAX_DOCUMENT_BYTES

    ceilings = tmp / "reload.yaml"
    ceilings.write_text(yaml.safe_dump(doc(1, entry(tokens=90000))))
    proc, url = _start(tmp, ceilings_file=str(ceilings))
    try:
        time.sleep(1.0)
        one = len(yaml.safe_dump([entry(model="m-00000", tokens=90000)]))
        n = int(MAX_DOCUMENT_BYTES * 0.95) // one
        big = tmp / "big.yaml"
        big.write_text(
            yaml.safe_dump(doc(2, *(entry(model=f"m-{k:05d}", tokens=90000) for k in range(n))))
        )
        size = big.stat().st_size
        with httpx.Client(timeout=10) as client:
            baseline = []
            for _ in range(200):
                t = time.perf_counter()
                client.get(url + "/healthz")
                baseline.append(time.perf_counter() - t)
            big.rename(ceilings)
            started, during = time.perf_counter(), []
            while time.perf_counter() - started < 60:
                t = time.perf_counter()
                client.get(url + "/healthz")
                during.append(time.perf_counter() - t)
                r = client.get(url + "/metrics")
                if "llm_context_config_version 2.0" in r.text:
                    break
        print(
            f"reload of a {size / 2**20:.1f} MiB document ({n} entries) by rename: applied after "
            f"{time.perf_counter() - started:.1f} s; slowest request during it "
            f"{max(during) * 1e3:.0f} ms over {len(during)} requests (at rest "
            f"{max(baseline) * 1e3:.0f} ms; target no request delayed over 50 ms)"
        )
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def pushes(n: int, tmp: Path) -> None:
    ceilings = tmp / "ceilings.yaml"
    ceilings.write_text(yaml.safe_dump(doc(1, entry(tokens=90000))))
    proc, url = _start(
        tmp, ceilings_file=str(ceilings), ceilings_persist=True, admin_token=TOKEN, workers=4
    )
    try:
        time.sleep(2.0)  # every worker up
        rng = random.Random(1)
        plan = [(rng.randint(2, n // 4 + 2), 1000 + k) for k in range(n)]
        headers = {"authorization": f"Bearer {TOKEN}", "connection": "close"}

        def push(p: tuple[int, int]) -> tuple[tuple[int, int], int]:
            r = httpx.put(
                url + "/admin/ceilings",
                json=doc(p[0], entry(tokens=p[1])),
                headers=headers,
                timeout=60,
            )
            return p, r.status_code

        t0 = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(32) as pool:
            results = list(pool.map(push, plan))
        secs = time.perf_counter() - t0
        accepted = [p for p, status in results if status == 200]
        versions = [v for v, _ in accepted]
        twice = len(versions) - len(set(versions))
        top = max(accepted)
        time.sleep(1.0)
        served = set()
        for _ in range(64):
            got = httpx.get(url + "/admin/ceilings", headers=headers).json()
            served.add((got["version"], got["entries"][0]["ceiling_tokens"]))
        on_disk = yaml.safe_load(ceilings.read_text())
        disk = (on_disk["version"], on_disk["entries"][0]["ceiling_tokens"])
        print(
            f"racing pushes: {n} pushes over 4 workers in {secs:.1f} s: {len(accepted)} accepted, "
            f"{twice} versions accepted twice, {len(served - {top})} documents served besides "
            f"the last accepted one, file == running: {disk == top and served == {top}}"
        )
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--heads", type=int, default=1000)
    ap.add_argument("--pushes", type=int, default=1000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.heads:
            heads(args.heads, Path(tmp))
            heads(args.heads, Path(tmp), MANY_HEADERS, "5,000 tiny header fields")
        reload_stall(Path(tmp))
        if args.pushes:
            pushes(args.pushes, Path(tmp))


if __name__ == "__main__":
    main()
