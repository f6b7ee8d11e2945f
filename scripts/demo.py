"""``make demo``: the sidecar measuring a real local model, end to end.

Starts llama.cpp's server with the cached Qwen2.5-Coder-0.5B model (8k window, read from the
server), starts ``ceiling serve`` in front of it, replays requests of growing size through the
official ``openai`` SDK and prints what the sidecar measured for each: input tokens, window
utilization, the component breakdown and the server's own count. The sweep, the derived ceiling,
the push and enforcement join this demo as their issues land.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import openai
import yaml
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ceiling.llamacpp import free_port, llama_server  # noqa: E402

console = Console(width=max(110, Console().width))

RECORD = (
    "Record {i}: service contract {code} between Northwind Ltd and client {client} renews on "
    "day {day} of the year; the renewal fee is {fee} EUR and the notice period is {notice} days."
)


def haystack(n: int) -> list[str]:
    docs = []
    for i in range(n):
        docs.append(
            f'<document id="r{i}">'
            + RECORD.format(
                i=i,
                code=f"C-{1000 + 37 * i % 9000}",
                client=f"K{(i * 7919) % 997:03d}",
                day=(i * 53) % 365 + 1,
                fee=100 + (i * 13) % 900,
                notice=30 + (i * 11) % 90,
            )
            + "</document>"
        )
    return docs


def wait_ready(url: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/readyz", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise SystemExit("the sidecar did not become ready")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ctx", type=int, default=int(os.environ.get("CEILING_DEMO_CTX", "8192")))
    ap.add_argument("--out", default=str(ROOT / "out" / "demo"))
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    console.rule("[bold]1. A real local model")
    with llama_server(args.ctx, log_path=out / "llama-server.log") as llm:
        console.print(
            f"llama-server at {llm.url}, window read from /props: [bold]{llm.window}[/] tokens"
        )

        console.rule("[bold]2. The sidecar in front of it")
        port = free_port()
        cfg = {
            "listen": {"host": "127.0.0.1", "port": port},
            "upstreams": {
                "openai": {"base_url": llm.openai_base_url, "timeouts": {"read": 600, "total": 900}}
            },
            "models": [
                {
                    "match": "qwen2.5-coder-0.5b-instruct",
                    "label": "qwen2.5-0.5b",
                    "window": llm.window,
                    "max_output_tokens": 512,
                    "tokenizer": {"kind": "upstream", "url": llm.url, "style": "llamacpp"},
                    "chat_format": {"per_message": 5, "reply_priming": 3, "default_system": 20},
                }
            ],
            "workloads": ["default", "rag"],
        }
        tmp = Path(tempfile.mkdtemp(prefix="ceiling-demo-"))
        (tmp / "sidecar.yaml").write_text(yaml.safe_dump(cfg))
        log = open(out / "sidecar.log", "wb")  # noqa: SIM115
        sidecar = subprocess.Popen(
            [sys.executable, "-m", "ceiling.cli", "serve", "--config", str(tmp / "sidecar.yaml")],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=ROOT,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            wait_ready(url)
            console.print(f"sidecar at {url} (metrics at {url}/metrics)")

            console.rule("[bold]3. Requests of growing size through the openai SDK")
            client = openai.OpenAI(
                base_url=url + "/v1", api_key="no-key-needed", timeout=900, max_retries=0
            )
            docs = haystack(400)
            per_doc = 64  # rough tokens per record, refined by the sidecar's own count below
            table = Table(
                "target fill",
                "input tokens (sidecar)",
                "server prompt_tokens",
                "utilization",
                "retrieved",
                "latency s",
                "answer",
            )
            for fill in (0.1, 0.3, 0.5, 0.7, 0.85):
                k = max(1, int(fill * llm.window / per_doc))
                context = "\n".join(docs[:k])
                t0 = time.perf_counter()
                raw = client.chat.completions.with_raw_response.create(
                    model="qwen2.5-coder-0.5b-instruct",
                    messages=[
                        {
                            "role": "system",
                            "content": "Answer from the records. Reply with the fee only.",
                        },
                        {
                            "role": "user",
                            "content": context
                            + "\n\nWhat is the renewal fee of the contract in Record 0?",
                        },
                    ],
                    max_tokens=12,
                    temperature=0,
                    extra_headers={"X-Ceiling-Workload": "rag"},
                )
                dt = time.perf_counter() - t0
                resp = raw.parse()
                usage = resp.usage
                table.add_row(
                    f"{fill:.0%}",
                    raw.headers.get("x-ceiling-input-tokens", "?"),
                    str(usage.prompt_tokens if usage else "?"),
                    raw.headers.get("x-ceiling-utilization", "?"),
                    str(k),
                    f"{dt:.1f}",
                    (resp.choices[0].message.content or "").strip()[:20],
                )
            console.print(table)

            console.rule("[bold]4. What the sidecar recorded")
            lines = [
                json.loads(x)
                for x in (out / "sidecar.log").read_text().splitlines()
                if '"request_id"' in x
            ]
            if lines:
                last = lines[-1]
                console.print("last request's log line (no prompt text, no keys):")
                console.print_json(json.dumps(last))
            metrics = httpx.get(url + "/metrics").text
            keep = [
                m
                for m in metrics.splitlines()
                if m.startswith(
                    ("llm_context_utilization_ratio_bucket", "llm_context_requests_total")
                )
            ]
            console.print("\n".join(keep[:20]))
            console.print(f"\nlogs: {out}/sidecar.log  llama-server log: {out}/llama-server.log")
        finally:
            os.killpg(sidecar.pid, signal.SIGTERM)
            sidecar.wait(timeout=15)
            log.close()
    console.rule("[bold green]demo finished")
    return 0


if __name__ == "__main__":
    sys.exit(main())
