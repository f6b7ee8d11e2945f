"""``make demo``: measure, derive, push, enforce, observe, on a real local model.

1. llama.cpp's server with the cached Qwen2.5-Coder-0.5B model (8k window, read from /props);
2. ``ceiling serve`` in front of it, workload ``rag`` in observe mode;
3. a reduced sweep of the bundled contracts task set through the sidecar's bypass, one shared
   haystack per level so the server's prefix cache answers later questions cheaply;
4. the ceiling derived from the curve and pushed to the running sidecar (hot reload);
5. requests of mixed sizes through the official ``openai`` SDK, with the ceiling observed,
   then the same ceiling pushed again with ``mode: enforce`` and the requests replayed;
6. the replayed requests, captured by the sidecar (capture on for workload rag), built into a task
   set of your own traffic, exported for labelling, and a sweep on it dry-run;
7. a summary: the curve, the ceiling, the utilization distribution, what was trimmed.

Against a hosted API instead: set OPENAI_BASE_URL, OPENAI_API_KEY, CEILING_DEMO_MODEL and
CEILING_DEMO_WINDOW (no local model is started).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
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
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from context_ceiling.cli import main as ceiling_cli  # noqa: E402
from context_ceiling.core.ceilings import dump_document, load_document  # noqa: E402
from context_ceiling.core.push import push  # noqa: E402
from devtools.llamacpp import die_with_parent, free_port, llama_server  # noqa: E402

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


def replay(url: str, model: str, window: int, n: int, label: str) -> list[dict[str, Any]]:
    """A mixed sample of RAG requests: some small, some far above the ceiling."""
    client = openai.OpenAI(
        base_url=url + "/v1",
        api_key=os.environ.get("OPENAI_API_KEY") or "none",
        timeout=900,
        max_retries=0,
        default_headers={"x-ceiling-workload": "rag"},
    )
    docs = [
        json.loads(x)
        for x in (
            ROOT / "src" / "context_ceiling" / "sweep" / "tasksets" / "contracts" / "corpus.jsonl"
        )
        .read_text()
        .splitlines()
    ]
    rows = []
    fills = [0.1, 0.25, 0.45, 0.6, 0.8][:n]
    for k, fill in enumerate(fills):
        count = max(2, int(fill * window / 95))
        chunk = "\n".join(
            # each request extends the previous one's documents: the prefix cache reuses them
            f'<document id="{d["id"]}">{d["text"]}</document>'
            for d in docs[:count]
        )
        t0 = time.perf_counter()
        raw = client.chat.completions.with_raw_response.create(
            model=model,
            max_tokens=24,
            temperature=0,
            messages=[
                {"role": "system", "content": "Answer from the documents, briefly."},
                {
                    "role": "user",
                    "content": chunk + f"\nWhat is the renewal fee in {docs[k]['id']}?",
                },
            ],
        )
        h = raw.headers
        usage = raw.parse().usage
        rows.append(
            {
                "phase": label,
                "documents": count,
                "mode": h.get("x-ceiling-mode"),
                "input": int(h.get("x-ceiling-input-tokens", "0")),
                "trimmed": int(h.get("x-ceiling-trimmed-tokens", "0")),
                "server": usage.prompt_tokens if usage else None,
                "utilization": float(h.get("x-ceiling-utilization", "0")),
                "seconds": round(time.perf_counter() - t0, 1),
            }
        )
    return rows


def metric(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith((name + "{", name + " ")) and all(
            f'{k}="{v}"' in line for k, v in labels.items()
        ):
            total += float(line.rsplit(" ", 1)[1])
    return total


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ctx", type=int, default=int(os.environ.get("CEILING_DEMO_CTX", "8192")))
    ap.add_argument("--items", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--levels", default="0.2,0.5,0.8")
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
    import shutil as _shutil

    for stale in ("capture", "traffic-taskset", "traffic-sweep"):  # step 6 starts afresh
        _shutil.rmtree(out / stale, ignore_errors=True)
    reuse = args.reuse_sweep and (run_dir / "summary.json").exists()
    if run_dir.exists() and not reuse:
        import shutil

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
            "enforcement": {"mode": "observe", "default_output_reservation": 64},
            # every rag request into the capture store: the loop from your own traffic (step 6)
            "capture": {
                "enabled": True,
                "store": str(out / "capture" / "capture-{hostname}.sqlite"),
                "workloads": {"rag": {"sample_rate": 1.0}},
            },
        }
        with sidecar(cfg, out) as url:
            console.print(f"sidecar at {url}; metrics at {url}/metrics")

            console.rule("[bold]3. A reduced sweep through the sidecar's bypass (shared haystack)")
            os.environ["CEILING_ADMIN_TOKEN"] = TOKEN
            sweep_args = [
                "sweep",
                "run",
                "--base-url",
                url + "/v1",
                "--model",
                model,
                "--items",
                str(args.items),
                "--max-tokens",
                "64",
                "--levels",
                args.levels,
                "--repeats",
                str(args.repeats),
                "--shared-haystack",
                "--bypass",
                "--window",
                str(window),
                # the demo's budget: its levels, no low-fill control, no refinement or added items
                "--low-fill",
                "0",
                "--no-refine",
                "--no-adaptive",
                "--out",
                str(run_dir),
            ]
            if engine:
                sweep_args += ["--tokenize-url", engine]
            if reuse:
                console.print(f"reusing the finished sweep in {run_dir} (--reuse-sweep)")
            elif ceiling_cli(sweep_args) != 0:
                raise SystemExit("the sweep failed")

            console.rule("[bold]4. Derive the ceiling and push it to the running sidecar")
            derive = ["sweep", "derive", str(run_dir), "--model", "demo-model"]
            derive += ["--workload", "rag", "--mode", "observe"]
            if ceiling_cli(derive) != 0:
                console.print(
                    f"[bold yellow]no usable ceiling[/]: {args.items} items are far fewer than a 5% "
                    "tolerance needs (about 230; a full sweep plans them itself), and this 0.5B "
                    "model is weak. The demo writes the number anyway to show the loop "
                    "(--force: the provenance records every refusal). Never enforce a number "
                    "like this one."
                )
                if ceiling_cli([*derive, "--force"]) != 0:
                    raise SystemExit("no ceiling: the model failed even the reference level")
            doc = load_document(run_dir / "ceilings.yaml")
            for line in push(run_dir / "ceilings.yaml", [url]):
                console.print(line)
            ceiling = doc.entries[0].ceiling_tokens

            console.rule(
                "[bold]5. Mixed requests: observed, then enforced (same ceiling, pushed with mode: enforce)"
            )
            rows = replay(url, model, window, 5, "observe")
            enforcing = doc.model_copy(
                update={
                    "version": doc.version + 1,
                    "entries": [e.model_copy(update={"mode": "enforce"}) for e in doc.entries],
                }
            )
            (run_dir / "ceilings-enforce.yaml").write_text(dump_document(enforcing))
            for line in push(run_dir / "ceilings-enforce.yaml", [url]):
                console.print(line)
            rows += replay(url, model, window, 5, "enforce")
            t = Table(
                "phase",
                "documents",
                "mode",
                "input tokens",
                "trimmed",
                "server prompt_tokens",
                "utilization",
                "seconds",
            )
            for r in rows:
                t.add_row(
                    r["phase"],
                    str(r["documents"]),
                    r["mode"],
                    f"{r['input']:,}",
                    f"{r['trimmed']:,}",
                    f"{r['server']:,}" if r["server"] else "?",
                    f"{r['utilization']:.2f}",
                    str(r["seconds"]),
                )
            console.print(t)

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
                    "(a demo's five distinct questions; a week of real traffic gives hundreds) "
                    "building anyway with --min-items 3 to show the loop"
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
            summary = json.loads((run_dir / "summary.json").read_text())["analysis"]
            from context_ceiling.sweep.analysis import Analysis, LevelStats
            from context_ceiling.sweep.report import ceiling_line, table

            a = Analysis(
                **{k: v for k, v in summary.items() if k != "levels"},
                levels=[
                    LevelStats(**{**s, "ci": tuple(s["ci"]), "diff_ci": tuple(s["diff_ci"])})
                    for s in summary["levels"]
                ],
            )
            console.print(table(a))
            lvl = next(s for s in a.levels if s.level == a.ceiling_level)
            console.print(
                f"{ceiling_line(a)}\n  measured at level {lvl.level:g}: accuracy {lvl.accuracy:.0%} "
                f"(95% CI {lvl.ci[0]:.0%}-{lvl.ci[1]:.0%}); ceiling = {ceiling:,} tokens"
            )
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
            trimmed = {
                k: int(
                    metric(
                        m,
                        "llm_context_trimmed_tokens_total",
                        model="demo-model",
                        workload="rag",
                        kind=k,
                    )
                )
                for k in ("tool_results", "retrieved", "history")
            }
            over = {
                a_: int(
                    metric(
                        m,
                        "llm_context_over_ceiling_total",
                        model="demo-model",
                        workload="rag",
                        action=a_,
                    )
                )
                for a_ in ("observed", "trimmed", "rejected")
            }
            console.print(f"over the ceiling: {over}; tokens trimmed by kind: {trimmed}")
            enforced = [r for r in rows if r["phase"] == "enforce"]
            assert all((r["server"] or 0) <= ceiling for r in enforced), (
                "an enforced request exceeded the ceiling"
            )
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
