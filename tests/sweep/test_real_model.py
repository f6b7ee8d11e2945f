"""Token counts against a real model server: llama.cpp serving Qwen2.5-Coder-0.5B (2k window).

The sidecar's exact mode (the engine's own tokenizer) must match the server's reported usage;
a mismatched encoding must show up in the estimate-error metric.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from context_ceiling.sidecar.app import create_app
from context_ceiling.sidecar.config import Settings
from devtools.llamacpp import RunningServer, llama_server
from testkit import REPO
from testkit.serving import serve

#: these tests share one server, on one worker (make test runs the suite on two); the demo's
#: sweep, the longest test, has a group and a server of its own
pytestmark = [pytest.mark.real_model, pytest.mark.slow, pytest.mark.xdist_group("real_model")]


WORDS = [
    "contract",
    "renewal",
    "fee",
    "notice",
    "period",
    "clause",
    "Northwind",
    "2027",
    "EUR",
    "90",
    "days",
    "Kündigung",
    "—",
    "服务",
    "合同",
    "🚀",
    "<tag",
    "attr='x'>value</tag>",
    "def",
    "f(x):",
    "return",
    "x**2\n",
]


@pytest.fixture(scope="module")
def llm() -> Iterator[RunningServer]:
    with llama_server(2048) as server:
        yield server


@pytest.fixture(scope="module")
def sidecar_url(llm: RunningServer) -> Iterator[tuple[str, Any]]:
    settings = Settings(
        upstreams={
            "openai": {"base_url": llm.openai_base_url, "timeouts": {"read": 120, "total": 300}}
        },
        models=[
            {
                "match": "qwen-exact",
                "window": llm.window,
                "max_output_tokens": 64,
                "tokenizer": {"kind": "upstream", "url": llm.url, "style": "llamacpp"},
            },
            {
                "match": "qwen-o200k",
                "window": llm.window,
                "max_output_tokens": 64,
                "tokenizer": {"kind": "tiktoken", "encoding": "o200k_base"},
            },
        ],
    )
    app = create_app(settings)
    with serve(app) as url:
        yield url, app.state.sidecar


def conversation(i: int) -> list[dict[str, str]]:
    text = " ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(40 + 90 * i))
    msgs = [
        {"role": "user", "content": text},
        {"role": "assistant", "content": "Noted."},
        {"role": "user", "content": f"Question {i}: which clause?"},
    ]
    return ([{"role": "system", "content": "Answer from the text."}] if i % 2 else []) + msgs


def test_exact_counts_match_the_server_and_mismatch_shows(sidecar_url: tuple[str, Any]) -> None:
    url, state = sidecar_url
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=300)
    errors: list[float] = []
    for i in range(5):
        msgs = conversation(i)
        exact = client.chat.completions.with_raw_response.create(
            model="qwen-exact",
            messages=msgs,  # type: ignore[arg-type]
            max_tokens=1,
        )
        reported = exact.parse().usage
        assert reported is not None
        assert int(exact.headers["x-ceiling-input-tokens"]) == reported.prompt_tokens
        est = client.chat.completions.with_raw_response.create(
            model="qwen-o200k",
            messages=msgs,  # type: ignore[arg-type]
            max_tokens=1,
        )
        usage = est.parse().usage
        assert usage is not None
        errors.append(
            (int(est.headers["x-ceiling-input-tokens"]) - usage.prompt_tokens) / usage.prompt_tokens
        )
    reg = state.metrics.registry
    assert (
        reg.get_sample_value(
            "llm_context_token_estimate_error_ratio_count", {"model": "qwen-exact"}
        )
        == 5
    )
    # the exact counter's error is 0 on every request: all in the le=0.0 bucket and none below
    assert (
        reg.get_sample_value(
            "llm_context_token_estimate_error_ratio_bucket", {"model": "qwen-exact", "le": "0.0"}
        )
        == 5
    )
    assert (
        reg.get_sample_value(
            "llm_context_token_estimate_error_ratio_bucket", {"model": "qwen-exact", "le": "-0.01"}
        )
        == 0
    )
    # the mismatched encoding is off, and the metric shows it (outside the +-1% band)
    inside = (
        reg.get_sample_value(
            "llm_context_token_estimate_error_ratio_bucket", {"model": "qwen-o200k", "le": "0.01"}
        )
        or 0
    ) - (
        reg.get_sample_value(
            "llm_context_token_estimate_error_ratio_bucket", {"model": "qwen-o200k", "le": "-0.01"}
        )
        or 0
    )
    assert inside < 5
    assert max(abs(e) for e in errors) > 0.01
    print(
        "o200k_base vs Qwen tokenizer, relative error per request:", [round(e, 3) for e in errors]
    )


def test_sweep_derive_push_enforce_on_the_real_model(
    llm: RunningServer, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The whole loop on the real model: a small sweep through the sidecar's bypass, a derived
    ceiling pushed to the running sidecar, and enforced requests that fit it. Asserts the
    pipeline's contracts, not the model's accuracy."""
    from context_ceiling.ceilings.document import load_document
    from context_ceiling.ceilings.push import push
    from context_ceiling.cli import main as cli_main

    token = "e2e-admin-token"
    monkeypatch.setenv("CEILING_ADMIN_TOKEN", token)
    settings = Settings(
        upstreams={
            "openai": {"base_url": llm.openai_base_url, "timeouts": {"read": 300, "total": 600}}
        },
        models=[
            {
                "match": "qwen",
                "window": llm.window,
                "max_output_tokens": 256,
                "tokenizer": {"kind": "upstream", "url": llm.url, "style": "llamacpp"},
            }
        ],
        workloads=["default", "rag"],
        admin_token=token,
        enforcement={
            "mode": "observe",
            "workloads": {"rag": {"mode": "enforce"}},
            "default_output_reservation": 64,
        },
    )
    app = create_app(settings)
    with serve(app) as url:
        out = tmp_path / "run"
        code = cli_main(
            [
                "sweep",
                "run",
                "--base-url",
                url + "/v1",
                "--model",
                "qwen",
                "--items",
                "4",
                "--levels",
                "0.3,0.6,0.9",
                "--repeats",
                "2",
                "--shared-haystack",
                "--bypass",
                "--window",
                str(llm.window),
                "--tokenizer",
                "engine",
                "--out",
                str(out),
                "--no-progress",
            ]
        )
        # --tokenizer engine needs the engine's own /tokenize: the sidecar is not it
        assert code == 2
        code = cli_main(
            [
                "sweep",
                "run",
                "--base-url",
                url + "/v1",
                "--model",
                "qwen",
                "--items",
                "4",
                "--levels",
                "0.3,0.6,0.9",
                "--repeats",
                "2",
                "--shared-haystack",
                "--bypass",
                "--window",
                str(llm.window),
                "--tokenize-url",
                llm.url,
                "--max-tokens",
                "24",  # the answer is a number: a long one only costs the model's time
                "--low-fill",
                "0",
                "--no-refine",
                "--no-adaptive",
                "--out",
                str(out),
                "--no-progress",
            ]
        )
        assert code == 0
        summary = json.loads((out / "summary.json").read_text())["analysis"]
        assert summary["errors"] == 0
        assert [round(s["level"], 2) for s in summary["levels"]] == [0.3, 0.6, 0.9]
        assert all(s["n_calls"] == 8 and s["n_items"] == 4 for s in summary["levels"])
        state = app.state.sidecar
        # the sweep went through the bypass: never trimmed, even in an enforcing sidecar
        assert (
            state.metrics.registry.get_sample_value(
                "llm_context_requests_total",
                {"model": "qwen", "workload": "default", "api": "openai_chat", "outcome": "ok"},
            )
            == 4 + 24
        )
        # four items cannot resolve a 0.05 tolerance: derive refuses and writes nothing
        derive = ["sweep", "derive", str(out), "--model", "qwen", "--workload", "rag"]
        assert cli_main(derive) == 1 and not (out / "ceilings.yaml").exists()
        refusals = summary["refusals"]
        assert any(r.startswith("unresolved") for r in refusals)
        others = [r for r in refusals if not r.startswith("unresolved") and "floor" not in r]
        if summary["ceiling_tokens"] is None or others:
            return  # this small model failed the reference or its control on this run: refused
        # the pipeline's contract from here on: accepted explicitly, recorded in the provenance
        assert cli_main([*derive, "--accept-unresolved", "--min-accuracy", "0"]) == 0
        doc = load_document(out / "ceilings.yaml")
        ceiling = doc.entries[0].ceiling_tokens
        assert 0 < ceiling < llm.window
        push(out / "ceilings.yaml", [url])
        assert state.ceilings.current.version == doc.version
        client = openai.OpenAI(
            base_url=url + "/v1",
            api_key="none",
            max_retries=0,
            timeout=300,
            default_headers={"x-ceiling-workload": "rag"},
        )
        docs = "\n".join(
            f'<document id="{i}">Contract K-{i} renews yearly for {100 + i} EUR; notice {30 + i} days.</document>'
            for i in range(80)
        )
        raw = client.chat.completions.with_raw_response.create(
            model="qwen",
            max_tokens=8,
            messages=[{"role": "user", "content": docs + "\nWhat does K-3 cost?"}],
        )
        usage = raw.parse().usage
        assert usage is not None
        assert int(raw.headers["x-ceiling-trimmed-tokens"]) > 0
        assert usage.prompt_tokens <= ceiling, (
            "the enforced request fits the ceiling, by the server's own count"
        )


def test_the_server_never_outlives_its_parent(tmp_path: Any) -> None:
    """A demo or test killed with SIGKILL must not leave llama-server running."""
    import os
    import signal
    import subprocess
    import sys
    import time

    script = tmp_path / "parent.py"
    script.write_text(
        "import time\nfrom devtools.llamacpp import llama_server\n"
        "with llama_server(512) as s:\n    print(s.process.pid, flush=True)\n    time.sleep(600)\n"
    )
    parent = subprocess.Popen(
        [sys.executable, str(script)],
        stdout=subprocess.PIPE,
        text=True,
        env=os.environ | {"PYTHONPATH": str(REPO)},
    )
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.kill(child, signal.SIGKILL)
    raise AssertionError("llama-server outlived its parent")


@pytest.mark.xdist_group("demo")
def test_the_demo_sweep_is_accepted_without_force(tmp_path: Path) -> None:
    """``make demo``'s sweep, as it runs (its task set, window, levels, items, tolerance), on the
    real model: ``derive`` accepts it by the product's own rule, with no ``--force``. Fails the
    day the demo would end in a number it says not to enforce."""
    from context_ceiling.ceilings.document import load_document
    from context_ceiling.cli import main as cli_main
    from devtools.demo_sweep import DEMO

    run = tmp_path / "sweep"
    # the suite's longest test, on its own worker: ahead of the others for the cores, so the
    # suite ends when the rest of it does
    with llama_server(DEMO.window, priority=-5) as server:
        args = DEMO.sweep_args(server.openai_base_url, "qwen", server.window, run)
        assert cli_main([*args, "--tokenize-url", server.url]) == 0
    assert cli_main(["sweep", "derive", str(run), "--model", "demo-model", "--json"]) == 0
    entry = load_document(run / "ceilings.yaml").entries[0]
    summary = json.loads((run / "summary.json").read_text())["analysis"]
    assert summary["resolved"] and not summary["refusals"]
    assert summary["outcome"] in ("ceiling", "at_reference")
    # the tolerance asked for, or the smallest wider one the data resolve, said so
    assert DEMO.tolerance <= entry.tolerance <= summary["max_tolerance"]
    assert 0 < entry.ceiling_tokens < server.window
    # a real curve: the reference reads the task, the last level does clearly worse
    levels = summary["levels"]
    assert levels[0]["accuracy"] >= 0.6
    assert levels[-1]["accuracy"] <= levels[0]["accuracy"] - 0.2
