"""The ceilings document: one schema, written by the sweep, read by every sidecar.

A ceiling is data with a history. Each entry says, for one model and workload, how many input
tokens requests may carry (and what fraction of the window that is), how it was derived
(metric, tolerance, margin), where it came from (sweep run, task set, prompt skeleton, retrieval
settings, corpus, the model version the upstream reported) and what the traffic it was measured
on looked like, so a sidecar can tell when live traffic no longer resembles it.

``model`` is the sidecar registry's label for the model (the ``model`` label of the metrics).
Documents are JSON or YAML; ``version`` increases with every change so a stale push cannot
overwrite a newer ceiling.
"""

from __future__ import annotations

import difflib
import json
import os
import tempfile
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import orjson
import yaml
from pydantic import Field, ValidationError, model_validator

from context_ceiling.core.counting import RequestCount
from context_ceiling.core.errors import UserError
from context_ceiling.core.strict import Strict
from context_ceiling.core.utilization import Component
from context_ceiling.core.vocabulary import ModeValue

SCHEMA_VERSION: Literal[1] = 1
#: the largest version: a signed 64-bit integer, what every consumer (the version gauge, a
#: ConfigMap's annotations, other languages' clients) can hold
MAX_VERSION = 2**63 - 1
#: the largest token count a ceiling, window or reservation may state (a thousand times the
#: longest window offered today): beyond it a number is a typo, and floats lose integers
MAX_TOKENS = 10**12


class Provenance(Strict):
    """Where a ceiling came from; any change here is a reason to re-sweep."""

    sweep_run_id: str | None = None
    task_set: str | None = None
    task_set_hash: str | None = None
    prompt_skeleton_hash: str | None = None
    retrieval: dict[str, Any] = Field(
        default_factory=dict, description="retrieval depth, chunk size, ..."
    )
    corpus_hash: str | None = None
    model_version: str | None = Field(
        default=None, description="the model name the upstream reported"
    )
    note: str | None = None
    decision: dict[str, Any] = Field(
        default_factory=dict,
        description="how firmly the sweep's number stands: resolved, deciding level and interval",
    )


class TrafficFingerprint(Strict):
    """The shape of the requests the ceiling was measured on (means per request)."""

    system_tokens: float = Field(ge=0, le=MAX_TOKENS, default=0, allow_inf_nan=False)
    tool_definition_tokens: float = Field(ge=0, le=MAX_TOKENS, default=0, allow_inf_nan=False)
    retrieved_chunks: float = Field(ge=0, le=MAX_TOKENS, default=0, allow_inf_nan=False)
    retrieved_chunk_tokens: float = Field(
        ge=0,
        le=MAX_TOKENS,
        default=0,
        allow_inf_nan=False,
        description="mean tokens per retrieved chunk",
    )


def traffic_shape(count: RequestCount) -> dict[str, float]:
    """The fingerprint features of one request. The sweep records them for the prompts it
    measured; the sidecar compares live traffic against them."""
    chunks = [p for p in count.parts if p.component is Component.RETRIEVED]
    retrieved = sum(p.tokens for p in chunks)
    return {
        "system_tokens": float(count.components.get(Component.SYSTEM, 0)),
        "tool_definition_tokens": float(count.components.get(Component.TOOL_DEFINITIONS, 0)),
        "retrieved_chunks": float(len(chunks)),
        "retrieved_chunk_tokens": retrieved / len(chunks) if chunks else 0.0,
    }


class CeilingEntry(Strict):
    model: str = Field(min_length=1)
    workload: str = Field(default="default", min_length=1)
    ceiling_tokens: int = Field(
        gt=0, le=MAX_TOKENS, description="the input cap enforced by the sidecar"
    )
    ceiling_utilization: float = Field(
        gt=0, le=1, allow_inf_nan=False, description="ceiling_tokens / window"
    )
    window: int = Field(gt=0, le=MAX_TOKENS)
    output_reservation: int = Field(ge=0, le=MAX_TOKENS, default=0)
    metric: str = "accuracy"
    tolerance: float = Field(ge=0, le=1, default=0.05, allow_inf_nan=False)
    margin: float = Field(ge=0, lt=1, default=0.05, allow_inf_nan=False)
    #: when the ceiling was derived (the sweep writes it); unset in a hand-written entry, whose
    #: age is then unknown: a document is the same document however often it is parsed
    created_at: datetime | None = None
    provenance: Provenance = Field(default_factory=Provenance)
    fingerprint: TrafficFingerprint | None = None
    #: overrides the sidecar's configured mode for this model/workload: roll a new ceiling out in
    #: observe, then push it again with enforce, with no restart
    mode: ModeValue | None = None

    @model_validator(mode="after")
    def _consistent(self) -> CeilingEntry:
        if self.output_reservation >= self.window:
            raise ValueError(
                f"output_reservation {self.output_reservation} must be below window {self.window}"
            )
        if self.ceiling_tokens > self.window - self.output_reservation:
            raise ValueError(
                f"ceiling_tokens {self.ceiling_tokens} is above the window {self.window} minus the "
                f"output reservation {self.output_reservation}"
            )
        implied = self.ceiling_tokens / self.window
        if abs(implied - self.ceiling_utilization) > 0.005:
            raise ValueError(
                f"ceiling_utilization {self.ceiling_utilization} disagrees with ceiling_tokens / window = {implied:.4f}"
            )
        return self

    @property
    def key(self) -> tuple[str, str]:
        return (self.model, self.workload)


class CeilingsDocument(Strict):
    schema_version: Literal[1] = SCHEMA_VERSION
    version: int = Field(ge=0, le=MAX_VERSION)
    updated_at: datetime | None = None
    entries: list[CeilingEntry] = Field(default_factory=list)

    @model_validator(mode="after")
    def _unique(self) -> CeilingsDocument:
        seen: set[tuple[str, str]] = set()
        for e in self.entries:
            if e.key in seen:
                raise ValueError(f"duplicate entry for model {e.model!r} workload {e.workload!r}")
            seen.add(e.key)
        return self

    def same_content(self, other: CeilingsDocument) -> bool:
        """The same document (its version and every entry field), however it was written (YAML,
        JSON, key order) and whenever it was parsed or stamped (``updated_at`` is when a sidecar
        last wrote it, not content): re-applying a file is a no-op."""
        keep = {"schema_version", "version", "entries"}
        return self.model_dump(mode="json", include=keep) == other.model_dump(
            mode="json", include=keep
        )

    def is_newer_than(self, running: CeilingsDocument) -> bool:
        """The version rule, defined once: a document replaces the running one only with a
        higher version (so a stale push or an older file cannot roll ceilings back), unless
        nothing is running yet; ``--force`` is the caller's explicit exception."""
        return running is EMPTY or self.version > running.version

    def lookup(self, model: str, workload: str) -> CeilingEntry | None:
        """The entry for (model, workload), else the model's ``default`` workload entry."""
        return self.index.get((model, workload)) or self.index.get((model, "default"))

    @property
    def index(self) -> dict[tuple[str, str], CeilingEntry]:
        idx: dict[tuple[str, str], CeilingEntry] | None = self.__dict__.get("_index")
        if idx is None:
            idx = {e.key: e for e in self.entries}
            object.__setattr__(self, "_index", idx)  # frozen model: computed once, cached
        return idx


EMPTY = CeilingsDocument(version=0)


class CeilingsError(UserError, ValueError):
    """A document that cannot be used; ``reasons`` lists every problem found."""

    def __init__(self, where: str, reasons: list[str]) -> None:
        self.where = where
        self.reasons = reasons
        super().__init__(f"{where}: " + "; ".join(reasons))


class CeilingsPersistError(CeilingsError):
    """A valid document that could not be written to its file (so it was not applied)."""


def fit_problems(doc: CeilingsDocument, windows: Mapping[str, int]) -> list[str]:
    """Why ``doc`` does not fit a sidecar whose registry has these windows (model label ->
    window): a ceiling above its window, or a window the registry disagrees with. A ceiling for
    a model the registry lacks is no problem (kept, unused)."""
    reasons: list[str] = []
    for e in doc.entries:
        window = windows.get(e.model)
        if window is None:
            continue
        if e.window != window:
            reasons.append(
                f"{e.model}/{e.workload}: window {e.window} differs from the registry's {window}"
            )
        if e.ceiling_tokens > window:
            reasons.append(
                f"{e.model}/{e.workload}: ceiling {e.ceiling_tokens} is above the window {window}"
            )
    return reasons


def unused_entries(
    doc: CeilingsDocument, labels: Collection[str], workloads: Collection[str]
) -> list[str]:
    """Why each entry of ``doc`` would enforce nothing on a sidecar whose registry has these
    model ``labels`` and these ``workloads``: its model is no label there (with the closest
    label), or its workload is not declared. An unused ceiling is a ceiling silently not
    enforced, so every caller reports it where the document is written."""
    out: list[str] = []
    for e in doc.entries:
        if e.model not in labels:
            close = difflib.get_close_matches(e.model, list(labels), n=1, cutoff=0.5)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            known = ", ".join(sorted(labels)) or "none"
            out.append(
                f"{e.model}/{e.workload}: no model entry is labelled {e.model!r}{hint} "
                f"(labels: {known}); this ceiling enforces nothing"
            )
        elif e.workload != "default" and e.workload not in workloads:
            out.append(
                f"{e.model}/{e.workload}: workload {e.workload!r} is not declared "
                f"(workloads: {', '.join(workloads)}); this ceiling enforces nothing"
            )
    return out


#: libyaml's safe loader where PyYAML was built with it (the wheels are): the same documents,
#: several times faster than the pure-Python one, so a large document holds the interpreter
#: (beside a serving event loop) for less time
_YAML_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _load(data: bytes | str) -> Any:
    """JSON by orjson (a document as ``ceiling sweep derive`` and the admin API write it), else
    YAML (a superset of JSON)."""
    if data[:1] in (b"{", "{"):
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass  # YAML's flow style also starts with "{"
    return yaml.load(data, Loader=_YAML_LOADER)


def parse_document(data: bytes | str, where: str = "ceilings") -> CeilingsDocument:
    """Parse JSON or YAML text into a validated document."""
    try:
        raw = _load(data)
    except RecursionError:
        raise CeilingsError(where, ["nested too deeply to be a ceilings document"]) from None
    except yaml.YAMLError as exc:
        if "nesting depth" in str(getattr(exc, "problem", None) or exc):  # libyaml's limit
            raise CeilingsError(where, ["nested too deeply to be a ceilings document"]) from None
        mark = getattr(exc, "problem_mark", None)
        line = f"line {mark.line + 1}: " if mark is not None else ""
        raise CeilingsError(
            where, [f"{line}not valid JSON or YAML: {getattr(exc, 'problem', None) or exc}"]
        ) from exc
    if not isinstance(raw, dict):
        raise CeilingsError(
            where, ["the document must be a mapping with schema_version, version and entries"]
        )
    # entries one at a time: a validator call holds the interpreter for its whole input, and a
    # large document is parsed on a thread beside a serving event loop
    reasons: list[str] = []
    entries = raw.get("entries")
    if isinstance(entries, list):
        checked: list[Any] = []
        for k, e in enumerate(entries):
            try:
                checked.append(CeilingEntry.model_validate(e))
            except ValidationError as exc:
                reasons += _reasons(exc, ("entries", k))
        raw = {**raw, "entries": checked if not reasons else []}
    try:
        doc = CeilingsDocument.model_validate(raw)
    except ValidationError as exc:
        reasons = _reasons(exc) + reasons
    if reasons:
        raise CeilingsError(where, reasons)
    return doc


def _reasons(exc: ValidationError, prefix: tuple[Any, ...] = ()) -> list[str]:
    return [
        f"{'.'.join(str(p) for p in (*prefix, *e['loc'])) or '(top level)'}: {e['msg']}"
        for e in exc.errors()
    ]


def load_document(path: str | Path) -> CeilingsDocument:
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise CeilingsError(str(p), [f"cannot read: {exc.strerror or exc}"]) from exc
    return parse_document(data, str(p))


def dump_document(doc: CeilingsDocument, fmt: Literal["yaml", "json"] = "yaml") -> str:
    data = doc.model_dump(mode="json", exclude_none=True)
    if fmt == "json":
        return json.dumps(data, indent=2) + "\n"
    return yaml.safe_dump(data, sort_keys=False)


def write_atomically(path: str | Path, text: str) -> None:
    """Write via a temp file in the same directory and rename: readers never see half a file."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", dir=p.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def json_schema() -> dict[str, Any]:
    """The JSON Schema users validate their own tooling against."""
    schema = CeilingsDocument.model_json_schema(mode="validation")
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "context-ceiling ceilings document"
    return schema


@dataclass(frozen=True)
class Change:
    model: str
    workload: str
    kind: Literal["added", "removed", "changed", "unchanged"]
    old_tokens: int | None
    new_tokens: int | None

    def line(self) -> str:
        key = f"{self.model}/{self.workload}"
        if self.kind == "added":
            return f"+ {key}: ceiling {self.new_tokens} tokens"
        if self.kind == "removed":
            return f"- {key}: ceiling {self.old_tokens} tokens removed"
        if self.kind == "changed":
            return f"~ {key}: ceiling {self.old_tokens} -> {self.new_tokens} tokens"
        return f"  {key}: unchanged ({self.new_tokens} tokens)"


def diff(old: CeilingsDocument, new: CeilingsDocument) -> list[Change]:
    """Per model/workload differences between two documents, in a stable order."""
    out: list[Change] = []
    for key in sorted(old.index.keys() | new.index.keys()):
        a, b = old.index.get(key), new.index.get(key)
        if a is None and b is not None:
            out.append(Change(*key, "added", None, b.ceiling_tokens))
        elif b is None and a is not None:
            out.append(Change(*key, "removed", a.ceiling_tokens, None))
        elif a is not None and b is not None:
            kind: Literal["changed", "unchanged"] = "unchanged" if a == b else "changed"
            out.append(Change(*key, kind, a.ceiling_tokens, b.ceiling_tokens))
    return out
