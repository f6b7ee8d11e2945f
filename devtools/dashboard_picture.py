"""The picture of the dashboard in the docs, drawn from a live Prometheus.

``python -m devtools.dashboard_picture [--minutes 4] [--out docs/dashboard-panels.png]`` runs a
real sidecar (workload ``rag`` enforcing a 3,000-token ceiling of an 8,000-token window,
``default`` observing it) in front of the answer double (a stand-in for a hosted provider whose
answers fail more often the fuller the window), a real Prometheus scraping it every second with
the generated rules, and traffic that grows toward and past the ceiling; then draws every panel
with ``dashboards.render``. Needs the ``prometheus`` binary (``make tools``).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import yaml
from starlette.requests import Request
from starlette.responses import Response

from context_ceiling.sidecar.app import create_app
from context_ceiling.sidecar.config import Settings
from dashboards.render import render
from testkit.doubles.answer_provider import AnswerProviderDouble, Script
from testkit.serving import free_port, serve
from testkit.traffic.ceiling_docs import doc, entry

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "picture-admin-token"
WINDOW = 8000
CEILING = 3000
CLAUSE = "Clause {i}: the renewal fee of contract K-{i} is {f} EUR, notice {n} days. "


class KneeDouble(AnswerProviderDouble):
    """Reports the input it received (about 4 bytes a token) and answers worse past a knee."""

    rng = random.Random(7)

    async def chat(self, request: Request) -> Response:
        body = await request.body()
        self.prompt_tokens = len(body) // 4
        fill = self.prompt_tokens / WINDOW
        fail = 0.03 if fill < 0.4 else min(0.6, 0.03 + (fill - 0.4) * 1.1)
        wants_json = b'"response_format"' in body
        if self.rng.random() >= fail:
            self.script = Script(text='{"fee": 103}' if wants_json else "The fee is 103 EUR.")
        else:
            self.script = self.rng.choice(
                [
                    Script(text="The fee is", stop="truncated"),
                    Script(text="I will check the records. " * 20, stop="truncated"),
                    Script(text="The fee is 103 EUR." if wants_json else ""),
                ]
            )
        return await super().chat(request)


def _messages(tokens: int) -> list[dict[str, Any]]:
    n = max(1, tokens // 20)
    docs = "\n".join(
        f'<document id="{i}">' + CLAUSE.format(i=i, f=100 + i, n=30 + i) + "</document>"
        for i in range(n)
    )
    return [
        {"role": "system", "content": "Answer from the documents."},
        {"role": "user", "content": docs + "\nWhat is the renewal fee of contract K-3?"},
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m devtools.dashboard_picture")
    ap.add_argument("--minutes", type=float, default=4.0)
    ap.add_argument("--out", default=str(ROOT / "docs" / "dashboard-panels.png"))
    args = ap.parse_args(argv)
    binary = shutil.which("prometheus")
    if binary is None:
        raise SystemExit("prometheus is not installed (make tools)")
    work = Path(tempfile.mkdtemp(prefix="ceiling-picture-"))
    double = KneeDouble()
    with serve(double.app()) as durl:
        cfg: dict[str, Any] = {
            "upstreams": {"openai": {"base_url": durl + "/v1"}},
            "models": [{"match": "gpt-4o", "window": WINDOW, "max_output_tokens": 512}],
            "workloads": ["default", "rag"],
            "admin_token": TOKEN,
            "enforcement": {
                "mode": "observe",
                "default_output_reservation": 256,
                "workloads": {"rag": {"mode": "enforce"}},
            },
        }
        with serve(create_app(Settings(**cfg))) as url:
            entries = [
                entry(model="gpt-4o", workload=w, window=WINDOW, tokens=CEILING)
                for w in ("default", "rag")
            ]
            r = httpx.put(
                url + "/admin/ceilings",
                json=doc(1, *entries),
                headers={"authorization": f"Bearer {TOKEN}"},
            )
            r.raise_for_status()
            rules = []
            for name in ("rules.yaml", "rules-opt-in.yaml"):
                data = yaml.safe_load((ROOT / "dashboards" / "generated" / name).read_text())
                for g in data["groups"]:
                    g["interval"] = "1s"
                (work / name).write_text(yaml.safe_dump(data))
                rules.append(str(work / name))
            (work / "prometheus.yml").write_text(
                yaml.safe_dump(
                    {
                        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                        "rule_files": rules,
                        "scrape_configs": [
                            {
                                "job_name": "context-ceiling",
                                "static_configs": [{"targets": [url.removeprefix("http://")]}],
                            }
                        ],
                    }
                )
            )
            port = free_port()
            prom = subprocess.Popen(
                [
                    binary,
                    f"--config.file={work / 'prometheus.yml'}",
                    f"--storage.tsdb.path={work / 'data'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            prom_url = f"http://127.0.0.1:{port}"
            try:
                _traffic(url, args.minutes)
                time.sleep(3)  # the last scrape and rule evaluation
                drawn = render(prom_url, args.out, args.minutes)
            finally:
                prom.terminate()
                prom.wait(15)
    print(json.dumps({"out": args.out, "series": drawn}))
    return 0


def _traffic(url: str, minutes: float) -> None:
    """Requests growing from a tenth of the window to past it, both workloads, some asking
    for JSON, until ``minutes`` have passed."""
    rng = random.Random(11)
    started = time.monotonic()
    with httpx.Client(timeout=30) as c:
        while (elapsed := time.monotonic() - started) < minutes * 60:
            grow = elapsed / (minutes * 60)
            tokens = int(WINDOW * rng.uniform(0.1, 0.3 + 0.65 * grow))
            body: dict[str, Any] = {
                "model": "gpt-4o",
                "messages": _messages(tokens),
                "max_tokens": 200,
            }
            if rng.random() < 0.3:
                body["response_format"] = {"type": "json_object"}
            workload = rng.choice(["default", "rag"])
            c.post(
                url + "/v1/chat/completions",
                json=body,
                headers={"x-ceiling-workload": workload, "authorization": "Bearer k"},
            )
            time.sleep(0.05)


if __name__ == "__main__":
    raise SystemExit(main())
