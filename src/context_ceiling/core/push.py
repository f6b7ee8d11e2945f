"""``ceiling push``: send a ceilings document to running sidecars or into a file.

To sidecars, through their admin API (``PUT /admin/ceilings``, bearer token from
``CEILING_ADMIN_TOKEN``); into a file (for example a ConfigMap checkout) by an atomic write. The
document is validated locally first; ``--dry-run`` shows per model/workload what would change and
runs every check the real push would: each sidecar validates the document itself
(``POST /admin/ceilings/validate``: version, windows against its registry, its file), a file or a
ConfigMap gets the version check, and whatever would be refused fails the dry run too.
"""

from __future__ import annotations

import os
from pathlib import Path

import httpx

from context_ceiling.core.ceilings import (
    EMPTY,
    CeilingsDocument,
    CeilingsError,
    diff,
    dump_document,
    load_document,
    parse_document,
)
from context_ceiling.core.errors import CeilingError


class PushError(CeilingError):
    """A target refused or could not be reached; the message says which and why."""


def _workers(base: str, r: httpx.Response) -> str:
    """A sidecar with several workers says how many run the document; a push that did not reach
    every one of them within the sidecar's wait is a failed push."""
    try:
        body = r.json()
        of, done = int(body["workers"]), int(body["workers_applied"])
    except (ValueError, KeyError, TypeError):
        return ""  # one process (or an older sidecar): applied means applied
    if done < of:
        raise PushError(
            f"{base}: applied version {body.get('version')} on {done} of {of} workers only (the "
            "others still run another document; a newer one may have been pushed concurrently)"
        )
    return f" ({done}/{of} workers)"


def _token() -> str:
    token = os.environ.get("CEILING_ADMIN_TOKEN", "")
    if not token:
        raise CeilingsError(
            "CEILING_ADMIN_TOKEN", ["set it to the sidecars' admin token to push to --to targets"]
        )
    return token


def _admin_url(base: str) -> str:
    return base.rstrip("/") + "/admin/ceilings"


def fetch_running(client: httpx.Client, base: str, token: str) -> CeilingsDocument:
    r = client.get(_admin_url(base), headers={"authorization": f"Bearer {token}"})
    if r.status_code != 200:
        raise PushError(f"{base}: GET /admin/ceilings answered {r.status_code}: {_reason(r)}")
    return parse_document(r.content, base)


def _reason(r: httpx.Response) -> str:
    try:
        err = r.json()["error"]
        reasons = err.get("reasons")
        return str(err["message"]) + (": " + "; ".join(reasons) if reasons else "")
    except (ValueError, KeyError, TypeError):
        return r.text[:200]


def _refused(dry_run: bool) -> str:
    return "would be refused: " if dry_run else ""


def _validate(
    client: httpx.Client, base: str, token: str, doc: CeilingsDocument, force: bool
) -> str:
    """The sidecar's own verdict on ``doc`` (``POST /admin/ceilings/validate``), applying
    nothing; raises :class:`PushError` with its reasons when it would refuse the document."""
    r = client.post(
        _admin_url(base) + "/validate",
        content=dump_document(doc, "json"),
        params={"force": "true"} if force else None,
        headers={"authorization": f"Bearer {token}", "content-type": "application/json"},
    )
    if r.status_code == 404:
        raise PushError(
            f"{base}: cannot dry-run: it has no /admin/ceilings/validate (a sidecar older than "
            "this CLI); nothing was sent to it"
        )
    if r.status_code != 200:
        raise PushError(f"{base}: would be refused ({r.status_code}): {_reason(r)}")
    return f"{base}: would apply version {doc.version} (dry run: validated by the sidecar)"


def push(
    path: str | Path,
    to: list[str],
    file: str | Path | None = None,
    *,
    configmap: str | None = None,
    namespace: str | None = None,
    dry_run: bool = False,
    force: bool = False,
    timeout: float = 10.0,
) -> list[str]:
    """Push; returns the report lines. Raises CeilingsError for a bad document or token and
    PushError (after trying every target) when any target failed.

    ``configmap`` is ``NAME`` or ``NAME/KEY`` (key ``ceilings.yaml`` by default) in the pod's own
    namespace (or ``namespace``), updated with the pod's service account: the source of truth that
    every replica mounted from it reloads."""
    doc = load_document(path)
    lines: list[str] = []
    failures: list[str] = []
    if configmap is not None:
        try:
            lines += _to_configmap(doc, configmap, namespace, dry_run, force, timeout)
        except PushError as exc:
            failures.append(str(exc))
    if file is not None:
        target = Path(file)
        old = load_document(target) if target.exists() else EMPTY
        same = old is not EMPTY and doc.same_content(old)
        if same:
            lines.append(f"{target}: unchanged (version {doc.version})")
        else:
            lines.append(f"{target}: version {old.version} -> {doc.version}")
            lines += ["  " + c.line() for c in diff(old, doc)]
        if not same:
            if not force and not doc.is_newer_than(old):
                failures.append(
                    f"{target}: {_refused(dry_run)}version {doc.version} is not newer than "
                    f"{old.version} (use --force)"
                )
            elif dry_run:
                lines.append(f"{target}: would be written (dry run)")
            else:
                from context_ceiling.core.ceilings import write_atomically

                write_atomically(target, dump_document(doc))
                lines.append(f"{target}: written")
    if to:
        token = _token()
        with httpx.Client(timeout=timeout, trust_env=False) as client:
            for base in to:
                try:
                    old = fetch_running(client, base, token)
                    if old is not EMPTY and doc.same_content(old):
                        lines.append(f"{base}: unchanged (version {doc.version})")
                        continue  # re-applying the running document is a no-op (GitOps)
                    lines.append(f"{base}: version {old.version} -> {doc.version}")
                    lines += ["  " + c.line() for c in diff(old, doc)]
                    if dry_run:
                        lines.append(_validate(client, base, token, doc, force))
                        continue
                    r = client.put(
                        _admin_url(base),
                        content=dump_document(doc, "json"),
                        params={"force": "true"} if force else None,
                        headers={
                            "authorization": f"Bearer {token}",
                            "content-type": "application/json",
                        },
                    )
                    if r.status_code != 200:
                        raise PushError(f"{base}: rejected ({r.status_code}): {_reason(r)}")
                    lines.append(f"{base}: applied version {doc.version}{_workers(base, r)}")
                except (PushError, CeilingsError) as exc:
                    failures.append(str(exc))
                except httpx.HTTPError as exc:
                    failures.append(f"{base}: unreachable: {type(exc).__name__}")
    if failures:
        raise PushError("\n".join(lines + failures))
    return lines


def _to_configmap(
    doc: CeilingsDocument,
    target: str,
    namespace: str | None,
    dry_run: bool,
    force: bool,
    timeout: float,
) -> list[str]:
    from context_ceiling.core.kube import Cluster, ConfigMaps, KubeError, split_target

    name, key = split_target(target)
    try:
        with ConfigMaps(Cluster.in_cluster(namespace), timeout) as cms:
            where = f"configmap {cms.cluster.namespace}/{name}"
            cm = cms.get(name)
            text = cm.data.get(key, "")
            try:
                old = parse_document(text, f"{where}:{key}") if text.strip() else EMPTY
            except CeilingsError:
                if not force:
                    raise PushError(
                        f"{where}: the live {key} is not a valid ceilings document; "
                        "--force replaces it"
                    ) from None
                old = EMPTY
            if old is not EMPTY and doc.same_content(old):
                return [f"{where}: unchanged (version {doc.version})"]
            lines = [f"{where}: version {old.version} -> {doc.version}"]
            lines += ["  " + c.line() for c in diff(old, doc)]
            if not force and not doc.is_newer_than(old):
                raise PushError(
                    "\n".join(lines)
                    + f"\n{where}: {_refused(dry_run)}version {doc.version} is not newer than "
                    f"{old.version} (use --force)"
                )
            if dry_run:
                return [*lines, f"{where}: would be written (dry run)"]
            cms.put_key(cm, key, dump_document(doc))
            lines.append(
                f"{where}: written (every pod mounting it reloads within the kubelet sync)"
            )
            return lines
    except KubeError as exc:
        raise PushError(str(exc)) from exc
