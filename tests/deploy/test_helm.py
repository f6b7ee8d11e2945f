"""The Helm chart: lint and render every ci/ scenario, validate the manifests, and check what
matters in them (mounts, probes, security context, gated integrations, the rendered config)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from context_ceiling.ceilings.document import parse_document
from context_ceiling.sidecar.config import load_settings
from testkit import REPO
from tests.conftest import PROMTOOL, needs_promtool

pytestmark = [pytest.mark.helm]


CHART = REPO / "helm" / "context-ceiling"
SCENARIOS = sorted(p.name for p in (CHART / "ci").glob("*-values.yaml"))
MONITORING = [
    "--api-versions",
    "monitoring.coreos.com/v1/ServiceMonitor",
    "--api-versions",
    "monitoring.coreos.com/v1/PrometheusRule",
]


@pytest.fixture(scope="module")
def helm(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    binary = subprocess.run(
        ["bash", str(REPO / "scripts" / "helm.sh")], capture_output=True, text=True, check=True
    ).stdout.strip()
    home = tmp_path_factory.mktemp("helm")
    os.environ.update(
        {k: str(home / k) for k in ("HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME")}
    )
    return [binary]


@pytest.fixture(scope="module")
def crd_validator() -> list[str]:
    """The Prometheus Operator's own CRD schemas (npm), to validate ServiceMonitor/PrometheusRule."""
    script = subprocess.run(
        ["bash", str(REPO / "scripts" / "crd_validator.sh")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    return ["node", script]


def render(
    helm: list[str], values: Path | None, *extra: str
) -> dict[tuple[str, str], dict[str, Any]]:
    args = [*helm, "template", "t", str(CHART), "--kube-version", "1.30.0", *extra]
    if values is not None:
        args += ["-f", str(values)]
    out = subprocess.run(args, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


def by_kind(docs: dict[tuple[str, str], dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for (k, _), d in docs.items() if k == kind]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_lint_render_validate(
    helm: list[str], crd_validator: list[str], scenario: str, tmp_path: Path
) -> None:
    values = CHART / "ci" / scenario
    r = subprocess.run(
        [*helm, "lint", "--strict", str(CHART), "-f", str(values)], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stdout + r.stderr
    docs = render(helm, values, *MONITORING)
    manifest = tmp_path / "all.yaml"
    manifest.write_text(
        yaml.safe_dump_all(
            [d for d in docs.values() if not d["apiVersion"].startswith("monitoring.")]
        )
    )
    kv = shutil.which("kubernetes-validate") or str(
        Path(os.sys.executable).parent / "kubernetes-validate"  # type: ignore[attr-defined]
    )
    r = subprocess.run(
        [kv, "-k", "1.30.0", "--strict", str(manifest)], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stdout + r.stderr
    custom = [d for d in docs.values() if d["apiVersion"].startswith("monitoring.")]
    if custom:
        (tmp_path / "custom.yaml").write_text(yaml.safe_dump_all(custom))
        r = subprocess.run(
            [*crd_validator, str(tmp_path / "custom.yaml")], capture_output=True, text=True
        )
        assert r.returncode == 0, r.stdout + r.stderr
        assert r.stdout.count("ok ") == len(custom)
    deployments = by_kind(docs, "Deployment")
    if scenario.startswith("sidecar-in-pod"):
        assert not deployments  # only the configuration: the sidecar runs in the app's own pod
        cfg = next(
            d for d in by_kind(docs, "ConfigMap") if d["metadata"]["name"].endswith("-config")
        )
        (tmp_path / "sidecar.yaml").write_text(cfg["data"]["sidecar.yaml"])
        assert load_settings(tmp_path / "sidecar.yaml").enforcement.mode == "enforce"
        return
    [dep] = deployments
    pod = dep["spec"]["template"]["spec"]
    [c] = pod["containers"]
    # probes on the sidecar's own endpoints
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    # non-root, read-only, nothing escalates
    assert (
        pod["securityContext"]["runAsNonRoot"] is True
        and pod["automountServiceAccountToken"] is False
    )
    sc = c["securityContext"]
    assert (
        sc["readOnlyRootFilesystem"] is True
        and sc["allowPrivilegeEscalation"] is False
        and sc["capabilities"]["drop"] == ["ALL"]
    )
    # the ceilings are mounted as a directory, never with subPath, so ConfigMap updates reach the pod
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert (
        mounts["ceilings"]["mountPath"] == "/etc/context-ceiling/ceilings"
        and "subPath" not in mounts["ceilings"]
    )
    assert all("subPath" not in m for m in c["volumeMounts"])
    # a sidecar config change rolls the pods, a ceilings change is hot-reloaded
    annotations = dep["spec"]["template"]["metadata"]["annotations"]
    assert "checksum/config" in annotations and not any("ceilings" in k for k in annotations)
    # the rendered sidecar.yaml and ceilings load with the product's own validators
    cfg = next(d for d in by_kind(docs, "ConfigMap") if d["metadata"]["name"].endswith("-config"))
    (tmp_path / "sidecar.yaml").write_text(cfg["data"]["sidecar.yaml"])
    settings = load_settings(tmp_path / "sidecar.yaml")
    assert (
        str(settings.ceilings_file) == "/etc/context-ceiling/ceilings/ceilings.yaml"
        and settings.ceilings_persist is False
    )
    assert (
        settings.listen.host == "0.0.0.0" and settings.listen.port == c["ports"][0]["containerPort"]
    )
    ceilings = next(
        d for d in by_kind(docs, "ConfigMap") if d["metadata"]["name"].endswith("-ceilings")
    )
    parse_document(ceilings["data"]["ceilings.yaml"])


def test_monitoring_integrations_are_gated(helm: list[str], tmp_path: Path) -> None:
    gateway = CHART / "ci" / "gateway-monitoring-values.yaml"
    docs = render(helm, gateway, *MONITORING)
    [rule] = by_kind(docs, "PrometheusRule")
    assert (
        by_kind(docs, "ServiceMonitor")
        and by_kind(docs, "HorizontalPodAutoscaler")
        and by_kind(docs, "PodDisruptionBudget")
    )
    dash = next(
        d for d in by_kind(docs, "ConfigMap") if d["metadata"]["name"].endswith("-dashboards")
    )
    assert dash["metadata"]["labels"]["grafana_dashboard"] == "1"
    # the PrometheusRule carries the generated rules (for this release's series), and promtool
    # accepts them
    from dashboards.rules import rules_file

    assert rule["spec"] == rules_file('job="t-context-ceiling", namespace="default"')
    promtool = PROMTOOL
    if promtool:
        (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rule["spec"]))
        r = subprocess.run(
            [promtool, "check", "rules", str(tmp_path / "rules.yaml")],
            capture_output=True,
            text=True,
        )
        assert r.returncode == 0, r.stdout
    # without the CRDs in the cluster, the integrations are not rendered even when enabled
    docs = render(helm, gateway)
    assert not by_kind(docs, "PrometheusRule") and not by_kind(docs, "ServiceMonitor")
    # the minimal install enables nothing optional
    docs = render(helm, None, *MONITORING)
    for kind in (
        "PrometheusRule",
        "ServiceMonitor",
        "HorizontalPodAutoscaler",
        "PodDisruptionBudget",
        "Secret",
    ):
        assert not by_kind(docs, kind), kind


def test_ceilings_from_a_file(helm: list[str], tmp_path: Path) -> None:
    from testkit.traffic.ceiling_docs import doc, entry

    f = tmp_path / "ceilings.yaml"
    f.write_text(yaml.safe_dump(doc(9, entry(tokens=32000))))
    docs = render(helm, None, "--set-file", f"ceilings={f}")
    cm = next(d for d in by_kind(docs, "ConfigMap") if d["metadata"]["name"].endswith("-ceilings"))
    assert parse_document(cm["data"]["ceilings.yaml"]).version == 9


def test_admin_token_wiring(helm: list[str]) -> None:
    def env(docs: dict[tuple[str, str], dict[str, Any]]) -> dict[str, Any]:
        [dep] = by_kind(docs, "Deployment")
        return {
            e["name"]: e for e in dep["spec"]["template"]["spec"]["containers"][0].get("env") or []
        }

    assert "CEILING_ADMIN_TOKEN" not in env(render(helm, None))  # no token: the admin API is off
    docs = render(helm, CHART / "ci" / "gateway-monitoring-values.yaml")
    [secret] = by_kind(docs, "Secret")
    ref = env(docs)["CEILING_ADMIN_TOKEN"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": secret["metadata"]["name"], "key": "token"}
    docs = render(helm, CHART / "ci" / "existing-secret-values.yaml")
    assert not by_kind(docs, "Secret")
    assert env(docs)["CEILING_ADMIN_TOKEN"]["valueFrom"]["secretKeyRef"] == {
        "name": "ceiling-admin",
        "key": "admin-token",
    }


@pytest.mark.parametrize(
    ("values", "needle"),
    [
        ({"config": {"listen": {"port": 1}}}, "config"),
        ({"replicaCount": 0}, "replicaCount"),
        ({"service": {"type": "Ingress"}}, "/service/type"),
        ({"surprise": True}, "surprise"),
        ({"ceilings": {"schema_version": 2, "version": 1}}, "schema_version"),
    ],
)
def test_bad_values_are_rejected_by_the_schema(
    helm: list[str], tmp_path: Path, values: dict[str, Any], needle: str
) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump(values))
    r = subprocess.run(
        [*helm, "lint", "--strict", str(CHART), "-f", str(f)], capture_output=True, text=True
    )
    assert r.returncode != 0 and needle in (r.stdout + r.stderr)


def test_sidecar_in_your_own_pod(helm: list[str], tmp_path: Path) -> None:
    """deployment.enabled=false renders only the configuration; the example pod mounts exactly it."""
    args = [
        *helm,
        "template",
        "app",
        str(CHART),
        "-f",
        str(CHART / "ci" / "sidecar-in-pod-values.yaml"),
        *MONITORING,
    ]
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    docs = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(out) if d}
    assert {k for k, _ in docs} == {"ConfigMap", "Secret"}
    example = yaml.safe_load((REPO / "examples" / "sidecar-in-pod.yaml").read_text())
    pod = example["spec"]["template"]["spec"]
    configmaps = {v["configMap"]["name"] for v in pod["volumes"] if "configMap" in v}
    assert configmaps == {name for kind, name in docs if kind == "ConfigMap"}
    [sidecar] = [c for c in pod["initContainers"] if c["name"] == "context-ceiling"]
    assert sidecar["restartPolicy"] == "Always"  # a native sidecar: up before the app
    secret = sidecar["env"][0]["valueFrom"]["secretKeyRef"]["name"]
    assert ("Secret", secret) in docs
    assert all("subPath" not in m for m in sidecar["volumeMounts"])
    kv = shutil.which("kubernetes-validate") or str(
        Path(sys.executable).parent / "kubernetes-validate"
    )
    r = subprocess.run(
        [kv, "-k", "1.30.0", "--strict", str(REPO / "examples" / "sidecar-in-pod.yaml")],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_crd_validation_catches_a_bad_custom_resource(
    helm: list[str], crd_validator: list[str], tmp_path: Path
) -> None:
    docs = render(helm, CHART / "ci" / "gateway-monitoring-values.yaml", *MONITORING)
    [sm] = by_kind(docs, "ServiceMonitor")
    sm["spec"]["endpoints"][0]["interval"] = "every half minute"
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(sm))
    r = subprocess.run([*crd_validator, str(tmp_path / "bad.yaml")], capture_output=True, text=True)
    assert r.returncode == 1 and "interval" in r.stdout


def test_sweep_job_rbac_volume_and_pod(helm: list[str]) -> None:
    docs = render(helm, CHART / "ci" / "sweep-job-values.yaml")
    full = "t-context-ceiling"
    # least privilege: one Role, get + patch on the ceilings ConfigMap by name, nothing else
    [role] = by_kind(docs, "Role")
    assert role["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "resourceNames": [f"{full}-ceilings"],
            "verbs": ["get", "patch"],
        }
    ]
    assert not by_kind(docs, "ClusterRole") and not by_kind(docs, "ClusterRoleBinding")
    [binding] = by_kind(docs, "RoleBinding")
    sa = docs[("ServiceAccount", f"{full}-sweep")]
    # the gateway's own account (for workload identity) is not the one the Role is bound to
    gateway_sa = docs[("ServiceAccount", full)]
    assert gateway_sa["automountServiceAccountToken"] is False
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": "default"}
    ]
    # the gateway pods get no API token at all; only the sweep pods, under that account
    [dep] = by_kind(docs, "Deployment")
    assert dep["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
    [cron] = by_kind(docs, "CronJob")
    job = cron["spec"]["jobTemplate"]["spec"]
    pod = job["template"]["spec"]
    assert pod["serviceAccountName"] == sa["metadata"]["name"]
    assert pod["automountServiceAccountToken"] is True
    # the sweep runs the image built with the sweep extra; the gateway the sidecar-only one
    assert pod["containers"][0]["image"].endswith(":0.3.0-sweep")
    assert dep["spec"]["template"]["spec"]["containers"][0]["image"].endswith(":0.3.0")
    # one pod per shard, all on one shared claim
    assert job["completionMode"] == "Indexed" and job["completions"] == job["parallelism"] == 4
    [pvc] = by_kind(docs, "PersistentVolumeClaim")
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["runs"]["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"]
    [c] = pod["containers"]
    assert {"name": "runs", "mountPath": "/runs"} in c["volumeMounts"]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert c["args"][:2] == ["sweep", "job"] and "--shards=4" in c["args"]
    assert f"--configmap={full}-ceilings" in c["args"]
    assert cron["spec"]["suspend"] is False and cron["spec"]["concurrencyPolicy"] == "Forbid"
    env = {e["name"]: e for e in c["env"]}
    assert env["JOB_NAME"]["valueFrom"]["fieldRef"]["fieldPath"].endswith("job-name']")
    # without a schedule the CronJob is a template you start by hand
    docs = render(
        helm,
        CHART / "ci" / "sweep-job-values.yaml",
        "--set",
        "sweep.schedule=",
        "--set",
        "sweep.updateConfigMap=false",
    )
    [cron] = by_kind(docs, "CronJob")
    assert cron["spec"]["suspend"] is True
    assert not by_kind(docs, "Role")  # nothing to update: no permission at all
    pod = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert not any(a.startswith("--configmap") for a in pod["containers"][0]["args"])


@pytest.mark.parametrize(
    ("sets", "needle"),
    [
        (["sweep.shards=3"], "needs a volume every shard pod shares"),
        (["sweep.shards=1", "adminToken.value="], "needs adminToken"),
        (["sweep.model="], "model"),
        (["sweep.window=auto", "sweep.shards=1"], "set sweep.window"),
    ],
)
def test_sweep_misconfiguration_is_a_clear_error(
    helm: list[str], sets: list[str], needle: str
) -> None:
    args = [*helm, "template", "t", str(CHART), "-f", str(CHART / "ci" / "sweep-job-values.yaml")]
    args += ["--set", "sweep.storage.create=false"]
    for s_ in sets:
        args += ["--set", s_]
    r = subprocess.run(args, capture_output=True, text=True)
    assert r.returncode != 0 and needle in r.stderr


def test_every_value_is_documented_and_in_the_schema() -> None:
    """Each key in values.yaml carries a `# --` doc comment, on itself or on an ancestor whose
    whole value it is part of (config, ceilings), or is a parent whose every child carries one; and
    the schema knows every top-level key and every sweep key."""
    lines = (CHART / "values.yaml").read_text().splitlines()
    keys: list[tuple[int, int, bool]] = []  # (line, indent, has its own doc comment)
    for n, line in enumerate(lines):
        stripped = line.strip()
        if not stripped or stripped.startswith(("#", "- ")) or ":" not in stripped:
            continue
        k, comments = n - 1, []
        while k >= 0 and lines[k].strip().startswith("#"):
            comments.append(lines[k].strip())
            k -= 1
        keys.append(
            (n, len(line) - len(line.lstrip()), any(c.startswith("# --") for c in comments))
        )

    def children(i: int) -> list[int]:
        out = []
        for j in range(i + 1, len(keys)):
            if keys[j][1] <= keys[i][1]:
                break
            out.append(j)
        return out

    def inherited(i: int) -> bool:
        level = keys[i][1]
        for j in range(i - 1, -1, -1):
            if keys[j][1] < level:
                if keys[j][2]:
                    return True
                level = keys[j][1]
        return False

    def documented(i: int) -> bool:
        kids = [j for j in children(i) if keys[j][1] == min(keys[k][1] for k in children(i))]
        return keys[i][2] or inherited(i) or (bool(kids) and all(documented(j) for j in kids))

    missing = [
        f"line {keys[i][0] + 1}: {lines[keys[i][0]].strip()}"
        for i in range(len(keys))
        if not documented(i)
    ]
    assert not missing, missing
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert set(values) <= set(schema["properties"])
    assert set(values["sweep"]) <= set(schema["properties"]["sweep"]["properties"])


def test_an_upgrade_keeps_a_newer_live_ceilings_document(helm: list[str], tmp_path: Path) -> None:
    """The chart's `lookup`: versions never go backwards when the sweep or a push wrote a newer
    document into the ConfigMap than the values carry; an older live one is replaced."""
    from testkit.doubles.kube_apiserver import KubeApiServerDouble
    from testkit.serving import serve
    from testkit.traffic.ceiling_docs import doc

    rules = [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}]
    api = KubeApiServerDouble(None, "llm", rules)
    name = "t-context-ceiling-ceilings"
    with serve(api.app()) as url:
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "c", "cluster": {"server": url}}],
                    "users": [{"name": "u", "user": {}}],
                    "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                    "current-context": "x",
                }
            )
        )

        def rendered(values_version: int) -> int:
            docs = render(
                helm,
                None,
                "--dry-run=server",
                "--disable-openapi-validation",  # the double serves no OpenAPI schema
                "--kubeconfig",
                str(kubeconfig),
                "-n",
                "llm",
                "--set",
                f"ceilings.version={values_version}",
            )
            return parse_document(docs[("ConfigMap", name)]["data"]["ceilings.yaml"]).version

        api.meta[name] = {  # installed by this release earlier
            "labels": {"app.kubernetes.io/managed-by": "Helm"},
            "annotations": {
                "meta.helm.sh/release-name": "t",
                "meta.helm.sh/release-namespace": "llm",
            },
        }
        api.write(name, {"ceilings.yaml": yaml.safe_dump(doc(7))})
        assert rendered(3) == 7  # the live document is newer: kept
        assert rendered(9) == 9  # the values are newer: they win
        assert ("get", name) in api.requests


def _job_and_rules(
    docs: dict[tuple[str, str], dict[str, Any]],
) -> tuple[str, dict[str, Any]]:
    """The `job` label the chart's own ServiceMonitor gives the series (the operator's rule: the
    Service's name, or the value of the Service label named by jobLabel), and the rendered
    rules."""
    [sm] = by_kind(docs, "ServiceMonitor")
    [svc] = by_kind(docs, "Service")
    key = sm["spec"].get("jobLabel")
    job = svc["metadata"]["labels"][key] if key else svc["metadata"]["name"]
    [rule] = by_kind(docs, "PrometheusRule")
    return job, rule["spec"]


@needs_promtool
@pytest.mark.parametrize(
    ("release", "extra"),
    [
        ("ceiling", []),  # the README's `helm install ceiling ...`
        ("prod-gw", ["--set", "serviceMonitor.jobLabel=app.kubernetes.io/name"]),
        ("x", ["--set", "fullnameOverride=llm-gateway"]),
    ],
)
def test_chart_alerts_fire_for_the_series_its_servicemonitor_produces(
    helm: list[str], tmp_path: Path, release: str, extra: list[str]
) -> None:
    """Whatever the release is called, the chart's rules select exactly the series its own
    ServiceMonitor produces (job and namespace), every alert fires for them (promtool, the same
    cases as the standalone rules), and nothing fires for another job's series."""
    from dashboards.rule_tests import promtool_tests
    from dashboards.rules import rules_file

    out = subprocess.run(
        [
            *helm,
            "template",
            release,
            str(CHART),
            "-n",
            "ml",
            "--kube-version",
            "1.30.0",
            "--set",
            "serviceMonitor.enabled=true",
            "--set",
            "prometheusRule.enabled=true",
            *MONITORING,
            *extra,
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    docs = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(out) if d}
    job, spec = _job_and_rules(docs)
    selector = f'job="{job}", namespace="ml"'
    # with default values, the generated rules with this release's selector, nothing else
    assert spec == rules_file(selector)
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(spec))
    alerts = [r for g in spec["groups"] for r in g["rules"] if "alert" in r]
    tests = promtool_tests(
        "rules.yaml", {"cluster": "c1", "namespace": "ml", "job": job}, selector, alerts
    )
    (tmp_path / "rules_test.yaml").write_text(yaml.safe_dump(tests))
    r = subprocess.run(
        [PROMTOOL or "promtool", "test", "rules", "rules_test.yaml"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_alert_switches_thresholds_and_labels_come_from_values(helm: list[str]) -> None:
    from dashboards.config import ALERTS

    # the values' defaults are the mixin's
    values = yaml.safe_load((CHART / "values.yaml").read_text())["prometheusRule"]["alerts"]
    assert set(values) == set(ALERTS)
    for name, d in ALERTS.items():
        want: dict[str, object] = {"enabled": d.enabled, "severity": d.severity, "for": d.for_}
        if d.threshold is not None:
            want["threshold"] = d.threshold
        want |= {p.key: p.default for p in d.params}
        assert values[name] == want, name
    # with the defaults, an opt-in alert is not deployed
    _, spec = _job_and_rules(
        render(
            helm,
            None,
            *MONITORING,
            "--set",
            "prometheusRule.enabled=true",
            "--set",
            "serviceMonitor.enabled=true",
        )
    )
    deployed = {r["alert"] for g in spec["groups"] for r in g["rules"] if "alert" in r}
    assert deployed == {n for n, d in ALERTS.items() if d.enabled}
    docs = render(helm, CHART / "ci" / "conventions-values.yaml", *MONITORING)
    _, spec = _job_and_rules(docs)
    rules = {r["alert"]: r for g in spec["groups"] for r in g["rules"] if "alert" in r}
    assert "LLMContextNoCeiling" not in rules and len(rules) == len(ALERTS) - 1
    # switched on, with its numbers from the values (minRate from the chart's defaults)
    answers = rules["LLMContextAnswerSignalAboveCeiling"]["expr"]
    assert "> 3 * clamp_min(" in answers and answers.count(">= 50") == 2
    assert "0.02)" in answers and "__" not in answers
    near = rules["LLMContextUtilizationNearCeiling"]
    assert near["for"] == "30m" and near["expr"].count("> 0.85") == 2
    assert rules["LLMContextRequestsRejected"]["labels"] == {
        "severity": "warning",
        "team": "ml-platform",
    }
    assert all(r["labels"]["team"] == "ml-platform" for r in rules.values())
    assert not any(
        "__THRESHOLD__" in r["expr"] or "__SELECTOR__" in r["expr"] for r in rules.values()
    )
    # jobLabel: one job name for every release, and the rules follow it
    assert (
        'absent(up{job="context-ceiling", namespace="default"})'
        in rules["LLMContextSidecarAbsent"]["expr"]
    )
    # a selector of your own (sidecar-in-pod: scraped under your app's job)
    docs = render(
        helm,
        None,
        *MONITORING,
        "--set",
        "prometheusRule.enabled=true",
        "--set",
        'prometheusRule.selector=job="checkout"',
    )
    [rule] = by_kind(docs, "PrometheusRule")
    assert 'absent(up{job="checkout"})' in yaml.safe_dump(rule["spec"])


def test_chart_conventions(helm: list[str]) -> None:
    """Service account with workload-identity annotations, pod metadata, priority, spread,
    extra volumes, NetworkPolicy, Service annotations, ServiceMonitor options, Grafana folder."""
    docs = render(helm, CHART / "ci" / "conventions-values.yaml", *MONITORING)
    [sa] = by_kind(docs, "ServiceAccount")
    assert sa["metadata"]["annotations"]["eks.amazonaws.com/role-arn"].startswith("arn:aws:iam")
    assert sa["automountServiceAccountToken"] is False
    [dep] = by_kind(docs, "Deployment")
    tpl = dep["spec"]["template"]
    pod = tpl["spec"]
    assert pod["serviceAccountName"] == sa["metadata"]["name"]
    assert tpl["metadata"]["annotations"]["example.com/team"] == "ml-platform"
    assert "checksum/config" in tpl["metadata"]["annotations"]
    assert tpl["metadata"]["labels"]["team"] == "ml-platform"
    # the selector stays the chart's own: extra pod labels never change it
    assert "team" not in dep["spec"]["selector"]["matchLabels"]
    assert pod["priorityClassName"] == "high-priority"
    [spread] = pod["topologySpreadConstraints"]
    assert spread["labelSelector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]
    assert {"name": "tokenizers", "configMap": {"name": "my-tokenizers"}} in pod["volumes"]
    mounts = {m["name"]: m for m in pod["containers"][0]["volumeMounts"]}
    assert mounts["tokenizers"]["readOnly"] is True
    [np] = by_kind(docs, "NetworkPolicy")
    assert np["spec"]["podSelector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]
    assert np["spec"]["policyTypes"] == ["Ingress"]
    [ingress] = np["spec"]["ingress"]
    assert ingress["ports"] == [{"port": "http", "protocol": "TCP"}] and len(ingress["from"]) == 2
    [svc] = by_kind(docs, "Service")
    assert svc["metadata"]["annotations"] == {"networking.gke.io/load-balancer-type": "Internal"}
    assert svc["metadata"]["labels"]["tier"] == "gateway"
    [sm] = by_kind(docs, "ServiceMonitor")
    assert sm["spec"]["jobLabel"] == "app.kubernetes.io/name"
    [ep] = sm["spec"]["endpoints"]
    assert ep["scrapeTimeout"] == "10s" and ep["relabelings"] and ep["metricRelabelings"]
    dash = next(
        d for d in by_kind(docs, "ConfigMap") if d["metadata"]["name"].endswith("-dashboards")
    )
    assert dash["metadata"]["annotations"] == {"grafana_folder": "LLM"}
    # the defaults render none of the optional pieces
    docs = render(helm, None)
    assert not by_kind(docs, "NetworkPolicy")
    [dep] = by_kind(docs, "Deployment")
    assert "priorityClassName" not in dep["spec"]["template"]["spec"]
    # an existing account instead of a created one
    docs = render(
        helm, None, "--set", "serviceAccount.create=false", "--set", "serviceAccount.name=gw"
    )
    assert not by_kind(docs, "ServiceAccount")
    assert by_kind(docs, "Deployment")[0]["spec"]["template"]["spec"]["serviceAccountName"] == "gw"


def test_config_schema_is_the_sidecars_own_model(helm: list[str], tmp_path: Path) -> None:
    """The chart's schema for `config` is generated from the pydantic model the sidecar loads:
    a typo or a bad value fails `helm install` with its path instead of crash-looping the pod,
    and what passes loads."""
    from devtools import chart_schema

    current = json.loads((CHART / "values.schema.json").read_text())
    assert (
        chart_schema.text(chart_schema.render(current))
        == (CHART / "values.schema.json").read_text()
    ), "run: python -m devtools.chart_schema"
    # `mode: off` unquoted (YAML reads false): accepted by the schema and by the sidecar
    f = tmp_path / "off.yaml"
    f.write_text("config:\n  enforcement:\n    mode: off\n    workloads: {rag: {mode: off}}\n")
    docs = render(helm, f)
    cfg = next(d for d in by_kind(docs, "ConfigMap") if d["metadata"]["name"].endswith("-config"))
    (tmp_path / "sidecar.yaml").write_text(cfg["data"]["sidecar.yaml"])
    settings = load_settings(tmp_path / "sidecar.yaml")
    assert settings.enforcement.mode == "off"
    assert settings.enforcement.workloads["rag"].mode == "off"
    for bad, needle in [
        ({"enforcement": {"mode": "enforcing"}}, "/config/enforcement/mode"),
        ({"enforcment": {"mode": "enforce"}}, "enforcment"),
        ({"models": [{"match": "gpt-4o*", "window": "big"}]}, "/config/models/0/window"),
        ({"limits": {"max_body_bytes": 10}}, "/config/limits/max_body_bytes"),
        ({"upstreams": {"openai": {"base_url": "https://x/v1", "timeouts": {"reed": 1}}}}, "reed"),
    ]:
        f = tmp_path / "bad.yaml"
        f.write_text(yaml.safe_dump({"config": bad}))
        r = subprocess.run(
            [*helm, "template", "t", str(CHART), "-f", str(f)], capture_output=True, text=True
        )
        assert r.returncode != 0 and needle in r.stderr, (bad, r.stderr)


def test_capture_store_volume(helm: list[str], tmp_path: Path) -> None:
    """config.capture on: the chart sets the store's path (one file per replica) and mounts a
    claim there; more than one replica on a ReadWriteOnce claim is refused with a message."""
    docs = render(helm, CHART / "ci" / "capture-values.yaml")
    [pvc] = by_kind(docs, "PersistentVolumeClaim")
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    assert pvc["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    [dep] = by_kind(docs, "Deployment")
    pod = dep["spec"]["template"]["spec"]
    vols = {v["name"]: v for v in pod["volumes"]}
    assert vols["capture"]["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"]
    mounts = {m["name"]: m for m in pod["containers"][0]["volumeMounts"]}
    assert mounts["capture"]["mountPath"] == "/var/lib/context-ceiling/capture"
    cfg = next(d for d in by_kind(docs, "ConfigMap") if d["metadata"]["name"].endswith("-config"))
    (tmp_path / "sidecar.yaml").write_text(cfg["data"]["sidecar.yaml"])
    s = load_settings(tmp_path / "sidecar.yaml")
    assert s.capture.enabled and s.capture.rate("rag") == 0.05 and s.capture.rate("default") == 0
    assert str(s.capture.store).startswith("/var/lib/context-ceiling/capture/capture-{hostname}")
    r = subprocess.run(
        [
            *helm,
            "template",
            "t",
            str(CHART),
            "-f",
            str(CHART / "ci" / "capture-values.yaml"),
            "--set",
            "capture.persistence.accessModes={ReadWriteOnce}",
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode != 0 and "needs ReadWriteMany" in r.stderr
    # capture off: no volume at all
    [dep] = by_kind(render(helm, None), "Deployment")
    assert "capture" not in {v["name"] for v in dep["spec"]["template"]["spec"]["volumes"]}


def test_a_ceilings_document_the_pods_would_refuse_fails_at_template_time(
    helm: list[str], tmp_path: Path
) -> None:
    """A window the registry disagrees with passes the schema but would crash-loop every pod
    that restarts: the chart refuses it when rendering, naming the entry and both windows."""
    from testkit.traffic.ceiling_docs import doc, entry

    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc(3, entry(tokens=30000, window=64000))))
    args = [
        *helm,
        "template",
        "t",
        str(CHART),
        "--kube-version",
        "1.30.0",
        "--set-file",
        f"ceilings={bad}",
    ]
    r = subprocess.run(args, capture_output=True, text=True)
    assert r.returncode != 0
    assert "gpt-4o/default: window 64000 differs from the registry's 128000" in r.stderr
    over = tmp_path / "over.yaml"
    e = entry(tokens=120000, window=128000, output_reservation=0)
    over.write_text(yaml.safe_dump(doc(3, e)))
    ok = subprocess.run(
        [
            *helm,
            "template",
            "t",
            str(CHART),
            "--kube-version",
            "1.30.0",
            "--set-file",
            f"ceilings={over}",
        ],
        capture_output=True,
        text=True,
    )
    assert ok.returncode == 0, ok.stderr  # within the window: renders


def test_a_ceiling_no_model_uses_fails_at_template_time(helm: list[str], tmp_path: Path) -> None:
    """An entry whose model is no label of config.models would enforce nothing: the render
    fails naming it and the labels (a glob entry is labelled without its glob), unless
    ``ceilingsUnused: allow``."""
    from testkit.traffic.ceiling_docs import doc, entry

    values = tmp_path / "values.yaml"
    values.write_text(
        yaml.safe_dump({"config": {"models": [{"match": "gpt-4o*", "window": 128000}]}})
    )
    base = [*helm, "template", "t", str(CHART), "--kube-version", "1.30.0", "-f", str(values)]
    good, typo = tmp_path / "good.yaml", tmp_path / "typo.yaml"
    good.write_text(yaml.safe_dump(doc(3, entry(model="gpt-4o"))))
    typo.write_text(yaml.safe_dump(doc(3, entry(model="gpt4o"))))
    ok = subprocess.run([*base, "--set-file", f"ceilings={good}"], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    r = subprocess.run([*base, "--set-file", f"ceilings={typo}"], capture_output=True, text=True)
    assert r.returncode != 0
    assert 'no model entry is labelled "gpt4o" (config.models: gpt-4o)' in r.stderr
    allowed = subprocess.run(
        [*base, "--set-file", f"ceilings={typo}", "--set", "ceilingsUnused=allow"],
        capture_output=True,
        text=True,
    )
    assert allowed.returncode == 0, allowed.stderr


def test_image_digest_kube_version_and_notes(helm: list[str]) -> None:
    digest = "sha256:" + "ab" * 32
    docs = render(helm, None, "--set", f"image.digest={digest}")
    [dep] = by_kind(docs, "Deployment")
    image = dep["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == f"ghcr.io/context-ceiling/context-ceiling@{digest}"  # pulled by digest
    old = subprocess.run(
        [*helm, "template", "t", str(CHART), "--kube-version", "1.29.0"],
        capture_output=True,
        text=True,
    )
    assert old.returncode != 0 and "kubeVersion" in old.stderr  # preStop sleep needs 1.30
    notes = subprocess.run(
        [*helm, "install", "t", str(CHART), "--dry-run=client"],  # no cluster needed
        capture_output=True,
        text=True,
    )
    assert notes.returncode == 0, notes.stderr
    assert "base_url = http://t-context-ceiling.default.svc:8787/v1" in notes.stdout


def test_a_separate_admin_port_for_metrics_and_the_admin_api(helm: list[str]) -> None:
    docs = render(
        helm,
        None,
        *MONITORING,
        "--set",
        "service.adminPort=9090",
        "--set",
        "networkPolicy.enabled=true",
        "--set",
        "serviceMonitor.enabled=true",
        "--set-json",
        'networkPolicy.adminFrom=[{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}]',
    )
    [svc] = by_kind(docs, "Service")
    assert {p["name"]: p["port"] for p in svc["spec"]["ports"]} == {"http": 8787, "admin": 9090}
    [dep] = by_kind(docs, "Deployment")
    ports = {p["name"] for p in dep["spec"]["template"]["spec"]["containers"][0]["ports"]}
    assert ports == {"http", "admin"}
    cm = next(d for d in by_kind(docs, "ConfigMap") if d["metadata"]["name"].endswith("-config"))
    assert yaml.safe_load(cm["data"]["sidecar.yaml"])["listen"]["admin_port"] == 9090
    [np] = by_kind(docs, "NetworkPolicy")
    admin_rule = next(r for r in np["spec"]["ingress"] if r["ports"][0]["port"] == "admin")
    assert admin_rule["from"] == [{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}]
    [sm] = by_kind(docs, "ServiceMonitor")
    assert sm["spec"]["endpoints"][0]["port"] == "admin"


def test_ingress_and_httproute(helm: list[str]) -> None:
    docs = render(helm, None, "--set", "ingress.enabled=true", "--set", "ingress.className=nginx")
    [ing] = by_kind(docs, "Ingress")
    rule = ing["spec"]["rules"][0]
    assert rule["host"] == "ceiling.example.com" and ing["spec"]["ingressClassName"] == "nginx"
    assert rule["http"]["paths"][0]["backend"]["service"]["port"] == {"name": "http"}
    missing = subprocess.run(
        [
            *helm,
            "template",
            "t",
            str(CHART),
            "--kube-version",
            "1.30.0",
            "--set",
            "httpRoute.enabled=true",
        ],
        capture_output=True,
        text=True,
    )
    assert missing.returncode != 0 and "Gateway API CRDs" in missing.stderr
    docs = render(
        helm,
        None,
        "--api-versions",
        "gateway.networking.k8s.io/v1/HTTPRoute",
        "--set",
        "httpRoute.enabled=true",
        "--set-json",
        'httpRoute.parentRefs=[{"name": "public", "namespace": "gateways"}]',
    )
    [route] = by_kind(docs, "HTTPRoute")
    assert route["spec"]["parentRefs"] == [{"name": "public", "namespace": "gateways"}]
    assert route["spec"]["rules"][0]["backendRefs"][0]["port"] == 8787
