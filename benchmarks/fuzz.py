"""Malformed-but-parseable bodies against a running sidecar: how many get a 5xx from it?

Each body is a valid request of one API (``testkit/traffic/fuzz_bodies.py``: chat completions, messages,
Responses and Gemini, every field the sidecar reads) with one mutation: a value replaced by
another JSON value (any type, nested up to 300 deep), or a content part (an object in a list)
replaced by a scalar or a list; sent streamed and not to a sidecar in front of a loopback
provider double that accepts anything. Target: 0 sidecar-generated 5xx in 10,000 bodies per
route, every 4xx in the provider's shape.

``python -m benchmarks.fuzz [--n 10000] [--seed 1]``
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections import Counter
from typing import Any

import httpx

from context_ceiling.sidecar.app import create_app
from context_ceiling.sidecar.config import Settings
from testkit.doubles.fault_provider import FaultyProviderDouble
from testkit.serving import serve, upstreams_at
from testkit.traffic.fuzz_bodies import (
    ROUTES,
    TEMPLATES,
    mutate,
    non_object_parts,
    paths,
    random_json,
)


def _send(client: httpx.Client, url: str, body: object) -> tuple[int, bytes]:
    """(status, body); a stream the sidecar ended with an error event and an aborted body
    (the upstream double answered it with something that is no stream) keeps its status."""
    with client.stream(
        "POST",
        url,
        content=json.dumps(body).encode(),
        headers={"anthropic-version": "2023-06-01"},
    ) as r:
        try:
            return r.status_code, r.read()
        except httpx.RemoteProtocolError:
            return r.status_code, b""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=10000, help="bodies per route")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)
    rows = []
    with serve(FaultyProviderDouble()) as durl:
        cfg: dict[str, Any] = {
            "upstreams": upstreams_at(durl),
            "models": [
                {"match": "gpt-4o", "window": 128000},
                {"match": "claude-*", "window": 200000},
            ],
            "log_level": "warning",
        }
        app = create_app(Settings(**cfg))
        with serve(app) as url, httpx.Client(timeout=30) as client:
            for api, route in ROUTES.items():
                template = TEMPLATES[api]
                statuses: Counter[int] = Counter()
                bad_shape = 0
                t0 = time.perf_counter()
                all_paths = paths(template)
                parts = non_object_parts(template)
                for _ in range(args.n):
                    base = template | ({"stream": rng.random() < 0.5} if api != "gemini" else {})
                    if rng.random() < 0.3:  # a part that is not an object
                        where, value = rng.choice(parts)
                        body = mutate(base, where, value)
                    else:
                        body = mutate(base, rng.choice(all_paths), random_json(rng))
                    status, content = _send(client, url + route, body)
                    statuses[status] += 1
                    if 400 <= status < 500:
                        err = json.loads(content)
                        ok = (err.get("type") == "error") if "messages" in route else "error" in err
                        bad_shape += not ok
                rows.append((route, statuses, bad_shape, time.perf_counter() - t0))
    print(
        "| route | bodies | 2xx (passed upstream) | 4xx (provider shape) | 5xx from the sidecar |"
    )
    print("|---|---|---|---|---|")
    for route, st, bad, _secs in rows:
        two = sum(v for k, v in st.items() if k < 300)
        four = sum(v for k, v in st.items() if 400 <= k < 500)
        five = sum(v for k, v in st.items() if k >= 500)
        print(
            f"| `{route}` | {sum(st.values()):,} | {two:,} | {four:,} ({four - bad:,} in shape) | {five} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
