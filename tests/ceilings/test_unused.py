"""A ceiling no model uses is never silent: the admin API, push, the file reload and validate
report every entry whose model or workload matches nothing (with the closest label), strict
refuses them, a gauge counts them; a model entry without a label is labelled by its match
without the glob, so the quick start's ``match: gpt-4o*`` enforces a ceiling for ``gpt-4o``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx
import yaml

from testkit.cli import ceiling
from testkit.traffic.ceiling_docs import doc, entry
from tests.conftest import Running

TOKEN = "admin-token-Z9"
AUTH = {"authorization": f"Bearer {TOKEN}"}
GLOB_MODELS = [{"match": "gpt-4o*", "window": 128000}]


def test_a_glob_entry_enforces_the_ceiling_written_for_its_plain_name(
    make_sidecar: Callable[..., Running],
) -> None:
    sc = make_sidecar(admin_token=TOKEN, models=GLOB_MODELS)
    r = httpx.put(sc.url + "/admin/ceilings", json=doc(1, entry(model="gpt-4o")), headers=AUTH)
    assert r.status_code == 200 and r.json()["unused"] == []
    budget = httpx.get(sc.url + "/budget", params={"model": "gpt-4o-2024-08-06"}).json()
    assert budget["ceiling_tokens"] == 64000
    assert sc.sample("llm_context_ceilings_unused_entries") == 0


def test_unused_entries_are_reported_counted_and_refused_when_strict(
    make_sidecar: Callable[..., Running],
) -> None:
    sc = make_sidecar(admin_token=TOKEN, models=GLOB_MODELS)
    bad = doc(1, entry(model="gpt4o"), entry(model="gpt-4o", workload="nightly"))
    r = httpx.put(sc.url + "/admin/ceilings", json=bad, headers=AUTH, params={"strict": "true"})
    assert r.status_code == 422 and sc.state.ceilings.current.version == 0
    reasons = r.json()["error"]["reasons"]
    assert "did you mean 'gpt-4o'?" in reasons[0] and "'nightly' is not declared" in reasons[1]
    r = httpx.put(sc.url + "/admin/ceilings", json=bad, headers=AUTH)
    assert r.status_code == 200 and len(r.json()["unused"]) == 2
    assert sc.sample("llm_context_ceilings_unused_entries") == 2


def test_push_and_validate_say_so(make_sidecar: Callable[..., Running], tmp_path: Path) -> None:
    sc = make_sidecar(admin_token=TOKEN, models=GLOB_MODELS)
    path = tmp_path / "ceilings.yaml"
    path.write_text(yaml.safe_dump(doc(1, entry(model="gpt4o"))))
    r = ceiling("push", str(path), "--to", sc.url, token=TOKEN)
    assert r.returncode == 0 and "enforce nothing" in r.stdout and "did you mean" in r.stdout
    path.write_text(yaml.safe_dump(doc(2, entry(model="gpt4o"))))
    r = ceiling("push", str(path), "--to", sc.url, "--strict", token=TOKEN)
    assert r.returncode == 1 and sc.state.ceilings.current.version == 1  # a target refused
    config = tmp_path / "sidecar.yaml"
    config.write_text(
        yaml.safe_dump(
            {"upstreams": {"openai": {"base_url": "http://127.0.0.1:9/v1"}}, "models": GLOB_MODELS}
        )
    )
    r = ceiling("ceilings", "validate", str(path), "--config", str(config))
    assert r.returncode == 0 and "warning:" in r.stdout and "0 of 1 entries in use" in r.stdout
    r = ceiling("ceilings", "validate", str(path), "--config", str(config), "--strict")
    assert r.returncode == 2 and "did you mean 'gpt-4o'" in r.stderr


def test_the_file_reload_reports_them(make_sidecar: Callable[..., Running], tmp_path: Path) -> None:
    path = tmp_path / "ceilings.yaml"
    path.write_text(yaml.safe_dump(doc(1, entry(model="gpt4o"))))
    sc = make_sidecar(ceilings_file=str(path), models=GLOB_MODELS)
    assert sc.state.ceilings.unused and "did you mean" in sc.state.ceilings.unused[0]
    assert sc.sample("llm_context_ceilings_unused_entries") == 1
