"""``make demo``: measure, derive, push and enforce a ceiling on a real local model.

1. llama.cpp's server with the cached Qwen2.5-Coder-0.5B model (4k window, read from /props);
2. ``ceiling serve`` in front of it, workload ``rag`` in observe mode;
3. the sweep's plan and price (a dry run), then the sweep of the bundled ``records`` task set
   through the sidecar's bypass, one shared haystack per level so the server's prefix cache
   answers later questions cheaply;
4. the ceiling derived by the product's own rule (no ``--force``: a refusal ends the demo) and
   pushed to the running sidecar (hot reload);
5. held-out items asked as retrieval requests far above the ceiling, through the official
   ``openai`` SDK: first observed (forwarded whole), then, with the same ceiling pushed with
   ``mode: enforce``, trimmed to it; both graded by the sweep's scorer (``replay.json``, in the
   report);
6. the replayed requests, captured by the sidecar (capture on for workload rag), built into a task
   set of your own traffic, exported for labelling, and a sweep on it dry-run;
7. a summary: the curve, the ceiling, what enforcing it bought, the utilization of the replayed
   requests, the report.

Against a hosted API instead: set OPENAI_BASE_URL, OPENAI_API_KEY, CEILING_DEMO_MODEL and
CEILING_DEMO_WINDOW (no local model is started).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import yaml
from rich.console import Console

from context_ceiling.ceilings.document import dump_document, load_document
from context_ceiling.ceilings.push import push
from context_ceiling.cli import main as ceiling_cli
from context_ceiling.core.engine_tokenize import SyncEngine
from context_ceiling.core.models import UpstreamSpec
from context_ceiling.core.tokenizers import TiktokenCounter
from context_ceiling.sweep import replay as replays
from context_ceiling.sweep.prompts import ContextBuilder, Meter
from context_ceiling.sweep.replay import ReplayAnswer, ReplayRequest, outcome
from context_ceiling.sweep.report import replay_line, replay_table
from context_ceiling.sweep.statistics import items_for
from context_ceiling.sweep.taskset import TaskSet, load_taskset
from devtools.demo_sweep import DEMO
from devtools.llamacpp import die_with_parent, llama_server
from testkit.serving import free_port

ROOT = Path(__file__).resolve().parent.parent

console = Console(width=max(120, Console().width))
TOKEN = "demo-admin-token"


@contextlib.contextmanager
def upstream(ctx: int, out: Path) -> Iterator[tuple[str, str, int, str | None, str | None]]:
    """(openai base url, model, window, engine url for /tokenize, api key)."""
    hosted = os.environ.get("OPENAI_BASE_URL")
    if hosted:
        model = os.environ.get("CEILING_DEMO_MODEL")
        window = os.environ.get("CEILING_DEMO_WINDOW")
        if not model or not window:
            raise SystemExit(
                "with OPENAI_BASE_URL set, also set CEILING_DEMO_MODEL and CEILING_DEMO_WINDOW"
            )
        console.print(f"hosted upstream {hosted}, model {model}, window {int(window):,}")
        yield hosted, model, int(window), None, os.environ.get("OPENAI_API_KEY")
        return
    with llama_server(ctx, log_path=out / "llama-server.log") as llm:
        console.print(
            f"llama-server at {llm.url}; window read from /props: [bold]{llm.window:,}[/] tokens"
        )
        yield llm.openai_base_url, "qwen2.5-coder-0.5b-instruct", llm.window, llm.url, None


@contextlib.contextmanager
def sidecar(cfg: dict[str, Any], out: Path) -> Iterator[str]:
    tmp = Path(tempfile.mkdtemp(prefix="ceiling-demo-"))
    (tmp / "sidecar.yaml").write_text(yaml.safe_dump(cfg))
    log = open(out / "sidecar.log", "wb")  # noqa: SIM115
    env = os.environ | {"CEILING_ADMIN_TOKEN": TOKEN}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "context_ceiling.cli",
            "serve",
            "--config",
            str(tmp / "sidecar.yaml"),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=die_with_parent,
        cwd=ROOT,
        env=env,
    )
    url = f"http://{cfg['listen']['host']}:{cfg['listen']['port']}"
    try:
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(url + "/readyz", timeout=2).status_code == 200:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the sidecar did not start; see {out / 'sidecar.log'}")
            time.sleep(0.2)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)
        log.close()


def replay(
    url: str, model: str, ts: TaskSet, reqs: list[ReplayRequest], label: str
) -> list[ReplayAnswer]:
    """Ask the held-out requests through the sidecar (workload rag) and grade the answers."""
    client = openai.OpenAI(
        base_url=url + "/v1",
        api_key=os.environ.get("OPENAI_API_KEY") or "none",
        timeout=900,
        max_retries=0,
        default_headers={"x-ceiling-workload": "rag"},
    )
    out = []
    started = time.monotonic()
    for k, req in enumerate(reqs, 1):
        asked = time.monotonic()
        raw = client.chat.completions.with_raw_response.create(
            model=model,
            max_tokens=DEMO.max_tokens,
            temperature=0,
            seed=0,
            messages=req.messages,  # type: ignore[arg-type]
        )
        h, answer = raw.headers, raw.parse()
        choice = answer.choices[0]
        out.append(
            outcome(
                req,
                ts,
                choice.message.content,
                choice.finish_reason,
                int(h.get("x-ceiling-input-tokens", "0")),
                int(h.get("x-ceiling-trimmed-tokens", "0")),
                answer.usage.prompt_tokens if answer.usage else None,
                round(time.monotonic() - asked, 2),
            )
        )
        console.print(
            f"{label}: {k}/{len(reqs)} requests, {sum(o.correct for o in out)} correct, "
            f"{time.monotonic() - started:.0f} s"
        )
    return out


def metric(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith((name + "{", name + " ")) and all(
            f'{k}="{v}"' in line for k, v in labels.items()
        ):
            total += float(line.rsplit(" ", 1)[1])
    return total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--ctx", type=int, default=int(os.environ.get("CEILING_DEMO_CTX", str(DEMO.window)))
    )
    ap.add_argument("--out", default=str(ROOT / "out" / "demo"))
    ap.add_argument(
        "--keep", action="store_true", help="keep the servers running at the end (Ctrl-C to stop)"
    )
    ap.add_argument(
        "--reuse-sweep",
        action="store_true",
        help="skip the sweep when out/demo/sweep holds a finished one",
    )
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    run_dir = out / "sweep"
    for stale in ("capture", "traffic-taskset", "traffic-sweep"):  # step 6 starts afresh
        shutil.rmtree(out / stale, ignore_errors=True)
    reuse = args.reuse_sweep and (run_dir / "summary.json").exists()
    if run_dir.exists() and not reuse:
        shutil.rmtree(run_dir)
    started = time.monotonic()

    console.rule("[bold]1. A real model")
    with upstream(args.ctx, out) as (base_url, model, window, engine, _key):
        console.rule("[bold]2. The sidecar in front of it (workload rag: observe)")
        cfg = {
            "listen": {"host": "127.0.0.1", "port": free_port()},
            "upstreams": {
                "openai": {"base_url": base_url, "timeouts": {"read": 900, "total": 1800}}
            },
            "models": [
                {
                    "match": model,
                    "label": "demo-model",
                    "window": window,
                    "max_output_tokens": 512,
                    "tokenizer": (
                        {"kind": "upstream", "url": engine, "style": "llamacpp"}
                        if engine
                        else {"kind": "tiktoken", "encoding": "o200k_base"}
                    ),
                }
            ],
            "workloads": ["default", "rag"],
            "enforcement": {"mode": "observe", "default_output_reservation": DEMO.max_tokens},
            # every rag request into the capture store: the loop from your own traffic (step 6)
            "capture": {
                "enabled": True,
                "store": str(out / "capture" / "capture-{hostname}.sqlite"),
                "workloads": {"rag": {"sample_rate": 1.0}},
            },
        }
        with sidecar(cfg, out) as url:
            console.print(f"sidecar at {url}; metrics at {url}/metrics")

            console.rule("[bold]3. The sweep: its plan and price, then the calls")
            os.environ["CEILING_ADMIN_TOKEN"] = TOKEN
            sweep_args = [*DEMO.sweep_args(url + "/v1", model, window, run_dir), "--bypass"]
            if engine:
                sweep_args += ["--tokenize-url", engine]
            console.print(
                f"[bold]tolerance {DEMO.tolerance:.0%}[/]: wider than the 5% a production sweep "
                f"holds, to stay within about 15 minutes on two cores. For a level with no drop "
                f"to pass 80% of the time the product's sample-size rule plans "
                f"{items_for(DEMO.tolerance, DEMO.repeats)} items at {DEMO.repeats} repeat (a 5% "
                f"tolerance: {items_for(0.05, 3)} items at 3 repeats); the demo takes "
                f"{DEMO.items} of the {DEMO.taskset} task set, enough for this model's spread."
            )
            if reuse:
                console.print(f"reusing the finished sweep in {run_dir} (--reuse-sweep)")
            else:
                if ceiling_cli([*sweep_args, "--dry-run"]) != 0:
                    raise SystemExit("the sweep's plan failed")
                if ceiling_cli(sweep_args) != 0:
                    raise SystemExit("the sweep failed")

            console.rule("[bold]4. Derive the ceiling by the product's rule, push it")
            derive = ["sweep", "derive", str(run_dir), "--model", "demo-model"]
            derive += ["--workload", "rag", "--mode", "observe"]
            if ceiling_cli(derive) != 0:
                raise SystemExit(
                    "derive refused the sweep (the reasons are above): no ceiling is pushed"
                )
            doc = load_document(run_dir / "ceilings.yaml")
            for line in push(run_dir / "ceilings.yaml", [url]):
                console.print(line)
            ceiling = doc.entries[0].ceiling_tokens

            console.rule("[bold]5. What enforcing it buys: held-out requests above the ceiling")
            ts = load_taskset(DEMO.taskset)
            swept = {
                json.loads(line)["item"]
                for line in (run_dir / "calls.jsonl").read_text().splitlines()
            }
            # sized with the server's own tokenizer where it has one, so "90% of the window" is
            # what the model sees
            meter = Meter(
                TiktokenCounter("o200k_base"),
                engine=SyncEngine(UpstreamSpec(kind="upstream", url=engine, style="llamacpp"))
                if engine
                else None,
            )
            builder = ContextBuilder(ts, meter)
            reqs = replays.requests(
                ts, builder, swept, DEMO.replay, int(DEMO.replay_fill * window), seed=1
            )
            console.print(
                f"{len(reqs)} items the sweep did not use, each asked with its record ranked "
                f"first and {min(r.chunks for r in reqs) - 1}-{max(r.chunks for r in reqs) - 1} "
                f"look-alike records after it (~{int(DEMO.replay_fill * window):,} tokens; the "
                f"ceiling is {ceiling:,}): first observed, then enforced"
            )
            before = replay(url, model, ts, reqs, "observe")
            enforcing = doc.model_copy(
                update={
                    "version": doc.version + 1,
                    "entries": [e.model_copy(update={"mode": "enforce"}) for e in doc.entries],
                }
            )
            (run_dir / "ceilings-enforce.yaml").write_text(dump_document(enforcing))
            for line in push(run_dir / "ceilings-enforce.yaml", [url]):
                console.print(line)
            after = replay(url, model, ts, reqs, "enforce")
            rep = replays.write(run_dir, ceiling, before, after)
            console.print(replay_table(rep))
            console.print(replay_line(rep))
            assert all((o.server_prompt_tokens or 0) <= ceiling for o in after), (
                "an enforced request exceeded the ceiling"
            )

            console.rule("[bold]6. A task set from the captured traffic")
            traffic = out / "traffic-taskset"
            time.sleep(1.0)  # the capture writer commits off the request path
            captured = metric(
                httpx.get(url + "/metrics").text, "llm_context_captured_total", workload="rag"
            )
            console.print(f"captured {captured:.0f} rag requests into {out / 'capture'}")
            build = ["taskset", "build", "--capture", str(out / "capture"), "--out", str(traffic)]
            if ceiling_cli(build) != 0:  # too few for a 5% tolerance: it says how many more
                console.print(
                    f"(the demo's {len(reqs)} distinct questions; a week of real traffic gives "
                    "hundreds) building anyway with --min-items 3 to show the loop"
                )
                if ceiling_cli([*build, "--min-items", "3"]) != 0:
                    raise SystemExit("no task set from the captured traffic")
            ceiling_cli(["taskset", "export", str(traffic), "--out", str(out / "labels.csv")])
            ceiling_cli(
                [
                    "sweep",
                    "run",
                    "--base-url",
                    url + "/v1",
                    "--model",
                    model,
                    "--taskset",
                    str(traffic),
                    "--window",
                    str(window),
                    "--items",
                    "5",
                    "--tokenizer",
                    "o200k_base",
                    "--dry-run",
                    "--out",
                    str(out / "traffic-sweep"),
                ]
            )

            console.rule("[bold]7. Summary")
            ceiling_cli(["sweep", "report", str(run_dir)])  # the curve, with the replay in it
            console.print(replay_line(rep))
            m = httpx.get(url + "/metrics").text
            buckets = [
                (
                    float(x),
                    metric(
                        m,
                        "llm_context_utilization_ratio_bucket",
                        model="demo-model",
                        workload="rag",
                        le=x,
                    ),
                )
                for x in re.findall(
                    r'llm_context_utilization_ratio_bucket\{le="([0-9.]+)",model="demo-model",workload="rag"',
                    m,
                )
            ]
            prev, dist = 0.0, []
            for le, cum in buckets:
                if cum - prev:
                    dist.append(f"<= {le:g}: {int(cum - prev)}")
                prev = cum
            console.print("utilization of the replayed requests (forwarded): " + ", ".join(dist))
            console.print(f"report: {run_dir / 'report.html'}  plot: {run_dir / 'curve.png'}")
            console.print(f"metrics: {url}/metrics   logs: {out / 'sidecar.log'}")
            console.print(f"[bold green]demo finished[/] in {time.monotonic() - started:.0f} s")
            if args.keep:
                console.print("servers kept running; Ctrl-C to stop")
                with contextlib.suppress(KeyboardInterrupt):
                    while True:
                        time.sleep(3600)
    return 0


if __name__ == "__main__":
    sys.exit(main())
