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
from typing import Protocol

import httpx

from context_ceiling.ceilings.document import (
    EMPTY,
    CeilingsDocument,
    CeilingsError,
    diff,
    dump_document,
    load_document,
    parse_document,
    write_atomically,
)
from context_ceiling.ceilings.kube import Cluster, ConfigMaps, KubeError, split_target
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
) -> tuple[str, list[str]]:
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
    line = f"{base}: would apply version {doc.version} (dry run: validated by the sidecar)"
    return line, _unused_of(r)


class Target(Protocol):
    """Where a document goes: a running sidecar, a file, a ConfigMap. Every target is pushed the
    same way (:func:`_apply`): read what runs there, say what changes, check, then write."""

    #: how the target is named in the report
    where: str
    #: the version rule is checked here (a sidecar checks it itself, with its own registry)
    checks_version: bool

    def read(self, force: bool) -> CeilingsDocument:
        """The document in force there (``EMPTY``: none)."""
        ...

    def validate(self, doc: CeilingsDocument, force: bool) -> str:
        """What applying ``doc`` would do, checked as far as the target can without applying
        it; raises :class:`PushError` when it would refuse."""
        ...

    def write(self, doc: CeilingsDocument, force: bool) -> str:
        """Apply ``doc``; raises :class:`PushError` when the target refuses."""
        ...


def _apply(t: Target, doc: CeilingsDocument, dry_run: bool, force: bool, lines: list[str]) -> None:
    """Compare and write, the same for every target: an unchanged document is a no-op (a GitOps
    loop re-pushes it), a changed one is reported with its diff, refused when it is not newer
    (unless forced), then validated (``dry_run``) or written. The report goes to ``lines``;
    a refusal raises :class:`PushError`."""
    old = t.read(force)
    if old is not EMPTY and doc.same_content(old):
        lines.append(f"{t.where}: unchanged (version {doc.version})")
        return
    lines.append(f"{t.where}: version {old.version} -> {doc.version}")
    lines += ["  " + c.line() for c in diff(old, doc)]
    if t.checks_version and not force and not doc.is_newer_than(old):
        raise PushError(
            f"{t.where}: {_refused(dry_run)}version {doc.version} is not newer than "
            f"{old.version} (use --force)"
        )
    lines.append(t.validate(doc, force) if dry_run else t.write(doc, force))


class _Sidecar:
    """A running sidecar, through its admin API."""

    checks_version = False

    def __init__(self, client: httpx.Client, base: str, token: str, strict: bool = False) -> None:
        self.client, self.where, self.token, self.strict = client, base, token, strict

    def read(self, force: bool) -> CeilingsDocument:
        return fetch_running(self.client, self.where, self.token)

    def validate(self, doc: CeilingsDocument, force: bool) -> str:
        line, unused = _validate(self.client, self.where, self.token, doc, force)
        if unused and self.strict:
            raise PushError(f"{self.where}: would be refused (strict): " + "; ".join(unused))
        return line + _unused_note(unused)

    def write(self, doc: CeilingsDocument, force: bool) -> str:
        params = {"force": "true"} if force else {}
        if self.strict:
            params["strict"] = "true"
        r = self.client.put(
            _admin_url(self.where),
            content=dump_document(doc, "json"),
            params=params or None,
            headers={"authorization": f"Bearer {self.token}", "content-type": "application/json"},
        )
        if r.status_code != 200:
            raise PushError(f"{self.where}: rejected ({r.status_code}): {_reason(r)}")
        unused = _unused_of(r)
        return (
            f"{self.where}: applied version {doc.version}{_workers(self.where, r)}"
            + _unused_note(unused)
        )


def _unused_of(r: httpx.Response) -> list[str]:
    try:
        got = r.json().get("unused")
    except ValueError:
        return []
    return [str(x) for x in got] if isinstance(got, list) else []


def _unused_note(unused: list[str]) -> str:
    """The report's warning for entries that enforce nothing (empty: none)."""
    if not unused:
        return ""
    return f"; WARNING {len(unused)} entries enforce nothing: " + "; ".join(unused)


class _File:
    """A file (a ConfigMap checkout, a mounted volume), written atomically."""

    checks_version = True

    def __init__(self, path: Path) -> None:
        self.path, self.where = path, str(path)

    def read(self, force: bool) -> CeilingsDocument:
        return load_document(self.path) if self.path.exists() else EMPTY

    def validate(self, doc: CeilingsDocument, force: bool) -> str:
        return f"{self.where}: would be written (dry run)"

    def write(self, doc: CeilingsDocument, force: bool) -> str:
        write_atomically(self.path, dump_document(doc))
        return f"{self.where}: written"


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
    strict: bool = False,
    kubeconfig: str | None = None,
    context: str | None = None,
) -> list[str]:
    """Push; returns the report lines. Raises CeilingsError for a bad document or token and
    PushError (after trying every target) when any target failed.

    ``configmap`` is ``NAME`` or ``NAME/KEY`` (key ``ceilings.yaml`` by default), updated as
    ``kubeconfig`` (else ``$KUBECONFIG``, else ``~/.kube/config``) at ``context`` says, or in a
    pod with the pod's service account, in ``namespace`` (else the context's or the pod's): the
    source of truth that every replica mounted from it reloads. ``strict``: a sidecar refuses a document with entries
    that would enforce nothing there (they are reported either way)."""
    doc = load_document(path)
    lines: list[str] = []
    failures: list[str] = []
    if configmap is not None:
        try:
            where = (namespace, kubeconfig, context)
            _to_configmap(doc, configmap, where, dry_run, force, timeout, lines)
        except PushError as exc:
            failures.append(str(exc))
    if file is not None:
        try:
            _apply(_File(Path(file)), doc, dry_run, force, lines)
        except (PushError, CeilingsError) as exc:
            failures.append(str(exc))
    if to:
        token = _token()
        with httpx.Client(timeout=timeout, trust_env=False) as client:
            for base in to:
                try:
                    _apply(_Sidecar(client, base, token, strict), doc, dry_run, force, lines)
                except (PushError, CeilingsError) as exc:
                    failures.append(str(exc))
                except httpx.HTTPError as exc:
                    failures.append(f"{base}: unreachable: {type(exc).__name__}")
    if failures:
        raise PushError("\n".join(lines + failures))
    return lines


class _ConfigMap:
    """One key of a ConfigMap, updated with a kubeconfig's credentials or the pod's service
    account: the source of truth that every replica mounting it reloads."""

    checks_version = True

    def __init__(self, cms: ConfigMaps, name: str, key: str) -> None:
        self.cms, self.key = cms, key
        self.where = f"configmap {cms.namespace}/{name}"
        self.cm = cms.get(name)

    def read(self, force: bool) -> CeilingsDocument:
        text = self.cm.data.get(self.key, "")
        try:
            return parse_document(text, f"{self.where}:{self.key}") if text.strip() else EMPTY
        except CeilingsError:
            if not force:
                raise PushError(
                    f"{self.where}: the live {self.key} is not a valid ceilings document; "
                    "--force replaces it"
                ) from None
            return EMPTY

    def validate(self, doc: CeilingsDocument, force: bool) -> str:
        return f"{self.where}: would be written (dry run)"

    def write(self, doc: CeilingsDocument, force: bool) -> str:
        self.cms.put_key(self.cm, self.key, dump_document(doc))
        return f"{self.where}: written (every pod mounting it reloads within the kubelet sync)"


def _to_configmap(
    doc: CeilingsDocument,
    target: str,
    where: tuple[str | None, str | None, str | None],
    dry_run: bool,
    force: bool,
    timeout: float,
    lines: list[str],
) -> None:
    name, key = split_target(target)
    try:
        with ConfigMaps(Cluster.resolve(*where), timeout) as cms:
            _apply(_ConfigMap(cms, name, key), doc, dry_run, force, lines)
    except KubeError as exc:
        raise PushError(str(exc)) from exc
