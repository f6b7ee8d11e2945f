"""The in-cluster sweep, run as the chart renders it: two Indexed-Job shard pods (processes) with the
CronJob's own arguments sweep a scripted model through a real sidecar's bypass, the last one merges
and derives, and updates the ceilings ConfigMap through an API server double that authorizes with
the chart's own Role; a kubelet stand-in projects the ConfigMap into the directory the sidecar
watches, and the sidecar hot-reloads the new ceiling."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from context_ceiling.ceilings.document import parse_document
from context_ceiling.ceilings.kube import Cluster, ConfigMaps, KubeError
from context_ceiling.sidecar.app import create_app
from context_ceiling.sidecar.config import Settings
from context_ceiling.sweep.taskset import load_taskset
from testkit import wait_for
from testkit.doubles.kube_apiserver import KubeApiServerDouble, kubeconfig, serve_cluster
from testkit.doubles.scripted_model import ScriptedModelDouble
from testkit.serving import serve
from tests.deploy.test_helm import CHART, by_kind, helm, render  # noqa: F401  (helm is a fixture)

pytestmark = [pytest.mark.helm, pytest.mark.slow]


TOKEN = "admin-token-for-tests"
SA_TOKEN = "service-account-token"
NS = "llm"
CEILING = str(Path(sys.executable).parent / "ceiling")
SWEEP_VALUES = {
    "adminToken": {"value": TOKEN},
    "config": {
        "models": [
            {"match": "scripted", "label": "scripted-8k", "window": 8192, "max_output_tokens": 512}
        ],
        "workloads": ["default", "rag"],
    },
    "sweep": {
        "enabled": True,
        "shards": 2,
        "model": "scripted",
        "modelLabel": "scripted-8k",
        "workload": "rag",
        "mode": "enforce",
        "window": 8192,
        "tokenizer": "o200k_base",
        "items": 6,
        "acceptUnresolved": True,  # 6 items cannot resolve 0.05: the test checks the plumbing
        "levels": "0.2,0.6",
        "repeats": 1,
        "storage": {"create": True},
    },
}


def project(cm_dir: Path) -> Any:
    """The kubelet's ConfigMap volume update: a new timestamped dir, then an atomic ..data swap."""
    n = [0]

    def write(name: str, data: dict[str, str]) -> None:
        n[0] += 1
        new = cm_dir / f"..v{n[0]}"
        new.mkdir()
        for k, v in data.items():
            (new / k).write_text(v)
            if not (cm_dir / k).is_symlink():
                os.symlink(f"..data/{k}", cm_dir / k)
        os.symlink(new.name, cm_dir / "..data_tmp")
        os.replace(cm_dir / "..data_tmp", cm_dir / "..data")

    return write


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """A pod's service account (token, namespace; ca.crt once the API server is served); no
    kubeconfig anywhere (HOME is empty), so the in-cluster path is the one taken."""
    sa = tmp_path / "serviceaccount"
    sa.mkdir()
    (sa / "token").write_text(SA_TOKEN)
    (sa / "namespace").write_text(NS)
    monkeypatch.setenv("CEILING_KUBE_SERVICEACCOUNT", str(sa))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    return {"sa": sa}


def in_pod(monkeypatch: pytest.MonkeyPatch, sa: Path, port: int, ca: Path) -> dict[str, str]:
    """The environment the kubelet gives a pod whose API server listens on ``port``."""
    (sa / "ca.crt").write_bytes(ca.read_bytes())
    env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(port)}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return env


def test_chart_sweep_job_end_to_end(
    helm: list[str],  # noqa: F811
    tmp_path: Path,
    cluster: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(SWEEP_VALUES))
    docs = render(helm, values)
    [role] = by_kind(docs, "Role")
    [cron] = by_kind(docs, "CronJob")
    ceilings_cm = next(
        d for d in by_kind(docs, "ConfigMap") if d["metadata"]["name"].endswith("-ceilings")
    )
    [container] = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]

    # the kubelet-projected ConfigMap volume the gateway replica watches, and the API server
    cm_dir = tmp_path / "ceilings-volume"
    cm_dir.mkdir()
    kubelet = project(cm_dir)
    api = KubeApiServerDouble(SA_TOKEN, NS, role["rules"], on_write=kubelet)
    api.write(ceilings_cm["metadata"]["name"], ceilings_cm["data"])

    model = ScriptedModelDouble(load_taskset("contracts"), 8192, knee=0.45)
    with serve(model.app()) as model_url, serve_cluster(api, tmp_path / "api") as served:
        pod_env = in_pod(monkeypatch, cluster["sa"], served.port, served.ca)
        settings = Settings(
            upstreams={"openai": {"base_url": model_url + "/v1"}},
            models=SWEEP_VALUES["config"]["models"],  # type: ignore[index]
            workloads=["default", "rag"],
            admin_token=TOKEN,
            ceilings_file=str(cm_dir / "ceilings.yaml"),
        )
        app = create_app(settings)
        with serve(app) as sidecar_url:
            state = app.state.sidecar
            assert state.ceilings.current.version == 0
            # the pods' arguments, as rendered; only the cluster addresses are this machine's
            args = [
                f"--base-url={sidecar_url}/v1"
                if a.startswith("--base-url=")
                else f"--root={tmp_path / 'runs'}"
                if a.startswith("--root=")
                else a
                for a in container["args"]
            ]
            assert f"--configmap={ceilings_cm['metadata']['name']}" in args and "--bypass" in args
            (tmp_path / "runs").mkdir()
            env_names = {e["name"] for e in container["env"]}
            assert {"JOB_NAME", "CEILING_ADMIN_TOKEN"} <= env_names
            env = (
                os.environ
                | {
                    "JOB_NAME": "t-context-ceiling-sweep-29400000",
                    "CEILING_ADMIN_TOKEN": TOKEN,
                }
                | pod_env
            )
            pods = [
                subprocess.Popen(
                    [CEILING, *args],
                    env=env | {"JOB_COMPLETION_INDEX": str(i)},
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                )
                for i in range(2)
            ]
            outputs = [p.communicate(timeout=300)[0] for p in pods]
            assert [p.returncode for p in pods] == [0, 0], outputs
            assert sum("finalized" in o for o in outputs) == 1, outputs

            # the ConfigMap got exactly one conditional write: the derived document, version 1
            assert [r for r in api.requests if r[0] == "patch"] == [
                ("patch", ceilings_cm["metadata"]["name"])
            ]
            live = parse_document(api.configmaps[ceilings_cm["metadata"]["name"]]["ceilings.yaml"])
            [entry] = live.entries
            assert (live.version, entry.model, entry.workload, entry.mode) == (
                1,
                "scripted-8k",
                "rag",
                "enforce",
            )
            assert 0 < entry.ceiling_tokens < 8192
            # ... which the replica hot-reloaded from its projected volume, without a restart
            assert wait_for(lambda: state.ceilings.current.version == 1)
            assert (
                state.metrics.registry.get_sample_value(
                    "llm_context_ceiling_tokens", {"model": "scripted-8k", "workload": "rag"}
                )
                == entry.ceiling_tokens
            )
            # every sweep call went through the bypass: none was trimmed or counted as over
            assert not state.metrics.registry.get_sample_value(
                "llm_context_trimmed_tokens_total",
                {"model": "scripted-8k", "workload": "rag", "kind": "retrieved"},
            )
            run = tmp_path / "runs" / "t-context-ceiling-sweep-29400000"
            assert (run / "merged" / "report.html").exists() and (run / "finalized").exists()

            # a retried pod after the fact changes nothing
            again = subprocess.run(
                [CEILING, *args],
                env=env | {"JOB_COMPLETION_INDEX": "1"},
                capture_output=True,
                text=True,
            )
            assert again.returncode == 0 and "already finalized" in again.stdout
            assert len([r for r in api.requests if r[0] == "patch"]) == 1


def test_configmap_updates_are_conditional_and_least_privilege(
    tmp_path: Path, cluster: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from context_ceiling.cli import main
    from testkit.traffic.ceiling_docs import doc, entry

    rules = [
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "resourceNames": ["c-ceilings"],
            "verbs": ["get", "patch"],
        }
    ]
    api = KubeApiServerDouble(SA_TOKEN, NS, rules)
    api.write("c-ceilings", {"ceilings.yaml": yaml.safe_dump(doc(3))})
    api.write("other", {"x": "y"})
    new = tmp_path / "new.yaml"
    with serve_cluster(api, tmp_path / "api") as served:
        in_pod(monkeypatch, cluster["sa"], served.port, served.ca)
        # an older or equal version is refused and nothing is written
        new.write_text(yaml.safe_dump(doc(3, entry(tokens=1000))))
        assert main(["push", str(new), "--to-configmap", "c-ceilings"]) == 1
        assert parse_document(api.configmaps["c-ceilings"]["ceilings.yaml"]).version == 3
        # a newer one is written, and a dry run shows the change without writing it
        new.write_text(yaml.safe_dump(doc(4, entry(tokens=1000))))
        assert main(["push", str(new), "--to-configmap", "c-ceilings", "--dry-run"]) == 0
        assert parse_document(api.configmaps["c-ceilings"]["ceilings.yaml"]).version == 3
        assert main(["push", str(new), "--to-configmap", "c-ceilings"]) == 0
        assert parse_document(api.configmaps["c-ceilings"]["ceilings.yaml"]).version == 4
        # someone else changed it between our read and our write: 409, nothing written
        with ConfigMaps(Cluster.resolve()) as cms:
            seen = cms.get("c-ceilings")
            api.write("c-ceilings", {"ceilings.yaml": yaml.safe_dump(doc(5))})
            with pytest.raises(KubeError, match=r"409.*nothing was written"):
                cms.put_key(seen, "ceilings.yaml", "version: 99")
            # the Role allows that one ConfigMap only
            with pytest.raises(KubeError, match=r"403.*Role grants get and patch"):
                cms.get("other")
        assert parse_document(api.configmaps["c-ceilings"]["ceilings.yaml"]).version == 5
        # a bad service account token is a clear error
        (cluster["sa"] / "token").write_text("wrong")
        assert main(["push", str(new), "--to-configmap", "c-ceilings"]) == 1
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST")
    assert main(["push", str(new), "--to-configmap", "c-ceilings"]) == 1  # not in a pod


def test_push_to_configmap_from_a_workstation_reads_the_kubeconfig(
    tmp_path: Path,
    cluster: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Outside a cluster, as the chart's NOTES print it: the kubeconfig's server, CA, user and
    context namespace (``--kubeconfig``, ``$KUBECONFIG`` or ``~/.kube/config``), ``--context``
    to pick another; the token a user has, not a service account's."""
    from context_ceiling.cli import main
    from testkit.traffic.ceiling_docs import doc, entry

    rules = [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "patch"]}]
    api = KubeApiServerDouble("alice-token", NS, rules)
    api.write("c-ceilings", {"ceilings.yaml": yaml.safe_dump(doc(1))})
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    new = tmp_path / "new.yaml"
    push = ["push", str(new), "--to-configmap", "c-ceilings"]

    def live() -> int:
        return parse_document(api.configmaps["c-ceilings"]["ceilings.yaml"]).version

    with serve_cluster(api, tmp_path / "api") as served:
        contexts = {"prod": ("alice-token", NS), "dev": ("alice-token", "dev"), "bad": ("x", NS)}
        config = kubeconfig(tmp_path / "kc.yaml", served, contexts, current="dev")
        # no kubeconfig and not in a pod: one line that says what to give
        new.write_text(yaml.safe_dump(doc(2, entry(tokens=1000))))
        assert main(push) == 1
        assert "no kubeconfig" in capsys.readouterr().err
        # --kubeconfig at its current context: the dev namespace, where the ConfigMap is not
        assert main([*push, "--kubeconfig", str(config)]) == 1
        assert 'namespace "dev"' in capsys.readouterr().err and live() == 1
        # --context picks prod and its namespace
        assert main([*push, "--kubeconfig", str(config), "--context", "prod"]) == 0
        assert "configmap llm/c-ceilings: written" in capsys.readouterr().out and live() == 2
        # $KUBECONFIG, and --namespace over the context's
        monkeypatch.setenv("KUBECONFIG", str(config))
        new.write_text(yaml.safe_dump(doc(3, entry(tokens=900))))
        assert main([*push, "--namespace", NS]) == 0 and live() == 3
        monkeypatch.delenv("KUBECONFIG")
        # ~/.kube/config, its current context prod
        kubeconfig(tmp_path / "home" / ".kube" / "config", served, contexts, current="prod")
        new.write_text(yaml.safe_dump(doc(4, entry(tokens=800))))
        assert main([*push, "--dry-run"]) == 0 and live() == 3
        assert main(push) == 0 and live() == 4
        # a user the API server does not know: 401, said as such, nothing written
        new.write_text(yaml.safe_dump(doc(5, entry(tokens=700))))
        assert main([*push, "--context", "bad"]) == 1
        err = capsys.readouterr().err
        assert "401" in err and "credentials" in err and live() == 4
        # a context the kubeconfig lacks
        assert main([*push, "--context", "nope"]) == 1
        assert "nope" in capsys.readouterr().err
    # every call carried the kubeconfig user's token over TLS: the double refused none of ours
    assert ("patch", "c-ceilings") in api.requests


def test_job_argument_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from context_ceiling.cli import main

    base = ["sweep", "job", "--root", str(tmp_path), "--run-id", "r", "--shards", "2"]
    base += ["--model-label", "m"]
    assert main([*base, "--index", "2", "--", "--model", "x"]) == 2
    assert "outside 0..1" in capsys.readouterr().err
    assert main([*base, "--index", "0", "--", "--out", "x"]) == 2
    assert "--out is set by the job" in capsys.readouterr().err
    assert main([*base, "--index", "0", "--", "--shard=1/2"]) == 2
    assert "--shard is set by the job" in capsys.readouterr().err
    assert main([*base[:-4], "--shards", "2", "--model-label", "m", "--"]) == 2
    assert (
        main(
            [
                "sweep",
                "job",
                "--root",
                str(tmp_path / "nope"),
                "--run-id",
                "r",
                "--index",
                "0",
                "--shards",
                "1",
                "--model-label",
                "m",
            ]
        )
        == 2
    )
    assert "not mounted" in capsys.readouterr().err
