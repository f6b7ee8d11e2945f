"""The one Kubernetes call the product makes: read and conditionally update the ceilings ConfigMap.

The in-cluster sweep Job, and ``ceiling push --to-configmap`` from a workstation or a pod, update
the ConfigMap every gateway replica watches, so a new ceiling reaches all of them through the
kubelet without a restart. The client is lightkube's: it reads a kubeconfig (its contexts, their
namespaces, exec and token users, client certificates) and a pod's service account alike, as
kubectl does. The update is a JSON merge patch that carries the ``resourceVersion`` it read, which
the API server treats as a precondition: if anyone changed the ConfigMap in between, nothing is
written (409) and the caller says so instead of overwriting a newer ceiling. Inside a pod the
chart's Role grants exactly ``get`` and ``patch`` on that one ConfigMap.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from context_ceiling.core.errors import CeilingError

if TYPE_CHECKING:
    from lightkube.config.kubeconfig import SingleConfig

__all__ = [
    "DEFAULT_KEY",
    "SERVICE_ACCOUNT",
    "Cluster",
    "ConfigMap",
    "ConfigMaps",
    "KubeError",
    "split_target",
]

#: where a pod's service account is mounted (``CEILING_KUBE_SERVICEACCOUNT`` names another
#: directory: the same in-cluster path then runs against a loopback API server in tests)
SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")

#: where the ceilings document sits in its ConfigMap (the chart mounts this key)
DEFAULT_KEY = "ceilings.yaml"


def split_target(target: str) -> tuple[str, str]:
    """``NAME`` or ``NAME/KEY`` (ConfigMap names cannot contain a slash)."""
    name, _, key = target.partition("/")
    return name, key or DEFAULT_KEY


class KubeError(CeilingError):
    """No cluster configuration, or the API server could not be reached or refused; the message
    says what to fix."""


def _service_account() -> Path:
    return Path(os.environ.get("CEILING_KUBE_SERVICEACCOUNT", str(SERVICE_ACCOUNT)))


@dataclass(frozen=True)
class Cluster:
    """Which API server, as whom, in which namespace: from a kubeconfig (``kubeconfig``, else
    ``$KUBECONFIG``, else ``~/.kube/config``, at ``context`` or its current one) or, in a pod
    with none of those named, from the pod's service account. ``namespace`` is the one given,
    else the context's (or the service account's), else ``default``."""

    #: lightkube's resolved configuration: server, credentials, context
    config: SingleConfig
    namespace: str
    #: where the configuration came from, for messages
    source: str

    @classmethod
    def resolve(
        cls,
        namespace: str | None = None,
        kubeconfig: str | None = None,
        context: str | None = None,
    ) -> Cluster:
        try:
            from lightkube.config.kubeconfig import KubeConfig
            from lightkube.core.exceptions import ConfigError
        except ImportError:
            raise KubeError(
                "the Kubernetes client is not installed: pip install 'context-ceiling[kube]'"
            ) from None
        named = kubeconfig or os.environ.get("KUBECONFIG")
        in_pod = bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
        try:
            if named or context or not in_pod:
                # a kubeconfig named (or a context in one) wins, as with kubectl; outside a pod
                # the default one is the only configuration there is
                path = Path(named.split(os.pathsep)[0] if named else "~/.kube/config").expanduser()
                if not path.is_file():
                    raise KubeError(
                        f"no kubeconfig at {path} and not running in a Kubernetes pod "
                        "(KUBERNETES_SERVICE_HOST is unset): give --kubeconfig, set KUBECONFIG, "
                        "or run in the cluster"
                    )
                conf = KubeConfig.from_file(path)
                single = conf.get(context_name=context)
                source = f"kubeconfig {path}" + (f", context {context}" if context else "")
            else:
                sa = _service_account()
                if not (sa / "token").is_file():
                    raise KubeError(
                        f"no service account token at {sa / 'token'} "
                        "(is automountServiceAccountToken off for this pod?)"
                    )
                single = KubeConfig.from_service_account(sa).get()
                source = "the pod's service account"
        except ConfigError as exc:
            raise KubeError(f"Kubernetes configuration: {exc}") from exc
        except (KeyError, ValueError, OSError) as exc:
            raise KubeError(
                f"Kubernetes configuration: cannot read it ({type(exc).__name__}: {exc})"
            ) from exc
        if single is None:
            raise KubeError(f"Kubernetes configuration: {source} has no context to use")
        return cls(single, (namespace or single.namespace).strip(), source)


def _errors() -> tuple[type[Exception], ...]:
    """What a call to the API server raises: its refusal (lightkube's ``ApiError``, an HTTP
    status error) and any transport error, both ``httpx2.HTTPError``; a kubeconfig's exec
    plugin failing (``ConfigError``)."""
    import httpx2
    from lightkube.core.exceptions import ConfigError

    return (httpx2.HTTPError, ConfigError)


@dataclass(frozen=True)
class ConfigMap:
    name: str
    data: dict[str, str]
    resource_version: str


class ConfigMaps:
    """Get and conditionally patch ConfigMaps in the cluster's namespace."""

    def __init__(self, cluster: Cluster, timeout: float = 10.0) -> None:
        import httpx2
        from lightkube import Client
        from lightkube.core.exceptions import ConfigError

        self.cluster = cluster
        self.namespace = cluster.namespace
        try:
            self._client = Client(
                cluster.config,
                namespace=cluster.namespace,
                timeout=httpx2.Timeout(timeout),
                field_manager="context-ceiling",
                trust_env=False,
            )
        except (ConfigError, OSError, ValueError) as exc:  # a bad certificate or key file
            raise KubeError(
                f"Kubernetes client from {cluster.source}: {type(exc).__name__}: {exc}"
            ) from exc

    def __enter__(self) -> ConfigMaps:
        return self

    def __exit__(self, *exc: object) -> None:
        self._client.close()

    def _where(self, name: str) -> str:
        return f"ConfigMap {self.namespace}/{name}"

    def _fail(self, name: str, verb: str, exc: Exception) -> KubeError:
        from lightkube.core.exceptions import ApiError, ConfigError

        if not isinstance(exc, ApiError):
            what = (
                "unreachable" if not isinstance(exc, ConfigError) else f"not authenticated: {exc}"
            )
            return KubeError(
                f"{self._where(name)}: API server {what} ({self.cluster.source}): "
                f"{type(exc).__name__}"
            )
        code = exc.status.code or 0
        hint = {
            401: f"the credentials of {self.cluster.source} were refused",
            403: f"{self.cluster.source} may not {verb} it (the chart's Role grants get and "
            "patch on the ceilings ConfigMap only)",
            404: "it does not exist",
            409: "it changed while this update was being made; nothing was written, run again",
        }.get(code, "")
        message = exc.status.message or ""
        return KubeError(
            f"{self._where(name)}: {verb} answered {code}"
            + (f": {hint}" if hint else "")
            + (f" ({message[:200]})" if message else "")
        )

    def get(self, name: str) -> ConfigMap:
        from lightkube.resources.core_v1 import ConfigMap as Resource

        try:
            got = self._client.get(Resource, name)
        except _errors() as exc:
            raise self._fail(name, "get", exc) from exc
        return ConfigMap(
            name, dict(got.data or {}), str(got.metadata and got.metadata.resourceVersion)
        )

    def put_key(self, cm: ConfigMap, key: str, value: str) -> ConfigMap:
        """Set one data key, only if the ConfigMap is still at ``cm.resource_version``."""
        from lightkube.resources.core_v1 import ConfigMap as Resource
        from lightkube.types import PatchType

        patch = {"metadata": {"resourceVersion": cm.resource_version}, "data": {key: value}}
        try:
            got = self._client.patch(Resource, cm.name, patch, patch_type=PatchType.MERGE)
        except _errors() as exc:
            raise self._fail(cm.name, "patch", exc) from exc
        return ConfigMap(
            cm.name, dict(got.data or {}), str(got.metadata and got.metadata.resourceVersion)
        )
