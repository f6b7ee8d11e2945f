"""The command line as users script it: help and defaults on every option, ``--json`` on every
command that prints a result (JSON alone on stdout), shell completion from the parsers, and the
public Python API's exports."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

import context_ceiling
from context_ceiling import api
from context_ceiling.cli import build_parser
from testkit.traffic.ceiling_docs import doc, entry

#: the commands that print a result, each of which takes --json
JSON_COMMANDS = [
    ("serve",),
    ("push",),
    ("ceilings", "validate"),
    ("sweep", "run"),
    ("sweep", "derive"),
    ("sweep", "report"),
    ("taskset", "build"),
]


def _parsers(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, (*path, name))


def _ceiling(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "context_ceiling.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
    )


def test_every_option_and_command_has_help() -> None:
    missing = []
    for path, parser in _parsers(build_parser()):
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction | argparse._VersionAction):
                continue
            if isinstance(action, argparse._SubParsersAction):
                missing += [
                    f"{' '.join(path)} {c.dest}" for c in action._choices_actions if not c.help
                ]
            elif not action.help:
                missing.append(f"{' '.join(path)} {action.option_strings or action.dest}")
    assert not missing, missing


@pytest.mark.e2e
def test_help_shows_the_defaults() -> None:
    r = _ceiling("sweep", "run", "--help")
    assert r.returncode == 0
    text = " ".join(r.stdout.split())
    assert "(default: 0.05)" in text  # --tolerance, from the run options' own defaults
    assert "(default: contracts)" in text and "(default: 0.2,0.5,0.8,max)" in text
    assert "(default: None)" not in text and "(default: False)" not in text
    r = _ceiling("taskset", "build", "--help")
    assert "(default: 0.8)" in " ".join(r.stdout.split())


@pytest.mark.parametrize("path", JSON_COMMANDS, ids=" ".join)
def test_every_result_command_takes_json(path: tuple[str, ...]) -> None:
    parsers = dict(_parsers(build_parser()))
    options = {o for a in parsers[path]._actions for o in a.option_strings}
    assert "--json" in options


@pytest.mark.e2e
def test_ceilings_validate_json(tmp_path: Path) -> None:
    f = tmp_path / "ceilings.yaml"
    f.write_text(yaml.safe_dump(doc(3, entry(tokens=30000, window=128000))))
    r = _ceiling("ceilings", "validate", str(f), "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out == {"path": str(f), "valid": True, "version": 3, "entries": 1}


@pytest.mark.e2e
def test_serve_check_json(tmp_path: Path) -> None:
    cfg = tmp_path / "sidecar.yaml"
    cfg.write_text(
        'upstreams: {openai: {base_url: "http://127.0.0.1:9/v1"}}\n'
        "models: [{match: 'gpt-4o*', window: 128000}]\nworkloads: [rag]\n"
    )
    r = _ceiling("serve", "-c", str(cfg), "--check", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["ok"] is True and out["models"] == 1 and out["workloads"] == ["default", "rag"]
    assert out["mode"] == "off" and out["ceilings_version"] is None and out["workers"] == 1


def test_json_failures_are_one_json_object(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--json promises one JSON object on stdout: a config that does not load is
    ``{"ok": false, "errors": [...]}`` (every problem, each with its "did you mean"), exit 2, and
    the same line on stderr."""
    from context_ceiling.cli import main

    cfg = tmp_path / "sidecar.yaml"
    cfg.write_text(
        "upstream: {openai: {base_url: 'http://127.0.0.1:9/v1'}}\n"
        "models: [{match: gpt-4o, window: 128000, tokeniser: {kind: tiktoken}}]\n"
        "enforcment: {mode: observe}\n"
    )
    assert main(["serve", "-c", str(cfg), "--check", "--json"]) == 2
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert out["ok"] is False and len(out["errors"]) == 3
    assert any(
        "upstream: not a setting here; did you mean 'upstreams'?" in e for e in out["errors"]
    )
    assert any("models.0.tokeniser" in e and "'tokenizer'" in e for e in out["errors"])
    assert any("did you mean 'enforcement'?" in e for e in out["errors"])
    assert "did you mean 'upstreams'?" in captured.err
    # a nested key with nothing close lists what may be there
    cfg.write_text(
        "upstreams: {openai: {base_url: 'http://127.0.0.1:9/v1', zzz: 1}}\n"
        "models: [{match: gpt-4o, window: 128000}]\n"
    )
    assert main(["serve", "-c", str(cfg), "--check"]) == 2
    assert "settings here: base_url, pool_size, provider, timeouts" in capsys.readouterr().err
    # a ceilings document that does not parse, validated with --json
    bad = tmp_path / "ceilings.yaml"
    bad.write_text("version: 1\nentries: [{model: m, workload: default, ceiling_tokns: 5}]\n")
    assert main(["ceilings", "validate", str(bad), "--json"]) == 2
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is False and out["errors"] and str(bad) in out["errors"][0]


def test_check_notes_a_model_counted_with_another_familys_tokenizer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from context_ceiling.cli import main

    cfg = tmp_path / "sidecar.yaml"
    cfg.write_text(
        "upstreams: {gemini: {base_url: 'http://127.0.0.1:9'}}\n"
        "models:\n"
        "  - {match: gemini-2.5-pro, window: 1048576}\n"
        "  - {match: 'claude-*', window: 200000, tokenizer: {kind: tiktoken}}\n"
        "  - {match: 'claude-x', window: 200000, "
        "tokenizer: {kind: calibrated, encoding: cl100k_base, factor: 1.1}}\n"
        "  - {match: gpt-4o, window: 128000}\n"
    )
    assert main(["serve", "-c", str(cfg), "--check", "--json"]) == 0
    captured = capsys.readouterr()
    notes = json.loads(captured.out)["notes"]
    assert len(notes) == 2  # the calibrated one and the OpenAI one are counted as chosen
    assert "'gemini-2.5-pro'" in notes[0] and "Google's tokenizer" in notes[0]
    assert "'claude-*'" in notes[1] and "Anthropic's tokenizer" in notes[1]
    assert captured.err.count("note:") == 2


@pytest.mark.e2e
def test_push_json_reports_each_target_and_is_idempotent(tmp_path: Path) -> None:
    src = tmp_path / "new.yaml"
    src.write_text(yaml.safe_dump(doc(4, entry(tokens=30000, window=128000))))
    target = tmp_path / "live.yaml"
    first = _ceiling("push", str(src), "--file", str(target), "--json")
    assert first.returncode == 0, first.stderr
    out = json.loads(first.stdout)
    assert out["ok"] is True and out["targets"][0]["target"] == str(target)
    assert [t["message"] for t in out["targets"]][-1] == "written"
    again = json.loads(_ceiling("push", str(src), "--file", str(target), "--json").stdout)
    assert again["targets"] == [
        {"target": str(target), "message": "unchanged (version 4)", "changes": []}
    ]
    older = tmp_path / "old.yaml"
    older.write_text(yaml.safe_dump(doc(2, entry(tokens=20000, window=128000))))
    refused = _ceiling("push", str(older), "--file", str(target), "--json")
    assert refused.returncode == 1 and json.loads(refused.stdout)["ok"] is False
    assert "not newer" in refused.stderr


@pytest.mark.e2e
def test_sweep_dry_run_json_creates_nothing(tmp_path: Path) -> None:
    r = _ceiling(
        "sweep", "run", "--taskset", "contracts", "--window", "8192", "--tokenizer",
        "o200k_base", "--model", "m", "--base-url", "http://127.0.0.1:9/v1", "--dry-run",
        "--json", cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)  # stdout is the JSON alone; the prose went to stderr
    assert out["dry_run"] is True and out["window"] == 8192 and out["calls"] > 0
    assert out["input_tokens"] > out["calls"] and "nothing was sent" in r.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.e2e
@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_shell_completion_knows_every_command(shell: str) -> None:
    r = _ceiling("completion", shell)
    assert r.returncode == 0, r.stderr
    for word in ("serve", "push", "sweep", "taskset", "ceilings", "--tolerance", "--to-configmap"):
        assert word in r.stdout
    if shell == "bash":
        checked = subprocess.run(["bash", "-n"], input=r.stdout, capture_output=True, text=True)
        assert checked.returncode == 0, checked.stderr


@pytest.mark.e2e
def test_a_bad_shell_is_one_line_and_exit_2() -> None:
    r = _ceiling("completion", "fish")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1


def test_the_public_api_exports_what_it_declares() -> None:
    """``context_ceiling`` re-exports exactly ``context_ceiling.api.__all__`` (and its version);
    every declared name resolves; the api module declares every public name it holds."""
    assert set(context_ceiling.__all__) == set(api.__all__) | {"__version__"}
    for name in api.__all__:
        assert getattr(context_ceiling, name) is getattr(api, name)
    public = {n for n in vars(api) if not n.startswith("_") and n != "annotations"}
    assert public == set(api.__all__)
    with pytest.raises(AttributeError):
        _ = context_ceiling.not_a_name


def test_the_public_api_counts_and_fits_like_the_sidecar() -> None:
    from context_ceiling import Policy, count, fit, input_budget

    chunks = "".join(f"<document id={i}>{'fact ' * 200}</document>" for i in range(10))
    body = {"model": "gpt-4o", "messages": [{"role": "user", "content": chunks + " question?"}]}
    total = count(body, shape="openai").total
    budget = input_budget(window=128_000, reservation=0, ceiling_tokens=total // 2)
    fitted, report = fit(body, shape="openai", budget=budget, policy=Policy())
    assert report.fits and report.before == total
    assert report.after == count(fitted, shape="openai").total <= budget
    # the former keyword still works for one release, with a warning naming the new one
    with pytest.warns(DeprecationWarning, match="shape="):
        assert count(body, api="openai").total == total
    with pytest.warns(DeprecationWarning, match="shape="):
        assert fit(body, api="openai", budget=budget)[1].after == report.after
    with pytest.raises(TypeError, match="shape="):
        count(body)
