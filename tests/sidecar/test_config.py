"""Configuration: YAML validated by pydantic, env overrides, one-line errors, exit 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml

from context_ceiling.ceilings.document import parse_document
from context_ceiling.sidecar.config import ConfigError, Settings, load_settings
from testkit import REPO
from testkit.traffic.ceiling_docs import doc, entry

GOOD = """
listen: {host: 127.0.0.1, port: 9100}
upstreams:
  openai: {base_url: "https://api.openai.com/v1", timeouts: {connect: 3, read: 60, total: 120}, pool_size: 20}
models:
  - {match: "gpt-4o*", window: 128000, max_output_tokens: 16384}
workloads: [rag]
ceilings_file: ceilings.yaml
"""


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "sidecar.yaml"
    p.write_text(text)
    return p


def test_good_file(tmp_path: Path) -> None:
    s = load_settings(write(tmp_path, GOOD))
    assert s.listen.port == 9100
    up = s.upstreams.of("openai")
    assert up is not None and up.pool_size == 20
    assert s.workloads == ["default", "rag"]
    assert s.ceilings_file == tmp_path / "ceilings.yaml"  # relative to the config file
    assert s.models[0].tokenizer.kind == "tiktoken"


def test_env_overrides_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CEILING_LISTEN__PORT", "9200")
    monkeypatch.setenv("CEILING_UPSTREAMS__OPENAI__TIMEOUTS__READ", "30")
    monkeypatch.setenv("CEILING_WORKLOADS", '["agent"]')
    s = load_settings(write(tmp_path, GOOD))
    assert s.listen.port == 9200
    up = s.upstreams.of("openai")
    assert up is not None and up.timeouts.read == 30
    assert up.timeouts.connect == 3  # the rest of the section still from the file
    assert s.workloads == ["default", "agent"]


def test_env_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CEILING_UPSTREAMS__ANTHROPIC__BASE_URL", "https://api.anthropic.com")
    monkeypatch.setenv("CEILING_MODELS", '[{"match": "claude-*", "window": 200000}]')
    s = load_settings(None)
    assert s.upstreams.of("anthropic") is not None and s.models[0].window == 200000


@pytest.mark.parametrize(
    ("text", "needles"),
    [
        (
            GOOD.replace("port: 9100", "port: 99999"),
            ["sidecar.yaml", "listen.port", "less than or equal to 65535"],
        ),
        (GOOD.replace("window: 128000", "window: -1"), ["models.0.window", "greater than 0"]),
        (
            GOOD.replace("max_output_tokens: 16384", "max_output_tokens: 200000"),
            ["models.0", "must be below window"],
        ),
        (
            GOOD.replace('"https://api.openai.com/v1"', "ftp://x"),
            ["upstreams.openai.base_url", "http"],
        ),
        (GOOD + "surprise: 1\n", ["surprise", "not a setting here"]),
        (GOOD.replace("workloads: [rag]", "workloads: [Bad Name]"), ["workloads", "must match"]),
        ("listen: [1, 2", ["sidecar.yaml", "invalid YAML"]),
        ("- just\n- a list\n", ["top level must be a mapping"]),
        ("listen: {port: 1}\n", ["configure at least one upstream"]),
    ],
)
def test_errors_name_file_field_reason(tmp_path: Path, text: str, needles: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(write(tmp_path, text))
    for n in needles:
        assert n in str(info.value)


def test_env_error_names_the_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CEILING_LISTEN__PORT", "not-a-port")
    with pytest.raises(ConfigError, match=r"env CEILING_LISTEN__PORT: listen\.port"):
        load_settings(write(tmp_path, GOOD))


@pytest.mark.e2e
def test_cli_exits_2_with_one_line(tmp_path: Path) -> None:
    p = write(tmp_path, GOOD.replace("port: 9100", "port: -5"))
    r = subprocess.run(
        [sys.executable, "-m", "context_ceiling.cli", "serve", "--config", str(p)],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "listen.port" in lines[0] and str(p) in lines[0]
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "context_ceiling.cli",
            "serve",
            "--config",
            str(tmp_path / "missing.yaml"),
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and "missing.yaml: cannot read" in r.stderr


@pytest.mark.parametrize("spelled", ["off", '"off"'])
def test_mode_off_unquoted_or_quoted(tmp_path: Path, spelled: str) -> None:
    """YAML reads an unquoted off as false; the config and a ceilings entry take it as "off"."""
    text = GOOD + f"enforcement:\n  mode: {spelled}\n  workloads: {{rag: {{mode: {spelled}}}}}\n"
    s = load_settings(write(tmp_path, text))
    assert s.enforcement.mode == "off" and s.enforcement.for_workload("rag")[0] == "off"
    text = yaml.safe_dump(doc(1, entry())).replace(
        "entries:\n- ", f"entries:\n- mode: {spelled}\n  "
    )
    assert parse_document(text).entries[0].mode == "off"


def _serve(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os

    base = {k: v for k, v in os.environ.items() if not k.startswith("CEILING_")}
    return subprocess.run(
        [sys.executable, "-m", "context_ceiling.cli", "serve", *args],
        capture_output=True,
        text=True,
        env={**base, **(env or {})},
        timeout=60,
    )


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        # a list or object variable that is not JSON: the variable, not a traceback
        ({"CEILING_MODELS": '[{"match": "x", '}, "env CEILING_MODELS: models: not valid JSON"),
        (
            {"CEILING_ENFORCEMENT": '{"mode": '},
            "env CEILING_ENFORCEMENT: enforcement: not valid JSON",
        ),
        # a bad value inside a section given as JSON: blamed on that variable, not on the file
        (
            {"CEILING_ENFORCEMENT": '{"mode": "enforcing"}'},
            "env CEILING_ENFORCEMENT: enforcement.mode:",
        ),
        (
            {"CEILING_ENFORCEMENT__MODE": "enforcing"},
            "env CEILING_ENFORCEMENT__MODE: enforcement.mode",
        ),
        # a top-level typo is refused like a nested one, with the likely intent
        (
            {"CEILING_WORKLOAD": "rag"},
            "env CEILING_WORKLOAD: 'workload' is not a sidecar setting (did you mean CEILING_WORKLOADS?)",
        ),
        (
            {"CEILING_ENFORCEMENT__MODEE": "enforce"},
            "env CEILING_ENFORCEMENT__MODEE: enforcement.modee",
        ),
    ],
)
@pytest.mark.e2e
def test_env_errors_one_line_exit_2_blamed_on_the_variable(
    tmp_path: Path, env: dict[str, str], needle: str
) -> None:
    p = write(tmp_path, GOOD)
    r = _serve("--config", str(p), "--check", env=env)
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], r.stderr
    assert str(p) not in lines[0]  # the file is fine


@pytest.mark.e2e
def test_a_bad_value_in_the_file_is_blamed_on_the_file(tmp_path: Path) -> None:
    p = write(tmp_path, GOOD + "enforcement:\n  mode: enforcing\n")
    # an unrelated variable in the same section does not take the blame
    r = _serve(
        "--config", str(p), "--check", env={"CEILING_ENFORCEMENT__DEFAULT_OUTPUT_RESERVATION": "10"}
    )
    assert r.returncode == 2 and f"{p}: enforcement.mode" in r.stderr, r.stderr


@pytest.mark.e2e
def test_serve_check(tmp_path: Path) -> None:
    """`serve --check` loads what startup loads (tokenizer files, the ceilings file against the
    registry) and says in one line whether the sidecar would start."""
    p = write(tmp_path, GOOD)
    r = _serve("--config", str(p), "--check")
    assert r.returncode == 0 and r.stdout.startswith("config ok:"), r.stderr
    missing = write(
        tmp_path,
        GOOD
        + "models:\n  - {match: 'q*', label: q, window: 8000, tokenizer: {kind: huggingface, path: /nonexistent/tokenizer.json}}\n",
    )
    r = _serve("--config", str(missing), "--check")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "/nonexistent/tokenizer.json" in r.stderr
    ceilings = tmp_path / "ceilings.yaml"
    ceilings.write_text(yaml.safe_dump(doc(3, entry(tokens=30000, window=64000))))
    p = write(
        tmp_path,
        GOOD
        + f"ceilings_file: {ceilings}\n"
        + "models:\n  - {match: 'gpt-4o*', label: gpt-4o, window: 128000}\n",
    )
    r = _serve("--config", str(p), "--check")
    assert r.returncode == 2 and "window 64000 differs from the registry's" in r.stderr, r.stderr


def test_the_docs_config_example_loads(tmp_path: Path) -> None:
    """The full example on the docs' Configuration page is a config the sidecar accepts
    (`mode: off` unquoted included)."""
    import re

    page = (REPO / "docs" / "configuration.md").read_text()
    found = re.search(r"```yaml\n(listen:.*?)```", page, re.S)
    assert found is not None
    s = load_settings(write(tmp_path, found.group(1)))
    assert s.enforcement.mode == "off" and {"vllm", "azure-eu"} <= set(s.upstreams.named)


@pytest.mark.e2e
def test_a_served_sidecar_freezes_its_startup_heap_and_an_embedded_one_does_not() -> None:
    """``ceiling serve`` builds its app with ``freeze_heap``: once started, what startup loaded
    is out of the collector's generations, so a full collection does not walk it on the event
    loop. An app built in a process that builds many (tests, embedding) leaves gc alone."""
    import gc

    from context_ceiling.sidecar.app import create_app
    from testkit.serving import serve

    gc.unfreeze()
    settings = Settings(upstreams={"openai": {"base_url": "http://127.0.0.1:9/v1"}})
    try:
        with serve(create_app(settings)) as url:
            assert httpx.get(url + "/healthz").status_code == 200
            assert gc.get_freeze_count() == 0
        with serve(create_app(settings, freeze_heap=True)) as url:
            assert httpx.get(url + "/healthz").status_code == 200
            assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
