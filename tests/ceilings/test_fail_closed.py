"""No single value takes the sidecar down and no partial document runs: numbers out of range
are refused where they are written, a file rewritten in place applies only once it is whole, a
document too large is refused and parsing never stalls serving, an older file is a failed
reload, a background task that fails is restarted, and ``serve --check`` fails exactly when
``serve`` would."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import anyio
import httpx
import pytest
import yaml
from prometheus_client import CollectorRegistry, Counter

from context_ceiling.sidecar.app import supervised
from testkit import wait_for
from testkit.cli import ceiling
from testkit.traffic.ceiling_docs import doc, entry
from tests.conftest import Running

TOKEN = "admin-token-Z9"
AUTH = {"authorization": f"Bearer {TOKEN}"}


def test_a_version_out_of_range_is_refused_and_nothing_changes(
    make_sidecar: Callable[..., Running], tmp_path: Path
) -> None:
    path = tmp_path / "ceilings.yaml"
    sc = make_sidecar(admin_token=TOKEN, ceilings_file=str(path))
    assert httpx.put(sc.url + "/admin/ceilings", json=doc(2), headers=AUTH).status_code == 200
    huge = {**doc(3), "version": 10**400}
    r = httpx.put(
        sc.url + "/admin/ceilings",
        content=yaml.safe_dump(huge),
        headers={**AUTH, "content-type": "application/yaml"},
    )
    assert r.status_code in (400, 422) and "version" in r.text
    assert sc.state.ceilings.current.version == 2
    assert yaml.safe_load(path.read_text())["version"] == 2  # nothing persisted
    assert httpx.put(sc.url + "/admin/ceilings", json=doc(3), headers=AUTH).status_code == 200


@pytest.mark.parametrize(
    ("hold", "pause"),
    [
        (2.0, 1.5),  # a shortened hold, a pause within it
        pytest.param(None, 5.0, marks=pytest.mark.slow, id="the-real-hold-a-5s-pause"),
    ],
)
def test_a_file_rewritten_in_place_applies_only_once_whole(
    make_sidecar: Callable[..., Running], tmp_path: Path, hold: float | None, pause: float
) -> None:
    """A writer that pauses mid-write (up to 5 s, the target) never has a part applied: a file
    rewritten in place is applied once it has stayed the same for the hold (6 s by default)."""
    path = tmp_path / "ceilings.yaml"
    path.write_text(yaml.safe_dump(doc(1)))
    sc = make_sidecar(ceilings_file=str(path))
    if hold is not None:
        sc.state.ceilings.in_place_s = hold
    full = yaml.safe_dump(
        doc(2, *(entry(model=f"m{k}", tokens=1000 + k) for k in range(6))), sort_keys=False
    )
    half = full[: full.index("- model: m3")]
    seen: list[int] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            seen.append(len(sc.state.ceilings.current.entries))
            time.sleep(0.02)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with path.open("w") as f:  # the same inode: a rewrite in place, with a pause
            f.write(half)
            f.flush()
            time.sleep(pause)
            f.write(full[len(half) :])
        assert wait_for(lambda: sc.state.ceilings.current.version == 2, timeout=20)
    finally:
        stop.set()
        watcher.join()
    assert 3 not in seen, "the half-written document never ran"
    assert len(sc.state.ceilings.current.entries) == 6


def test_a_file_rewritten_with_an_older_version_is_a_failed_reload(
    make_sidecar: Callable[..., Running], tmp_path: Path
) -> None:
    path = tmp_path / "ceilings.yaml"
    path.write_text(yaml.safe_dump(doc(5)))
    sc = make_sidecar(ceilings_file=str(path))
    path.write_text(yaml.safe_dump(doc(4, entry(tokens=1000))))
    assert sc.state.ceilings.reload_file("file") == "failure"
    assert sc.state.ceilings.current.version == 5
    assert sc.sample("llm_context_config_reloads_total", source="file", result="failure") == 1


def test_a_document_over_the_size_cap_is_refused_and_serving_goes_on(
    make_sidecar: Callable[..., Running], tmp_path: Path
) -> None:
    path = tmp_path / "ceilings.yaml"
    path.write_text(yaml.safe_dump(doc(1)))
    sc = make_sidecar(ceilings_file=str(path))
    sc.state.ceilings.max_bytes = 64 * 1024
    big = tmp_path / "big.yaml"
    big.write_text(
        yaml.safe_dump(doc(2, *(entry(model=f"m{k}", tokens=1000) for k in range(2000))))
    )
    big.rename(path)  # moved into place: read at once
    assert wait_for(
        lambda: (
            (sc.sample("llm_context_config_reloads_total", source="file", result="failure") or 0)
            >= 1
        )
    )
    assert sc.state.ceilings.current.version == 1
    assert httpx.get(sc.url + "/healthz").status_code == 200


def test_a_large_document_is_parsed_off_the_event_loop(
    make_sidecar: Callable[..., Running], tmp_path: Path
) -> None:
    """A document near the cap takes a while to parse; requests are answered meanwhile."""
    path = tmp_path / "ceilings.yaml"
    path.write_text(yaml.safe_dump(doc(1)))
    sc = make_sidecar(ceilings_file=str(path))
    big = tmp_path / "big.yaml"
    big.write_text(
        yaml.safe_dump(doc(2, *(entry(model=f"m{k}", tokens=1000) for k in range(6000))))
    )
    started = time.monotonic()
    big.rename(path)
    slowest = 0.0
    while sc.state.ceilings.current.version != 2 and time.monotonic() - started < 30:
        t = time.monotonic()
        assert httpx.get(sc.url + "/healthz", timeout=10).status_code == 200
        slowest = max(slowest, time.monotonic() - t)
    assert sc.state.ceilings.current.version == 2
    assert slowest < 1.0, slowest  # the parse (seconds) never held the loop


def test_a_failing_background_task_is_counted_and_restarted() -> None:
    registry = CollectorRegistry()
    failures = Counter("failures", "-", ["task"], registry=registry)
    runs = 0

    async def flaky() -> None:
        nonlocal runs
        runs += 1
        if runs < 3:
            raise RuntimeError("boom")

    async def main() -> None:
        with anyio.fail_after(10):
            await supervised("flaky", flaky, failures)

    anyio.run(main)
    assert runs == 3
    assert registry.get_sample_value("failures_total", {"task": "flaky"}) == 2


@pytest.mark.e2e
def test_serve_check_fails_when_serve_would(tmp_path: Path) -> None:
    ceilings = tmp_path / "ceilings.yaml"
    ceilings.write_text(yaml.safe_dump({**doc(1), "version": 2**64}))
    config = tmp_path / "sidecar.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "upstreams": {"openai": {"base_url": "http://127.0.0.1:9/v1"}},
                "models": [{"match": "gpt-4o", "window": 128000}],
                "ceilings_file": str(ceilings),
            }
        )
    )
    r = ceiling("serve", "--config", str(config), "--check")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "version" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    ceilings.write_text(yaml.safe_dump(doc(1)))
    r = ceiling("serve", "--config", str(config), "--check")
    assert r.returncode == 0 and "config ok" in r.stdout, r.stderr


@pytest.mark.e2e
@pytest.mark.parametrize("value", [float("nan"), float("inf"), 10**30])
def test_no_number_in_the_config_is_out_of_range(value: float, tmp_path: Path) -> None:
    config = tmp_path / "sidecar.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "upstreams": {"openai": {"base_url": "http://127.0.0.1:9/v1"}},
                "models": [{"match": "gpt-4o", "window": 128000}],
                "limits": {"shutdown_grace_seconds": value},
            }
        )
    )
    r = ceiling("serve", "--config", str(config), "--check")
    assert r.returncode == 2 and "shutdown_grace_seconds" in r.stderr, r.stderr
