"""A test double for the Kubernetes API server's ConfigMap endpoints (no kube-apiserver, etcd or
cluster can run on these machines).

It does what the real one does for the two calls the product makes: bearer-token authentication,
RBAC authorization from a Role's rules (the test feeds it the chart's rendered Role, so the sweep
Job is allowed exactly what the chart grants), ``GET`` and JSON merge ``PATCH`` of
``/api/v1/namespaces/NS/configmaps/NAME``, ``resourceVersion`` as a precondition (409 on
mismatch), a new ``resourceVersion`` on every write, and a Status body on errors. ``on_write`` plays
the kubelet: it can project the new data into a directory that a real sidecar watches.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route


def _status(code: int, reason: str, message: str) -> JSONResponse:
    body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message}
    return JSONResponse(body | {"reason": reason, "code": code}, status_code=code)


@dataclass
class KubeApiServerDouble:
    token: str | None  # None: anonymous requests are authenticated (client-go sends no bearer
    # token to a plain-http server, and helm's lookup goes through client-go)
    namespace: str
    rules: list[dict[str, Any]]  # the Role's rules bound to the token's service account
    configmaps: dict[str, dict[str, str]] = field(default_factory=dict)
    on_write: Callable[[str, dict[str, str]], None] | None = None
    versions: dict[str, int] = field(default_factory=dict)
    #: extra metadata (labels, annotations) per ConfigMap, e.g. Helm's ownership marks
    meta: dict[str, dict[str, Any]] = field(default_factory=dict)
    requests: list[tuple[str, str]] = field(default_factory=list)
    _rv: int = 100

    def _allowed(self, verb: str, name: str) -> bool:
        for r in self.rules:
            if (
                "" in r.get("apiGroups", [])
                and "configmaps" in r.get("resources", [])
                and verb in r.get("verbs", [])
                and (not r.get("resourceNames") or name in r["resourceNames"])
            ):
                return True
        return False

    def _body(self, name: str) -> dict[str, Any]:
        return {
            "kind": "ConfigMap",
            "apiVersion": "v1",
            "metadata": {
                "name": name,
                "namespace": self.namespace,
                "resourceVersion": str(self.versions[name]),
                **self.meta.get(name, {}),
            },
            "data": dict(self.configmaps[name]),
        }

    def write(self, name: str, data: dict[str, str]) -> None:
        """A change made by someone else (kubectl, helm): bumps the resourceVersion."""
        self._rv += 1
        self.configmaps[name] = dict(data)
        self.versions[name] = self._rv
        if self.on_write:
            self.on_write(name, dict(data))

    async def configmap(self, request: Request) -> Response:
        ns, name = request.path_params["ns"], request.path_params["name"]
        verb = {"GET": "get", "PATCH": "patch"}[request.method]
        self.requests.append((verb, name))
        if (
            self.token is not None
            and request.headers.get("authorization") != f"Bearer {self.token}"
        ):
            return _status(401, "Unauthorized", "Unauthorized")
        if ns != self.namespace or not self._allowed(verb, name):
            return _status(
                403,
                "Forbidden",
                f'configmaps "{name}" is forbidden: cannot {verb} resource "configmaps" '
                f'in the namespace "{ns}"',
            )
        if name not in self.configmaps:
            return _status(404, "NotFound", f'configmaps "{name}" not found')
        if verb == "get":
            return JSONResponse(self._body(name))
        if request.headers.get("content-type") != "application/merge-patch+json":
            return _status(415, "UnsupportedMediaType", "unsupported patch type")
        patch = json.loads(await request.body())
        rv = patch.get("metadata", {}).get("resourceVersion")
        if rv is not None and rv != str(self.versions[name]):
            return _status(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on configmaps "{name}": the object has been '
                "modified; please apply your changes to the latest version and try again",
            )
        data = dict(self.configmaps[name])
        for k, v in (patch.get("data") or {}).items():
            if v is None:
                data.pop(k, None)
            else:
                data[k] = v
        self.write(name, data)
        return JSONResponse(self._body(name))

    #: the kinds the chart renders, by group/version: enough discovery for client-go (helm's
    #: ``lookup`` and ``--dry-run=server``) to map every manifest
    KINDS: ClassVar[dict[str, list[tuple[str, str]]]] = {
        "v1": [
            ("configmaps", "ConfigMap"),
            ("services", "Service"),
            ("secrets", "Secret"),
            ("serviceaccounts", "ServiceAccount"),
            ("persistentvolumeclaims", "PersistentVolumeClaim"),
        ],
        "apps/v1": [("deployments", "Deployment")],
        "batch/v1": [("cronjobs", "CronJob"), ("jobs", "Job")],
        "policy/v1": [("poddisruptionbudgets", "PodDisruptionBudget")],
        "autoscaling/v2": [("horizontalpodautoscalers", "HorizontalPodAutoscaler")],
        "rbac.authorization.k8s.io/v1": [("roles", "Role"), ("rolebindings", "RoleBinding")],
    }

    async def discovery(self, request: Request) -> Response:
        path = request.url.path
        if path == "/version":
            return JSONResponse({"major": "1", "minor": "30", "gitVersion": "v1.30.0"})
        if path == "/api":
            return JSONResponse(
                {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}
            )
        if path == "/apis":
            groups = [gv.split("/") for gv in self.KINDS if "/" in gv]
            return JSONResponse(
                {
                    "kind": "APIGroupList",
                    "apiVersion": "v1",
                    "groups": [
                        {
                            "name": g,
                            "versions": [{"groupVersion": f"{g}/{v}", "version": v}],
                            "preferredVersion": {"groupVersion": f"{g}/{v}", "version": v},
                        }
                        for g, v in groups
                    ],
                }
            )
        gv = path.removeprefix("/api/").removeprefix("/apis/")
        if gv not in self.KINDS:
            return _status(404, "NotFound", "the server could not find the requested resource")
        return JSONResponse(
            {
                "kind": "APIResourceList",
                "groupVersion": gv,
                "resources": [
                    {
                        "name": plural,
                        "singularName": kind.lower(),
                        "namespaced": True,
                        "kind": kind,
                        "verbs": ["get", "patch"],
                    }
                    for plural, kind in self.KINDS[gv]
                ],
            }
        )

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route(
                    "/api/v1/namespaces/{ns}/configmaps/{name}",
                    self.configmap,
                    methods=["GET", "PATCH"],
                ),
                Route("/version", self.discovery),
                Route("/api", self.discovery),
                Route("/apis", self.discovery),
                Route("/api/v1", self.discovery),
                Route("/apis/{group}/{version}", self.discovery),
            ]
        )


@dataclass(frozen=True)
class ServedCluster:
    """A :class:`KubeApiServerDouble` on loopback over TLS, as an API server is reached: its
    URL, its port, and the CA that signed its certificate (a pod's ``ca.crt``, a kubeconfig's
    ``certificate-authority``)."""

    url: str
    port: int
    ca: Path


@contextmanager
def serve_cluster(api: KubeApiServerDouble, workdir: Path) -> Iterator[ServedCluster]:
    """Serve ``api`` over HTTPS with a certificate for 127.0.0.1 from a fresh test CA (trustme)
    written under ``workdir``; the client verifies it as it would a cluster's."""
    import trustme

    from testkit.serving import serve

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    workdir.mkdir(parents=True, exist_ok=True)
    key_chain, ca_path = workdir / "apiserver.pem", workdir / "ca.crt"
    cert.private_key_and_cert_chain_pem.write_to_path(str(key_chain))
    ca.cert_pem.write_to_path(str(ca_path))
    with serve(api.app(), ssl_certfile=str(key_chain), ssl_keyfile=str(key_chain)) as url:
        port = int(url.rsplit(":", 1)[1])
        yield ServedCluster(f"https://127.0.0.1:{port}", port, ca_path)


def kubeconfig(
    path: Path, served: ServedCluster, contexts: dict[str, tuple[str, str]], current: str
) -> Path:
    """A kubeconfig at ``path`` for ``served``: one context per name -> (bearer token,
    namespace), ``current`` its current context."""
    import yaml

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": "c",
                        "cluster": {
                            "server": served.url,
                            "certificate-authority": str(served.ca),
                        },
                    }
                ],
                "users": [{"name": n, "user": {"token": t}} for n, (t, _) in contexts.items()],
                "contexts": [
                    {"name": n, "context": {"cluster": "c", "user": n, "namespace": ns}}
                    for n, (_, ns) in contexts.items()
                ],
                "current-context": current,
            }
        )
    )
    return path
