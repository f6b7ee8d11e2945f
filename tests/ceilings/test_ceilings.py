"""Ceilings: schema, admin API, hot reload from every source, atomicity under load, push."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from context_ceiling.ceilings.document import (
    CeilingsError,
    json_schema,
    load_document,
    parse_document,
)
from testkit import REPO, wait_for
from testkit.cli import ceiling
from testkit.serving import ceiling_serve, free_port
from testkit.traffic.ceiling_docs import doc, entry
from tests.conftest import Running

TOKEN = "admin-token-Z9"
AUTH = {"authorization": f"Bearer {TOKEN}"}
MSG: list[Any] = [{"role": "user", "content": "hello"}]


def running_version(sc: Running) -> int:
    return sc.state.ceilings.current.version


# -- schema -------------------------------------------------------------------------------


def test_committed_json_schema_is_current() -> None:
    committed = json.loads((REPO / "schemas" / "ceilings.schema.json").read_text())
    assert committed == json_schema(), "run: ceiling ceilings schema > schemas/ceilings.schema.json"


INVALID: list[tuple[Any, str]] = [
    ({"version": 1, "entries": [entry(tokens=126000)]}, "above the window"),
    ({"version": 1, "entries": [entry(ceiling_utilization=0.9)]}, "disagrees"),
    ({"version": 1, "entries": [entry(), entry()]}, "duplicate entry"),
    ({"version": -1, "entries": []}, "version"),
    ({"schema_version": 2, "version": 1, "entries": []}, "schema_version"),
    ({"version": 1, "entries": [entry(tokens=0)]}, "ceiling_tokens"),
    ({"version": 1, "entries": [{"model": "gpt-4o"}]}, "Field required"),
    ({"version": 1, "entries": [entry(unknown_field=1)]}, "Extra inputs"),
    ({"version": 1, "entries": [entry(margin=1.5)]}, "margin"),
    ({"version": 1, "entries": [entry(output_reservation=200000)]}, "output_reservation"),
    ("[1, 2, 3]", "must be a mapping"),
    ("version: [unclosed", "not valid JSON or YAML"),
]


@pytest.mark.parametrize(("document", "needle"), INVALID)
def test_invalid_documents_name_the_reason(document: Any, needle: str) -> None:
    text = document if isinstance(document, str) else json.dumps(document)
    with pytest.raises(CeilingsError) as info:
        parse_document(text, "doc")
    assert needle in str(info.value)


def test_yaml_and_json_are_the_same_document() -> None:
    d = doc(3, entry(), entry(workload="rag", tokens=32000))
    assert parse_document(json.dumps(d)) == parse_document(yaml.safe_dump(d))
    assert parse_document(json.dumps(d)).lookup("gpt-4o", "agent") == parse_document(
        json.dumps(d)
    ).lookup("gpt-4o", "default")


# -- admin API ----------------------------------------------------------------------------


def test_admin_api_is_absent_without_a_token(sidecar: Running) -> None:
    assert httpx.get(sidecar.url + "/admin/ceilings").status_code == 404
    assert httpx.put(sidecar.url + "/admin/ceilings", json=doc(1), headers=AUTH).status_code == 404


def test_admin_api_tokens(make_sidecar: Callable[..., Running]) -> None:
    sc = make_sidecar(admin_token=TOKEN)
    assert httpx.get(sc.url + "/admin/ceilings").status_code == 401
    assert (
        httpx.get(sc.url + "/admin/ceilings", headers={"authorization": "Basic abc"}).status_code
        == 401
    )
    r = httpx.put(
        sc.url + "/admin/ceilings", json=doc(1), headers={"authorization": "Bearer wrong"}
    )
    assert r.status_code == 403 and r.json()["error"]["type"] == "permission_error"
    assert running_version(sc) == 0
    r = httpx.put(sc.url + "/admin/ceilings", json=doc(1), headers=AUTH)
    assert r.status_code == 200
    assert r.json() == {"applied": True, "version": 1, "entries": 1, "unused": []}
    got = httpx.get(sc.url + "/admin/ceilings", headers=AUTH).json()
    assert got["version"] == 1 and got["entries"][0]["ceiling_tokens"] == 64000


def test_admin_token_from_file(make_sidecar: Callable[..., Running], tmp_path: Path) -> None:
    (tmp_path / "token").write_text(TOKEN + "\n")
    sc = make_sidecar(admin_token_file=str(tmp_path / "token"))
    assert httpx.get(sc.url + "/admin/ceilings", headers=AUTH).status_code == 200


def test_put_applies_without_restart_and_invalid_ones_change_nothing(
    make_sidecar: Callable[..., Running],
) -> None:
    sc = make_sidecar(admin_token=TOKEN)
    assert (
        httpx.put(
            sc.url + "/admin/ceilings", json=doc(5, entry(tokens=50000)), headers=AUTH
        ).status_code
        == 200
    )
    r = httpx.post(sc.url + "/v1/chat/completions", json={"model": "gpt-4o", "messages": MSG})
    assert r.headers["x-ceiling-ceiling-tokens"] == "50000"
    s = sc.sample
    assert s("llm_context_config_version") == 5
    assert s("llm_context_ceiling_tokens", model="gpt-4o", workload="default") == 50000
    assert s("llm_context_ceiling_age_seconds", model="gpt-4o", workload="default") > 86400  # type: ignore[operator]
    assert s("llm_context_config_reloads_total", source="api", result="success") == 1
    assert s("llm_context_config_last_reload_success_timestamp_seconds") == pytest.approx(
        time.time(), abs=30
    )
    before = httpx.get(sc.url + "/admin/ceilings", headers=AUTH).content
    bad: list[Any] = [json.loads(json.dumps(d)) for d, _ in INVALID if not isinstance(d, str)]
    bad += [
        doc(5, entry(tokens=1000)),
        doc(4, entry(tokens=1000)),  # not newer
        doc(6, entry(window=64000, tokens=32000)),  # window differs from the registry's
        "not: [valid",
        b"\xff\xfe",
    ]
    for d in bad:
        body = d if isinstance(d, (str, bytes)) else json.dumps(d)
        r = httpx.put(sc.url + "/admin/ceilings", content=body, headers=AUTH)
        assert r.status_code == 422, body
        assert r.json()["error"]["reasons"]
    assert (
        httpx.get(sc.url + "/admin/ceilings", headers=AUTH).content == before
    )  # 0 of many applied
    assert s("llm_context_config_reloads_total", source="api", result="failure") == len(bad)
    r = httpx.put(
        sc.url + "/admin/ceilings",
        params={"force": "true"},
        json=doc(4, entry(tokens=1000)),
        headers=AUTH,
    )
    assert r.status_code == 200 and running_version(sc) == 4


def test_put_persists_atomically_and_the_watcher_does_not_reapply(
    make_sidecar: Callable[..., Running], tmp_path: Path
) -> None:
    path = tmp_path / "ceilings.yaml"
    sc = make_sidecar(admin_token=TOKEN, ceilings_file=str(path))
    assert httpx.put(sc.url + "/admin/ceilings", json=doc(2), headers=AUTH).status_code == 200
    assert load_document(path).version == 2
    time.sleep(1.0)
    assert sc.sample("llm_context_config_reloads_total", source="file", result="success") is None
    assert [p.name for p in tmp_path.iterdir()] == ["ceilings.yaml"]  # no temp files left behind


def test_without_persisting_a_sighup_after_a_push_is_not_a_failure(
    make_sidecar: Callable[..., Running], tmp_path: Path
) -> None:
    """The file is behind the pushed document: re-reading it changes nothing and fails nothing
    (a reload-failure alert must not fire on a healthy sidecar)."""
    path = tmp_path / "ceilings.yaml"
    path.write_text(yaml.safe_dump(doc(1)))
    sc = make_sidecar(admin_token=TOKEN, ceilings_file=str(path), ceilings_persist=False)
    assert httpx.put(sc.url + "/admin/ceilings", json=doc(3), headers=AUTH).status_code == 200
    for _ in range(3):
        assert sc.state.ceilings.reload_file("sighup") == "unchanged"
    assert running_version(sc) == 3
    assert sc.sample("llm_context_config_reloads_total", source="sighup", result="failure") is None
    assert sc.sample("llm_context_config_reloads_total", source="sighup", result="unchanged") == 3


def test_in_flight_request_finishes_with_the_ceilings_it_started_with(
    make_sidecar: Callable[..., Running],
) -> None:
    sc = make_sidecar(admin_token=TOKEN)
    httpx.put(sc.url + "/admin/ceilings", json=doc(1, entry(tokens=40000)), headers=AUTH)

    async def run() -> httpx.Response:
        async with httpx.AsyncClient(timeout=10) as c:
            slow = asyncio.create_task(
                c.post(
                    sc.url + "/v1/chat/completions",
                    json={"model": "gpt-4o", "messages": MSG},
                    headers={"x-double-delay": "0.8"},
                )
            )
            await asyncio.sleep(0.3)
            r = await c.put(
                sc.url + "/admin/ceilings", json=doc(2, entry(tokens=20000)), headers=AUTH
            )
            assert r.status_code == 200
            return await slow

    assert asyncio.run(run()).headers["x-ceiling-ceiling-tokens"] == "40000"
    r = httpx.post(sc.url + "/v1/chat/completions", json={"model": "gpt-4o", "messages": MSG})
    assert r.headers["x-ceiling-ceiling-tokens"] == "20000"


def test_reload_under_concurrent_load_fails_no_request(
    make_sidecar: Callable[..., Running],
) -> None:
    sc = make_sidecar(admin_token=TOKEN)

    async def run() -> list[int]:
        async with httpx.AsyncClient(timeout=20, limits=httpx.Limits(max_connections=32)) as c:

            async def traffic(i: int) -> int:
                stream = i % 3 == 0
                r = await c.post(
                    sc.url + "/v1/chat/completions",
                    json={"model": "gpt-4o", "messages": MSG, "stream": stream},
                )
                return r.status_code

            async def pushes() -> None:
                for v in range(1, 21):
                    r = await c.put(
                        sc.url + "/admin/ceilings",
                        json=doc(v, entry(tokens=1000 * v)),
                        headers=AUTH,
                    )
                    assert r.status_code == 200
                    await asyncio.sleep(0.01)

            results = await asyncio.gather(pushes(), *(traffic(i) for i in range(300)))
            return [x for x in results if isinstance(x, int)]

    codes = asyncio.run(run())
    assert len(codes) == 300 and set(codes) == {200}
    assert running_version(sc) == 20


# -- file sources -------------------------------------------------------------------------


def test_file_change_takes_effect(make_sidecar: Callable[..., Running], tmp_path: Path) -> None:
    path = tmp_path / "ceilings.yaml"
    path.write_text(yaml.safe_dump(doc(1)))
    sc = make_sidecar(ceilings_file=str(path))
    assert running_version(sc) == 1  # loaded at startup
    path.write_text(yaml.safe_dump(doc(2, entry(tokens=30000))))
    assert wait_for(lambda: running_version(sc) == 2)
    path.write_text("version: [broken")  # a bad edit changes nothing
    assert wait_for(
        lambda: (
            (sc.sample("llm_context_config_reloads_total", source="file", result="failure") or 0)
            >= 1
        )
    )
    assert running_version(sc) == 2


def test_configmap_symlink_swap(make_sidecar: Callable[..., Running], tmp_path: Path) -> None:
    # The layout the kubelet writes: name -> ..data/name, ..data -> ..<timestamp>/, swapped by rename.
    cm = tmp_path / "cm"
    cm.mkdir()
    (cm / "..2026_11_29_a").mkdir()
    (cm / "..2026_11_29_a" / "ceilings.yaml").write_text(yaml.safe_dump(doc(1)))
    os.symlink("..2026_11_29_a", cm / "..data")
    os.symlink("..data/ceilings.yaml", cm / "ceilings.yaml")
    sc = make_sidecar(ceilings_file=str(cm / "ceilings.yaml"))
    assert running_version(sc) == 1
    (cm / "..2026_11_29_b").mkdir()
    (cm / "..2026_11_29_b" / "ceilings.yaml").write_text(
        yaml.safe_dump(doc(2, entry(tokens=12345)))
    )
    os.symlink("..2026_11_29_b", cm / "..data_tmp")
    os.replace(cm / "..data_tmp", cm / "..data")
    assert wait_for(lambda: running_version(sc) == 2)
    assert sc.sample("llm_context_ceiling_tokens", model="gpt-4o", workload="default") == 12345


def test_bad_file_at_startup_is_a_one_line_exit_2(tmp_path: Path, double: Any) -> None:
    _, durl = double
    (tmp_path / "ceilings.yaml").write_text(yaml.safe_dump(doc(1, entry(tokens=127000))))
    (tmp_path / "sidecar.yaml").write_text(
        yaml.safe_dump(
            {
                "upstreams": {"openai": {"base_url": durl + "/v1"}},
                "models": [{"match": "gpt-4o", "window": 128000}],
                "ceilings_file": "ceilings.yaml",
            }
        )
    )
    r = ceiling("serve", "-c", str(tmp_path / "sidecar.yaml"))
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1 and "above the window" in r.stderr


def test_sighup_rereads_the_file(tmp_path: Path, double: Any) -> None:
    _, durl = double
    path = tmp_path / "ceilings.yaml"
    path.write_text(yaml.safe_dump(doc(1)))
    cfg = {
        "upstreams": {"openai": {"base_url": durl + "/v1"}},
        "models": [{"match": "gpt-4o", "window": 128000}],
        "ceilings_file": "ceilings.yaml",
        "ceilings_watch": False,
        "admin_token": TOKEN,
    }
    with ceiling_serve(cfg, tmp_path) as sp:

        def version() -> int | None:
            try:
                return int(
                    httpx.get(sp.url + "/admin/ceilings", headers=AUTH, timeout=1).json()["version"]
                )
            except httpx.TransportError:
                return None

        assert wait_for(lambda: version() == 1, 20)
        path.write_text(yaml.safe_dump(doc(2)))
        time.sleep(1.0)
        assert version() == 1  # not watched: nothing happens until asked
        sp.proc.send_signal(signal.SIGHUP)
        assert wait_for(lambda: version() == 2)
        assert sp.proc.poll() is None  # still the same process


# -- push CLI -----------------------------------------------------------------------------


def cli(*args: str, token: str | None = TOKEN) -> subprocess.CompletedProcess[str]:
    return ceiling(*args, token=token)


def test_push_to_sidecars_dry_run_and_file(
    make_sidecar: Callable[..., Running], tmp_path: Path
) -> None:
    a, b = make_sidecar(admin_token=TOKEN), make_sidecar(admin_token=TOKEN)
    f = tmp_path / "new.yaml"
    f.write_text(yaml.safe_dump(doc(7, entry(tokens=48000), entry(workload="rag", tokens=24000))))
    r = cli("push", str(f), "--to", a.url, "--to", b.url, "--dry-run")
    assert r.returncode == 0, r.stderr
    assert "+ gpt-4o/rag: ceiling 24000 tokens" in r.stdout
    assert running_version(a) == running_version(b) == 0
    r = cli("push", str(f), "--to", a.url, "--to", b.url)
    assert r.returncode == 0, r.stderr
    assert running_version(a) == running_version(b) == 7
    r = cli("push", str(f), "--to", a.url)  # the same document again: a no-op, exit 0 (GitOps)
    assert r.returncode == 0 and "unchanged (version 7)" in r.stdout, r.stdout + r.stderr
    same_version = tmp_path / "same-version.yaml"
    same_version.write_text(yaml.safe_dump(doc(7, entry(tokens=47000))))
    r = cli("push", str(same_version), "--to", a.url)  # other content, same version: refused
    assert r.returncode == 1 and "not newer" in r.stderr
    target = tmp_path / "cm" / "ceilings.yaml"
    r = cli("push", str(f), "--file", str(target))
    assert r.returncode == 0 and load_document(target).version == 7
    r = cli("push", str(f), "--file", str(target))
    assert r.returncode == 0 and "unchanged" in r.stdout
    f.write_text(yaml.safe_dump(doc(8, entry(tokens=40000))))
    r = cli("push", str(f), "--file", str(target), "--dry-run")
    assert (
        "~ gpt-4o/default: ceiling 48000 -> 40000 tokens" in r.stdout and "- gpt-4o/rag" in r.stdout
    )
    assert load_document(target).version == 7


@pytest.mark.parametrize(
    ("args", "token", "needle"),
    [
        (["push", "MISSING.yaml", "--to", "http://127.0.0.1:9"], TOKEN, "cannot read"),
        (["push", "BAD", "--to", "http://127.0.0.1:9"], TOKEN, "above the window"),
        (["push", "GOOD", "--to", "http://127.0.0.1:9"], None, "CEILING_ADMIN_TOKEN"),
        (["push", "GOOD"], TOKEN, "say where to push"),
        (["push"], TOKEN, "required"),
    ],
)
@pytest.mark.e2e
def test_push_usage_errors_exit_2_one_line(
    tmp_path: Path, args: list[str], token: str | None, needle: str
) -> None:
    (tmp_path / "BAD").write_text(yaml.safe_dump(doc(1, entry(tokens=127000))))
    (tmp_path / "GOOD").write_text(yaml.safe_dump(doc(1)))
    args = [str(tmp_path / a) if a in ("BAD", "GOOD", "MISSING.yaml") else a for a in args]
    r = cli(*args, token=token)
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1 and needle in r.stderr


@pytest.mark.e2e
def test_unreachable_target_is_reported(tmp_path: Path) -> None:
    (tmp_path / "GOOD").write_text(yaml.safe_dump(doc(1)))
    r = cli("push", str(tmp_path / "GOOD"), "--to", f"http://127.0.0.1:{free_port()}")
    assert r.returncode == 1 and "unreachable" in r.stderr


def test_push_dry_run_asks_each_sidecar_and_fails_as_the_push_would(
    make_sidecar: Callable[..., Running], tmp_path: Path
) -> None:
    """A document that passes the local checks but that the sidecar would refuse (a window its
    registry disagrees with): the dry run fails with the sidecar's own reason, and nothing is
    applied or counted as a failed reload."""
    a = make_sidecar(admin_token=TOKEN)
    wrong = tmp_path / "wrong-window.yaml"
    wrong.write_text(yaml.safe_dump(doc(5, entry(tokens=30000, window=64000))))
    r = cli("push", str(wrong), "--to", a.url, "--dry-run")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "would be refused (422)" in r.stderr and "differs from the registry" in r.stderr
    assert running_version(a) == 0
    metrics = httpx.get(a.url + "/metrics").text
    assert 'llm_context_config_reloads_total{result="failure",source="api"}' not in metrics
    # the real push fails the same way (and that is a failed reload)
    r = cli("push", str(wrong), "--to", a.url)
    assert r.returncode == 1 and "differs from the registry" in r.stderr
    metrics = httpx.get(a.url + "/metrics").text
    assert 'llm_context_config_reloads_total{result="failure",source="api"} 1.0' in metrics
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(doc(5, entry(tokens=30000))))
    r = cli("push", str(good), "--to", a.url, "--dry-run")
    assert r.returncode == 0 and "would apply version 5" in r.stdout, r.stdout + r.stderr
    assert running_version(a) == 0
    assert cli("push", str(good), "--to", a.url).returncode == 0
    # not newer than the running one: the dry run says so, for a sidecar and for a file
    older = tmp_path / "older.yaml"
    older.write_text(yaml.safe_dump(doc(4, entry(tokens=20000))))
    r = cli("push", str(older), "--to", a.url, "--dry-run")
    assert r.returncode == 1 and "not newer" in r.stderr
    target = tmp_path / "ceilings.yaml"
    target.write_text(good.read_text())
    r = cli("push", str(older), "--file", str(target), "--dry-run")
    assert r.returncode == 1 and "would be refused: version 4 is not newer than 5" in r.stderr
    assert load_document(target).version == 5
    # the validate endpoint itself: authorized like the rest of the admin API, JSON errors
    url = a.url + "/admin/ceilings/validate"
    assert httpx.post(url, content=good.read_bytes()).status_code == 401
    r2 = httpx.post(url, content=b"{", headers={"authorization": f"Bearer {TOKEN}"})
    assert r2.status_code == 422 and r2.json()["error"]["type"] == "invalid_ceilings"
    r2 = httpx.post(url, content=good.read_bytes(), headers={"authorization": f"Bearer {TOKEN}"})
    assert r2.status_code == 200 and r2.json()["unchanged"] is True


@pytest.mark.e2e
def test_validate_against_a_sidecar_config(tmp_path: Path) -> None:
    """`ceiling ceilings validate FILE --config sidecar.yaml`: the sidecar's checks, offline."""
    config = tmp_path / "sidecar.yaml"
    config.write_text(
        "upstreams: {openai: {base_url: 'https://api.openai.com/v1'}}\n"
        "models: [{match: 'gpt-4o*', label: gpt-4o, window: 128000}]\n"
        "workloads: [rag]\n"
    )
    f = tmp_path / "c.yaml"
    f.write_text(
        yaml.safe_dump(doc(2, entry(workload="rag"), entry(model="claude", window=200000)))
    )
    r = cli("ceilings", "validate", str(f), "--config", str(config))
    assert r.returncode == 0, r.stderr
    assert "1 of 2 entries in use" in r.stdout and "'claude'" in r.stdout
    f.write_text(yaml.safe_dump(doc(2, entry(tokens=30000, window=64000))))
    r = cli("ceilings", "validate", str(f), "--config", str(config))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "window 64000 differs from the registry's 128000" in r.stderr
    r = cli("ceilings", "validate", str(f), "--config", str(tmp_path / "missing.yaml"))
    assert r.returncode == 2 and "missing.yaml: cannot read" in r.stderr


def test_a_file_written_in_place_is_never_applied_half(
    make_sidecar: Callable[..., Running], tmp_path: Path
) -> None:
    """A writer that pauses after a prefix that parses (three of six entries, the new version)
    never has that prefix run: a change applies only once the file stops changing."""
    import threading

    path = tmp_path / "ceilings.yaml"
    path.write_text(yaml.safe_dump(doc(1)))
    sc = make_sidecar(ceilings_file=str(path))
    entries = [entry(model=f"m{k}", tokens=20000 + k) for k in range(6)]
    text = yaml.safe_dump(doc(2, *entries), sort_keys=False)
    cut = [i for i in range(len(text)) if text.startswith("- model:", i)][3]
    assert len(parse_document(text[:cut]).entries) == 3  # the prefix is a valid document
    seen: set[tuple[int, int]] = set()
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            d = sc.state.ceilings.current
            seen.add((d.version, len(d.entries)))
            time.sleep(0.005)

    watcher = threading.Thread(target=poll)
    watcher.start()
    try:
        with path.open("w") as f:
            f.write(text[:cut])
            f.flush()
            time.sleep(0.2)  # longer than the watcher's own debounce
            f.write(text[cut:])
        assert wait_for(lambda: running_version(sc) == 2)
        time.sleep(0.1)
    finally:
        stop.set()
        watcher.join()
    assert seen <= {(1, 1), (2, 6)}, seen


def test_a_deeply_nested_push_is_a_422_not_a_500(make_sidecar: Callable[..., Running]) -> None:
    sc = make_sidecar(admin_token="t0k")
    nested = "entries: " + "[" * 5000 + "]" * 5000
    r = httpx.put(
        sc.url + "/admin/ceilings",
        content=nested,
        headers={"authorization": "Bearer t0k", "content-type": "application/yaml"},
    )
    assert r.status_code == 422 and "nested too deeply" in r.text
