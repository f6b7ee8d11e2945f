"""Malformed-but-parseable bodies against a running sidecar: how many get a 5xx from it?

Each body is a valid request of one API (``tests/fuzz_bodies.py``: every field the sidecar
reads) with one value replaced by another JSON value (any type, nested up to 300 deep), sent
streamed and not to a sidecar in front of a loopback provider double that accepts anything.
Target (issue 15): 0 sidecar-generated 5xx in 10,000 bodies per route, every 4xx in the
provider's shape.

``python benchmarks/fuzz.py [--n 10000] [--seed 1]``
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import Counter
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from context_ceiling.sidecar.app import create_app  # noqa: E402
from context_ceiling.sidecar.config import Settings  # noqa: E402
from tests.fault_provider_double import FaultyProviderDouble  # noqa: E402
from tests.fuzz_bodies import ANTHROPIC_TEMPLATE, OPENAI_TEMPLATE, mutate, paths, random_json  # noqa: E402
from tests.hosted_provider_double import serve  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=10000, help="bodies per route")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)
    rows = []
    with serve(FaultyProviderDouble()) as durl:
        app = create_app(
            Settings(
                upstreams={"openai": {"base_url": durl + "/v1"}, "anthropic": {"base_url": durl}},
                models=[
                    {"match": "gpt-4o", "window": 128000},
                    {"match": "claude-*", "window": 200000},
                ],
                log_level="warning",
            )
        )
        with serve(app) as url, httpx.Client(timeout=30) as client:
            for route, template in (
                ("/v1/chat/completions", OPENAI_TEMPLATE),
                ("/v1/messages", ANTHROPIC_TEMPLATE),
            ):
                statuses: Counter[int] = Counter()
                bad_shape = 0
                t0 = time.perf_counter()
                all_paths = paths(template)
                for _ in range(args.n):
                    body = mutate(
                        template | {"stream": rng.random() < 0.5},
                        rng.choice(all_paths),
                        random_json(rng),
                    )
                    r = client.post(
                        url + route,
                        content=json.dumps(body).encode(),
                        headers={"anthropic-version": "2023-06-01"},
                    )
                    statuses[r.status_code] += 1
                    if 400 <= r.status_code < 500:
                        err = r.json()
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
