"""The one Kubernetes call the product makes: read and conditionally update the ceilings ConfigMap.

The in-cluster sweep Job updates the ConfigMap every gateway replica watches, so a new ceiling
reaches all of them through the kubelet without a restart. It needs nothing but ``get`` and
``patch`` on that one ConfigMap (the chart's Role grants exactly that), so a full Kubernetes client
would be weight for no gain: this is two HTTP calls with the pod's service account. The update is a
JSON merge patch that carries the ``resourceVersion`` it read, which the API server treats as a
precondition: if anyone changed the ConfigMap in between, nothing is written (409) and the caller
says so instead of overwriting a newer ceiling.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import httpx

from context_ceiling.core.errors import CeilingError

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


#: where the ceilings document sits in its ConfigMap (the chart mounts this key)
DEFAULT_KEY = "ceilings.yaml"


def split_target(target: str) -> tuple[str, str]:
    """``NAME`` or ``NAME/KEY`` (ConfigMap names cannot contain a slash)."""
    name, _, key = target.partition("/")
    return name, key or DEFAULT_KEY


class KubeError(CeilingError):
    """The API server could not be reached or refused; the message says what to fix."""


@dataclass(frozen=True)
class Cluster:
    """Where the API server is and who we are to it: the pod's service account by default."""

    api: str
    token: str
    namespace: str
    verify: str | bool = True

    @classmethod
    def in_cluster(cls, namespace: str | None = None) -> Cluster:
        # CEILING_KUBE_API and CEILING_KUBE_SERVICEACCOUNT exist so the same code path runs
        # against a loopback API server in tests; in a pod the standard locations apply.
        sa = Path(os.environ.get("CEILING_KUBE_SERVICEACCOUNT", str(SERVICE_ACCOUNT)))
        api = os.environ.get("CEILING_KUBE_API")
        if not api:
            host = os.environ.get("KUBERNETES_SERVICE_HOST")
            if not host:
                raise KubeError(
                    "not running in a Kubernetes pod (KUBERNETES_SERVICE_HOST is unset)"
                )
            port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
            api = f"https://{host}:{port}" if ":" not in host else f"https://[{host}]:{port}"
        try:
            token = (sa / "token").read_text().strip()
        except OSError as exc:
            raise KubeError(
                f"no service account token at {sa / 'token'} "
                "(is automountServiceAccountToken off for this pod?)"
            ) from exc
        if namespace is None:
            try:
                namespace = (sa / "namespace").read_text().strip()
            except OSError as exc:
                raise KubeError("no namespace given and none in the service account") from exc
        ca = sa / "ca.crt"
        return cls(api.rstrip("/"), token, namespace, str(ca) if ca.exists() else True)


@dataclass(frozen=True)
class ConfigMap:
    name: str
    data: dict[str, str]
    resource_version: str


class ConfigMaps:
    """Get and conditionally patch ConfigMaps in one namespace."""

    def __init__(self, cluster: Cluster, timeout: float = 10.0) -> None:
        self.cluster = cluster
        self._client = httpx.Client(
            base_url=f"{cluster.api}/api/v1/namespaces/{cluster.namespace}/configmaps/",
            headers={"authorization": f"Bearer {cluster.token}", "accept": "application/json"},
            verify=cluster.verify,
            timeout=timeout,
            trust_env=False,
        )

    def __enter__(self) -> ConfigMaps:
        return self

    def __exit__(self, *exc: object) -> None:
        self._client.close()

    def _where(self, name: str) -> str:
        return f"ConfigMap {self.cluster.namespace}/{name}"

    def _fail(self, name: str, verb: str, r: httpx.Response) -> KubeError:
        try:
            message = str(r.json().get("message", ""))
        except ValueError:
            message = r.text[:200]
        hint = {
            401: "the service account token was refused",
            403: f"the service account may not {verb} it (the chart's Role grants get and patch on "
            "the ceilings ConfigMap only)",
            404: "it does not exist",
            409: "it changed while this update was being made; nothing was written, run again",
        }.get(r.status_code, "")
        return KubeError(
            f"{self._where(name)}: {verb} answered {r.status_code}"
            + (f": {hint}" if hint else "")
            + (f" ({message})" if message else "")
        )

    def get(self, name: str) -> ConfigMap:
        try:
            r = self._client.get(name)
        except httpx.HTTPError as exc:
            raise KubeError(
                f"{self._where(name)}: API server unreachable: {type(exc).__name__}"
            ) from exc
        if r.status_code != 200:
            raise self._fail(name, "get", r)
        body = r.json()
        return ConfigMap(
            name, dict(body.get("data") or {}), str(body["metadata"]["resourceVersion"])
        )

    def put_key(self, cm: ConfigMap, key: str, value: str) -> ConfigMap:
        """Set one data key, only if the ConfigMap is still at ``cm.resource_version``."""
        patch = {"metadata": {"resourceVersion": cm.resource_version}, "data": {key: value}}
        try:
            r = self._client.patch(
                cm.name,
                content=json.dumps(patch),
                headers={"content-type": "application/merge-patch+json"},
                params={"fieldManager": "context-ceiling"},
            )
        except httpx.HTTPError as exc:
            raise KubeError(
                f"{self._where(cm.name)}: API server unreachable: {type(exc).__name__}"
            ) from exc
        if r.status_code != 200:
            raise self._fail(cm.name, "patch", r)
        body = r.json()
        return ConfigMap(
            cm.name, dict(body.get("data") or {}), str(body["metadata"]["resourceVersion"])
        )
