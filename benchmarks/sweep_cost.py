"""What batch mode and the prompt cache save, measured on provider doubles.

The real ``ceiling sweep run`` command sweeps the same items four ways against the scripted
model double (a stand-in for a hosted provider that implements OpenAI's and Anthropic's batch
APIs and prompt caches as their documentation gives them): synchronous calls with a haystack per
item (the baseline), synchronous calls on shared haystacks (the cache), batch calls with a
haystack per item, and batch calls on shared haystacks. Each run's dollars come from its own call
log (``summary.json``'s ``spend``: input, cached and cache-written tokens as the double reported
them, at the list or batch rates of the genai-prices data set). Ratios are against the baseline
of the same provider in the same run.

``python -m benchmarks.sweep_cost [--items N] [--window W]``
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import tempfile
from pathlib import Path
from typing import Any

from context_ceiling.cli import main as cli_main
from context_ceiling.core.prices import lookup
from context_ceiling.sweep.taskset import load_taskset
from testkit.doubles.scripted_model import ScriptedModelDouble
from testkit.serving import serve

MODES = {
    "synchronous, a haystack per item": (),
    "synchronous, shared haystacks (cache)": ("--shared-haystack",),
    "batch, a haystack per item": ("--batch",),
    "batch, shared haystacks (batch + cache)": ("--batch", "--shared-haystack"),
}
PROVIDERS = {"openai": "gpt-4.1", "anthropic": "claude-sonnet-4-5"}


def sweep(
    url: str, api: str, model: str, out: Path, items: int, window: int, extra: tuple[str, ...]
) -> dict[str, Any]:
    base = url + "/v1" if api == "openai" else url
    args = [
        "sweep", "run", "--base-url", base, "--api", api, "--model", model,
        "--window", str(window), "--tokenizer", "o200k_base", "--items", str(items),
        "--levels", "0.2,0.5,0.8", "--repeats", "1", "--no-refine", "--no-control",
        "--low-fill", "0", "--batch-poll", "0.01", "--no-progress", "--out", str(out), *extra,
    ]  # fmt: skip
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        code = cli_main(args)
    assert code == 0, f"sweep failed: {args}"
    spend: dict[str, Any] = json.loads((out / "summary.json").read_text())["spend"]
    batch = "--batch" in extra
    price = lookup(model, batch=batch)
    assert price is not None
    spend["usd"] = price.cost(
        spend["input_tokens"],
        spend["output_tokens"],
        spend["cached_tokens"],
        spend["cache_write_tokens"],
    )
    return spend


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--items", type=int, default=40)
    ap.add_argument("--window", type=int, default=32768)
    args = ap.parse_args(argv)
    ts = load_taskset("contracts")
    rows: list[tuple[str, str, str, dict[str, Any], float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for api, model in PROVIDERS.items():
            base_usd = None
            for name, extra in MODES.items():
                d = ScriptedModelDouble(ts, args.window, knee=0.6)
                with serve(d.app()) as url:
                    out = Path(tmp) / f"{api}-{len(rows)}"
                    s = sweep(url, api, model, out, args.items, args.window, extra)
                base_usd = base_usd if base_usd is not None else s["usd"]
                rows.append((api, model, name, s, s["usd"] / base_usd if base_usd else 0.0))
    print(
        "| provider (double) | priced as | mode | calls | input tokens | read from cache | written to cache | $ | cost / synchronous per-item |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for api, model, name, s, ratio in rows:
        share = s["cached_tokens"] / s["input_tokens"] if s["input_tokens"] else 0.0
        print(
            f"| {api} | {model} | {name} | {s['calls']:,} | {s['input_tokens']:,} | {share:.0%} | "
            f"{s['cache_write_tokens']:,} | ${s['usd']:.2f} | {ratio:.2f} |"
        )
    print(f"\n({args.items} items, window {args.window:,}, levels 0.2/0.5/0.8, one repeat)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
