"""Dashboards and rules: generated from one source, fresh, checked by promtool, every alert tested
firing and not firing, every alert in the runbook, every metric they name exported."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest

from dashboards import mixin
from dashboards.panels import dashboard
from dashboards.rule_tests import CASES
from dashboards.rules import alerts, rules_file
from tests.conftest import Running

ROOT = Path(__file__).resolve().parent.parent
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None,
    reason="promtool comes from the Debian package prometheus (.ci/run installs it)",
)


def test_generated_files_are_current() -> None:
    for folder, files in mixin.outputs().items():
        for name, text in files.items():
            assert (folder / name).read_text() == text, "run: python -m dashboards.mixin"


def test_every_alert_has_a_case_and_a_runbook_entry() -> None:
    names = [a["alert"] for a in alerts()]
    assert sorted(names) == sorted(c[0] for c in CASES)
    runbook = (ROOT / "dashboards" / "runbook.md").read_text()
    for a in alerts():
        anchor = a["annotations"]["runbook_url"].split("#")[1]
        assert f"## {a['alert']}" in runbook and anchor == a["alert"].lower()


@needs_promtool
def test_promtool_check_and_test_rules() -> None:
    """The committed files, as an operator would run them."""
    generated = ROOT / "dashboards" / "generated"
    for args in (["check", "rules", "rules.yaml"], ["test", "rules", "rules_test.yaml"]):
        r = subprocess.run(
            [PROMTOOL or "promtool", *args], capture_output=True, text=True, cwd=generated
        )
        assert r.returncode == 0, r.stdout + r.stderr


def _metric_names(expr: str) -> set[str]:
    names = set(re.findall(r"(?<![:\w])(llm_context_[a-z_]+|gen_ai_[a-z_]+)(?![\w:])", expr))
    labels = {
        "gen_ai_operation_name",
        "gen_ai_provider_name",
        "gen_ai_request_model",
        "gen_ai_token_type",
    }
    return names - labels


def test_every_metric_named_exists_on_metrics(sidecar: Running) -> None:
    import openai

    client = openai.OpenAI(base_url=sidecar.url + "/v1", api_key="k", max_retries=0)
    client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    exposed = httpx.get(sidecar.url + "/metrics").text
    families = set(re.findall(r"^# TYPE (\S+) ", exposed, re.M))
    exprs = [r["expr"] for g in rules_file()["groups"] for r in g["rules"]]
    exprs += [t["expr"] for p in dashboard()["panels"] for t in p["targets"]]
    missing = set()
    for e in exprs:
        for name in _metric_names(e):
            base = re.sub(r"_(bucket|sum|count|total)$", "", name)
            if name not in families and base not in families:
                missing.add(name)
    assert not missing, f"named in rules/panels but not exported: {sorted(missing)}"


def test_dashboard_variables_declared() -> None:
    d = dashboard()
    declared = {v["name"] for v in d["templating"]["list"]}
    used = set(re.findall(r"\$(\w+)", json.dumps(d["panels"])))
    assert used - {"__rate_interval", "__all"} <= declared
