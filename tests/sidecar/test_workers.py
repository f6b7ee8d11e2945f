"""`ceiling serve` with several worker processes, as deployed: one port, the pod's metrics summed
over its workers whichever answers the scrape, a pushed ceiling running in every worker before the
push is answered, a replaced worker catching up, SIGHUP reloading every worker, SIGTERM draining
them all."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import pytest
import yaml
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families

from testkit.doubles.hosted_provider import HostedProviderDouble
from testkit.serving import ceiling_serve, free_port, serve
from testkit.traffic.ceiling_docs import doc, entry
from tests.sidecar.test_serve_process import observing

TOKEN = "admin-token-for-workers"
BODY = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hello there"}]}


@dataclass
class Pod:
    url: str
    proc: subprocess.Popen[bytes]
    shared: Path
    ceilings: Path
    log: Path

    def workers(self) -> set[int]:
        return {int(p.stem.split("-")[1]) for p in self.shared.glob("worker-*.json")}

    def call(self) -> httpx.Response:
        """One request on a new connection (the kernel picks the worker per connection)."""
        r = httpx.post(
            self.url + "/v1/chat/completions", json=BODY, headers={"connection": "close"}
        )
        assert r.status_code == 200, r.text
        return r

    def scrape(self, name: str, **labels: str) -> float:
        text = httpx.get(self.url + "/metrics").text
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                    return s.value
        return 0.0


@pytest.fixture
def pod(tmp_path: Path) -> Iterator[Pod]:
    double = HostedProviderDouble()
    with serve(double.app()) as durl:
        port = free_port()
        ceilings = tmp_path / "ceilings.yaml"
        ceilings.write_text(yaml.safe_dump(doc(1, entry(tokens=90000))))
        cfg = observing(
            port,
            durl,
            ceilings_file=str(ceilings),
            ceilings_persist=False,  # a push reaches the workers without the file
            ceilings_watch=False,  # the file reaches them by SIGHUP only
            admin_token=TOKEN,
            workers=2,
        )
        shared = tmp_path / "multiproc"
        with ceiling_serve(cfg, tmp_path, env={"PROMETHEUS_MULTIPROC_DIR": str(shared)}) as sp:
            p = Pod(sp.url, sp.proc, shared, ceilings, sp.log)
            _until(lambda: len(p.workers()) == 2, "two workers up")
            yield p
            sp.stop(30)


def _until(cond: object, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _served_by_each(shared: Path) -> dict[str, float]:
    """Requests counted in each worker's own metric file."""
    out: dict[str, float] = {}
    for f in shared.glob("counter_*.db"):
        for fam in MultiProcessCollector.merge([str(f)]):  # type: ignore[no-untyped-call]
            for s in fam.samples:
                if s.name == "llm_context_requests_total":
                    out[f.stem] = out.get(f.stem, 0) + s.value
    return out


@pytest.mark.e2e
def test_metrics_are_the_pods_and_a_push_reaches_every_worker(pod: Pod) -> None:
    for _ in range(40):
        pod.call()
    per_worker = _served_by_each(pod.shared)
    assert len(per_worker) == 2 and sum(per_worker.values()) == 40, per_worker
    # whichever worker answers the scrape, the count is the pod's
    for _ in range(6):
        assert pod.scrape("llm_context_requests_total", outcome="ok") == 40
    assert pod.scrape("llm_context_config_version") == 1
    assert pod.scrape("process_resident_memory_bytes") > 0

    pushed = httpx.put(
        pod.url + "/admin/ceilings",
        json=doc(2, entry(tokens=50000)),
        headers={"authorization": f"Bearer {TOKEN}"},
    )
    assert pushed.status_code == 200, pushed.text
    assert pushed.json()["workers"] == 2 and pushed.json()["workers_applied"] == 2
    # `ceiling push` says so too
    newer = pod.log.parent / "v3.yaml"
    newer.write_text(yaml.safe_dump(doc(3, entry(tokens=50000))))
    env = {**os.environ, "CEILING_ADMIN_TOKEN": TOKEN}
    out = subprocess.run(
        [sys.executable, "-m", "context_ceiling.cli", "push", str(newer), "--to", pod.url],
        capture_output=True,
        text=True,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    assert "applied version 3 (2/2 workers)" in out.stdout, out.stdout
    # answered only once every worker runs it: no request after the push sees the old ceiling
    for _ in range(20):
        assert pod.call().headers["x-ceiling-ceiling-tokens"] == "50000"
    assert pod.scrape("llm_context_config_version") == 3
    assert pod.scrape("llm_context_ceiling_tokens", model="gpt-4o", workload="default") == 50000

    # a replaced worker catches up with the push (not persisted to the file) and the counts of
    # the one that died stay in the sum
    victim = min(pod.workers())
    os.kill(victim, signal.SIGKILL)
    _until(lambda: victim not in pod.workers() and len(pod.workers()) == 2, "a replacement")
    for _ in range(20):
        assert pod.call().headers["x-ceiling-ceiling-tokens"] == "50000"
    assert pod.scrape("llm_context_requests_total", outcome="ok") == 80
    assert pod.scrape("llm_context_config_version") == 3


@pytest.mark.e2e
def test_sighup_reloads_every_worker_and_sigterm_drains_them(pod: Pod) -> None:
    pids = pod.workers()
    pod.ceilings.write_text(yaml.safe_dump(doc(7, entry(tokens=33000))))
    pod.proc.send_signal(signal.SIGHUP)
    _until(lambda: pod.scrape("llm_context_config_version") == 7, "version 7 everywhere")
    for _ in range(20):
        assert pod.call().headers["x-ceiling-ceiling-tokens"] == "33000"
    assert pod.workers() == pids, "reloaded, not restarted"
    pod.proc.send_signal(signal.SIGTERM)
    assert pod.proc.wait(timeout=30) == 0
    lines = [json.loads(line) for line in pod.log.read_text().splitlines() if line.strip()]
    assert all("message" in line for line in lines), "one JSON format from every process"
    assert not [line for line in lines if line["logger"] == "uvicorn.access"]
    assert not list(pod.shared.glob("worker-*.json")), "every worker left the group"


@pytest.mark.e2e
def test_workers_do_not_outlive_a_killed_supervisor(pod: Pod) -> None:
    """An OOM-killed supervisor passes no SIGTERM on: its workers notice and shut down."""
    pids = pod.workers()
    pod.proc.kill()
    pod.proc.wait()

    def running(pid: int) -> bool:  # a zombie (exited, not yet reaped by init) is not
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    def gone() -> bool:
        return not any(running(pid) for pid in pids)

    _until(gone, "the orphaned workers to exit")


def test_a_worker_running_a_newer_document_leaves_an_older_push_unconfirmed(
    tmp_path: Path,
) -> None:
    """Two pushes racing to two workers: the older one is not applied over the newer one, and
    the push that lost says so (workers_applied < workers) instead of claiming the pod."""
    import asyncio

    from context_ceiling.ceilings.document import parse_document
    from context_ceiling.core.models import Registry
    from context_ceiling.sidecar.ceilings.store import CeilingStore
    from context_ceiling.sidecar.config import Settings
    from context_ceiling.sidecar.observability.metrics import Metrics
    from context_ceiling.sidecar.observability.staleness import StalenessTracker
    from context_ceiling.sidecar.workers.group import WorkerGroup

    settings = Settings(models=[{"match": "gpt-4o", "window": 128000}])
    registry = Registry(settings.models, None)

    def worker(pid: int) -> tuple[WorkerGroup, CeilingStore]:
        store = CeilingStore(registry, Metrics(), StalenessTracker())
        group = WorkerGroup(tmp_path, pid=pid)
        group.join(store, None)
        return group, store

    (a, sa), (b, sb) = worker(os.getpid()), worker(os.getppid())  # two live pids
    newer = parse_document(json.dumps(doc(5, entry(tokens=40000))).encode(), "t")
    older = parse_document(json.dumps(doc(4, entry(tokens=60000))).encode(), "t")
    sb.apply(newer, "api")
    b.write_snapshot()
    sa.apply(older, "api")
    digest = a.publish(older, force=False)
    b.catch_up()
    assert sb.current.version == 5, "the newer document stays"
    done, of = asyncio.run(_wait(a, digest))
    assert (done, of) == (1, 2)
    # a forced push is applied everywhere, older or not
    digest = a.publish(older, force=True)
    b.catch_up()
    assert sb.current.version == 4
    assert asyncio.run(_wait(a, digest)) == (2, 2)


async def _wait(group: object, digest: str) -> tuple[int, int]:
    import context_ceiling.sidecar.workers.group as g

    g.PUSH_WAIT_S, old = 0.3, g.PUSH_WAIT_S
    try:
        return await group.wait_applied(digest)  # type: ignore[attr-defined, no-any-return]
    finally:
        g.PUSH_WAIT_S = old


def test_a_push_that_missed_a_worker_is_a_failed_push() -> None:
    from context_ceiling.ceilings.push import PushError, _workers

    full = httpx.Response(
        200, json={"applied": True, "version": 4, "workers": 3, "workers_applied": 3}
    )
    assert _workers("http://pod", full) == " (3/3 workers)"
    single = httpx.Response(200, json={"applied": True, "version": 4, "entries": 1})
    assert _workers("http://pod", single) == ""
    short = httpx.Response(
        200, json={"applied": True, "version": 4, "workers": 3, "workers_applied": 2}
    )
    with pytest.raises(PushError, match="on 2 of 3 workers"):
        _workers("http://pod", short)


@pytest.mark.e2e
def test_racing_pushes_leave_one_truth_across_four_workers(tmp_path: Path) -> None:
    """80 pushes racing into 4 workers (persisting on): versions are accepted once each and in
    order, every worker serves the same document soon after, and the file is what runs."""
    import concurrent.futures
    import random

    double = HostedProviderDouble()
    with serve(double.app()) as durl:
        port = free_port()
        ceilings = tmp_path / "ceilings.yaml"
        ceilings.write_text(yaml.safe_dump(doc(1, entry(tokens=90000))))
        cfg = observing(
            port,
            durl,
            ceilings_file=str(ceilings),
            ceilings_persist=True,
            admin_token=TOKEN,
            workers=4,
            limits={"max_header_bytes": 16_384},
        )
        shared = tmp_path / "multiproc"
        with ceiling_serve(cfg, tmp_path, env={"PROMETHEUS_MULTIPROC_DIR": str(shared)}) as sp:
            url = sp.url
            _until(lambda: len(list(shared.glob("worker-*.json"))) == 4, "four workers up")
            rng = random.Random(5)
            # 80 pushes over 20 versions, each with its own content: racing pushes of one
            # version must not both be accepted
            pushes = [(rng.randint(2, 21), 1000 + k) for k in range(80)]

            def push(p: tuple[int, int]) -> tuple[tuple[int, int], int, int]:
                v, tokens = p
                body = doc(v, entry(tokens=tokens))
                r = httpx.put(
                    url + "/admin/ceilings",
                    json=body,
                    headers={"authorization": f"Bearer {TOKEN}", "connection": "close"},
                    timeout=30,
                )
                return p, r.status_code, time.monotonic_ns()

            with concurrent.futures.ThreadPoolExecutor(16) as pool:
                results = list(pool.map(push, pushes))
            accepted = [p for p, status, _ in results if status == 200]
            assert accepted, results
            assert all(status in (200, 422) for _, status, _ in results)
            versions = [v for v, _ in accepted]
            assert len(set(versions)) == len(versions), "a version was accepted twice"
            top, top_tokens = max(accepted)

            def served() -> set[tuple[int, int]]:
                seen = set()
                for _ in range(24):  # new connections: the kernel spreads them over workers
                    got = httpx.get(
                        url + "/admin/ceilings",
                        headers={"authorization": f"Bearer {TOKEN}", "connection": "close"},
                    ).json()
                    seen.add((got["version"], got["entries"][0]["ceiling_tokens"]))
                return seen

            _until(lambda: served() == {(top, top_tokens)}, "every worker on the last push", 15)
            # every worker caps request heads at the configured size too
            big = httpx.get(url + "/healthz", headers={"x-big": "a" * 20_000})
            assert big.status_code == 431
            on_disk = yaml.safe_load(ceilings.read_text())
            assert on_disk["version"] == top
            assert on_disk["entries"][0]["ceiling_tokens"] == top_tokens


@pytest.mark.e2e
def test_after_sigterm_a_connection_is_answered_or_refused_never_left_hanging(pod: Pod) -> None:
    """Clients keep opening connections through a SIGTERM: each one is answered (200) or refused
    at connect; none is accepted and then dropped or left waiting for the drain to end."""
    import threading

    answered: list[int] = []
    refused: list[float] = []
    dropped: list[str] = []
    stop = threading.Event()

    def client() -> None:
        while not stop.is_set():
            start = time.monotonic()
            try:
                r = httpx.post(
                    pod.url + "/v1/chat/completions",
                    json=BODY,
                    # in flight when the signal comes: the drain must wait for them
                    headers={"connection": "close", "x-double-delay": "0.4"},
                    timeout=20,
                )
                if r.status_code == 200:
                    answered.append(r.status_code)
                else:
                    dropped.append(f"status {r.status_code}")
            except httpx.ConnectError:
                refused.append(time.monotonic() - start)
                time.sleep(0.01)
            except httpx.TransportError as e:
                dropped.append(f"{type(e).__name__} after {time.monotonic() - start:.2f}s")

    threads = [threading.Thread(target=client) for _ in range(6)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 20
    while not answered and time.monotonic() < deadline:  # the pod serving (a loaded machine: slow)
        time.sleep(0.05)
    time.sleep(0.5)  # more requests in flight when the signal comes
    before = len(answered)
    pod.proc.send_signal(signal.SIGTERM)
    assert pod.proc.wait(timeout=30) == 0
    time.sleep(0.5)
    stop.set()
    for t in threads:
        t.join()
    assert before > 0 and refused, (before, refused)
    assert not dropped, dropped
    assert max(refused) < 1.0, "a refused connection is refused at once"


def test_the_supervisor_builds_every_worker_with_the_sidecar_server(tmp_path: Path) -> None:
    """uvicorn's supervisor builds workers from its module's ``Process`` (at start, on SIGHUP,
    SIGTTIN and when one dies): while the sidecar's supervisor runs that is its ``Worker``,
    whose server takes queued connections at shutdown; afterwards uvicorn's own again."""
    from uvicorn import Config
    from uvicorn.supervisors import multiprocess

    from context_ceiling.sidecar.server import SidecarServer
    from context_ceiling.sidecar.workers.supervisor import Supervisor, Worker

    seen: list[object] = []

    class Probe(Supervisor):
        def init_processes(self) -> None:
            seen.append(multiprocess.Process)
            self.should_exit.set()

        def terminate_all(self) -> None:
            pass

        def join_all(self) -> None:
            pass

    handlers = {s: signal.getsignal(s) for s in multiprocess.SIGNALS}
    before = multiprocess.Process
    try:
        config = Config("tests:app", workers=2)
        Probe(config, [], tmp_path).run()
        assert seen == [Worker]
        assert multiprocess.Process is before
        assert type(Worker(config, []).server) is SidecarServer
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
