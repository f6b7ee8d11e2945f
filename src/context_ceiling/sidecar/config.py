"""Sidecar configuration: one YAML file, every option overridable from the environment.

Precedence: environment (``CEILING_`` prefix, ``__`` between nested keys, JSON for lists and
objects, e.g. ``CEILING_LISTEN__PORT=9000`` or ``CEILING_MODELS='[...]'``) over the YAML file
over the defaults. A bad value is reported with the file (or variable), the field and the reason.
"""

from __future__ import annotations

import difflib
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    WithJsonSchema,
    create_model,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
)

from context_ceiling.core.counting import DEFAULT_CHUNK_PATTERN
from context_ceiling.core.errors import UserError
from context_ceiling.core.models import ModelSpec
from context_ceiling.core.strict import Strict
from context_ceiling.core.tokenizers import Bpe
from context_ceiling.core.trim import Policy
from context_ceiling.core.vocabulary import Api, Mode, ModeValue, OverCeiling, Strategy
from context_ceiling.formats import APIS

ENV_PREFIX = "CEILING_"
#: ``CEILING_*`` variables that are not sidecar settings: the config file's path, the cache of
#: the dev scripts, the in-cluster push's API overrides, the demo's and the local model's knobs
OTHER_ENV = ("CONFIG", "CACHE", "KUBE_", "DEMO_", "LLAMA_")


class ConfigError(UserError, ValueError):
    """A configuration problem, already phrased as one line for the operator; ``problems``:
    each problem on its own (``--json`` lists them)."""

    problems: list[str] = []  # noqa: RUF012 (a class default, never mutated)


class _Section(Strict):
    """Settings sections stay mutable: the command line applies --host/--port on top."""

    model_config = ConfigDict(frozen=False)


class Listen(_Section):
    #: the address to listen on (0.0.0.0 in a pod)
    host: str = "127.0.0.1"
    #: the port for traffic (and, without ``admin_port``, metrics and the admin API)
    port: int = Field(default=8787, ge=0, le=65535)
    #: a second port for /metrics and /admin/* (plus the probes): set, those answer only there
    #: and the traffic port answers 404 for them, so a NetworkPolicy can admit Prometheus and
    #: operators without admitting every client to the admin API
    admin_port: int | None = Field(default=None, ge=1, le=65535)


class Timeouts(_Section):
    """Seconds. ``read`` is per chunk (a long generation keeps streaming); ``total`` caps the
    whole exchange including a stream."""

    connect: float = Field(default=5.0, gt=0)
    read: float = Field(default=300.0, gt=0)
    total: float = Field(default=900.0, gt=0)


class Upstream(_Section):
    """Where requests go. ``base_url`` is what you would give the provider's SDK: for OpenAI it
    includes ``/v1`` (``https://api.openai.com/v1``), for Anthropic it does not
    (``https://api.anthropic.com``)."""

    #: what you would give the provider's SDK (OpenAI: with /v1; Anthropic and Gemini: without)
    base_url: str
    timeouts: Timeouts = Field(default_factory=Timeouts)
    #: connections kept open to this upstream
    pool_size: int = Field(default=100, ge=1)
    #: the ``gen_ai.provider.name`` its requests are reported under (default: the conventions'
    #: name for a host they know, such as ``openai`` for api.openai.com or ``azure.ai.openai``
    #: for an Azure resource; else a named upstream's name, else its API's provider)
    provider: str | None = Field(default=None, pattern=r"^[a-z0-9_.-]{1,64}$")

    @field_validator("base_url")
    @classmethod
    def _http(cls, v: str) -> str:
        if not re.match(r"^https?://[^/]+", v):
            raise ValueError("must be an http:// or https:// URL")
        return v.rstrip("/")


def _registered_api(v: str) -> str:
    if v not in APIS:
        raise ValueError(f"{v!r} is not an API this sidecar speaks ({', '.join(APIS)})")
    return v


#: a registered API's name (``context_ceiling.formats.APIS``), in the schema as an enum
ApiName = Annotated[
    str,
    AfterValidator(_registered_api),
    WithJsonSchema({"type": "string", "enum": list(APIS)}),
]


class NamedUpstream(Upstream):
    """One more upstream, of any API, that models are routed to by name (a local vLLM beside
    hosted OpenAI, a second Anthropic account, a Bedrock region, ...)."""

    api: ApiName
    #: an Azure OpenAI resource (``https://NAME.openai.azure.com``, no /v1): clients call it on
    #: ``/openai/deployments/{deployment}/...?api-version=...`` with an ``api-key`` header, and
    #: those paths are forwarded as they are
    azure: bool = False


class _Upstreams(_Section):
    """Where each API's requests go by default (one key per API the format registry defines),
    and ``named``: any number of further upstreams; a model entry's ``upstream`` sends its
    requests to one."""

    #: further upstreams by name; a model entry's `upstream` routes its requests to one
    named: dict[str, NamedUpstream] = Field(default_factory=dict)

    @field_validator("named")
    @classmethod
    def _names(cls, v: dict[str, NamedUpstream]) -> dict[str, NamedUpstream]:
        for name in v:
            if name in APIS or not re.fullmatch(r"[a-z0-9][a-z0-9_.-]{0,62}", name):
                raise ValueError(
                    f"{name!r}: upstream names are lowercase [a-z0-9_.-] and not an API's "
                    f"name ({', '.join(APIS)})"
                )
        return v

    def of(self, api: Api) -> Upstream | None:
        """The default upstream of ``api`` (None: not configured)."""
        up = getattr(self, api, None) if api in APIS else None
        return up if isinstance(up, Upstream) else None

    def defaults(self) -> dict[Api, Upstream]:
        """The default upstreams configured, by API."""
        return {api: up for api in APIS if (up := self.of(api)) is not None}


if TYPE_CHECKING:
    Upstreams = _Upstreams
else:
    # one optional field per registered API (a provider module adds its upstream here without
    # an edit): real fields, so the schema, the environment variables
    # (CEILING_UPSTREAMS__BEDROCK__BASE_URL) and the configuration reference list each
    Upstreams = create_model(
        "Upstreams",
        __base__=_Upstreams,
        __doc__=_Upstreams.__doc__,
        __module__=__name__,
        **{
            api: (
                Upstream | None,
                Field(default=None, description=f"{info.upstream} (e.g. ``{info.example}``)"),
            )
            for api, info in APIS.items()
        },
    )


class Limits(_Section):
    """Bounds on what one client or one upstream can make the sidecar hold or wait for."""

    #: a request body larger than this is a 413
    max_body_bytes: int = Field(default=32 * 1024 * 1024, ge=1024)
    #: a non-stream upstream response larger than this is a 502 (it is held to read its usage)
    max_response_bytes: int = Field(default=64 * 1024 * 1024, ge=1024)
    #: one server-sent event larger than this ends the stream as failed
    max_event_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    #: request headers larger than this in all are a 431
    max_header_bytes: int = Field(default=64 * 1024, ge=1024)
    #: most header fields a request may carry (as Envoy's default): more is answered 431 while
    #: the head is still arriving, so a flood of tiny headers holds no memory
    max_header_count: int = Field(default=100, ge=8, le=10_000)
    #: a connection whose request headers have not arrived whole within this many seconds is
    #: closed (slow-loris clients)
    header_read_timeout: float = Field(default=10.0, gt=0)
    #: a request body that has not arrived whole within this many seconds is a 408
    body_read_timeout: float = Field(default=60.0, gt=0)
    #: connections served at once; beyond it new ones get a 503 (uvicorn limit_concurrency)
    max_connections: int = Field(default=2048, ge=1)
    #: on SIGTERM: stop accepting, then let in-flight requests and streams finish this long
    shutdown_grace_seconds: float = Field(default=30.0, ge=0)


class Counting(_Section):
    """Token counting. ``cache_mib``: remember the counts of long texts (system prompts, tool
    schemas, resent history, recurring documents) up to this much text, in memory only; 0 = off.

    ``strategy``: ``bounded`` (the default) counts first only the requests that could be over
    their budget (in ``enforce``, where a trim may follow); a request whose bound is within it
    goes straight through, and is counted exactly anyway while those counts have used at most
    ``sample_cpu`` of one core (0.02: 20 ms a second, averaged over 10 s; per worker), every
    ``sample_every``-th such request (1: every one). So at the rates a pod serves with CPU to
    spare every request is counted, as with ``exact``; under load the counts stop at that share
    and a request the bound let through is measured by the tokens the provider reports (its
    utilization in the metrics, the log and the span; the response says ``x-ceiling-count:
    bound``, the log line ``"counted": "bound"``), so a pod's counting costs a bounded share of
    its CPU instead of growing with the traffic. What is trimmed is the same either way: a
    request is trimmed only after an exact count. ``exact`` counts every request before
    forwarding it (every response carries ``x-ceiling-input-tokens``). The bound in ``enforce``
    mode is strict (a byte-level BPE token covers at least one byte, so the body's bytes bound
    its tokens); in ``observe`` it may also be the body's bytes over the smallest
    bytes-per-token this model has shown (``calibration``), with a 10% margin; in ``off``
    nothing needs counting. A long body (``overlap_bytes``) the bound let through and the
    sampler picked is counted beside its upstream call and recorded once its count lands,
    after its answer: its response says ``x-ceiling-count: bound``, its log line
    ``"counted": "sampled"``.

    ``overlap_bytes`` (either strategy): a request body of at least this many bytes that is
    counted (not sampled) is forwarded at once and counted exactly on worker threads while the
    upstream call runs, when its forwarding cannot depend on the count: in ``observe`` (nothing is ever trimmed) and ``off``, or in ``enforce``
    when the strict bound proves it within its budget. The count, and the decision on it, are
    awaited before the answer's headers go back, so headers, log line and metrics carry them as
    before (in ``observe``, what trimming would have removed too). A long body that must be
    counted before forwarding (``enforce``, not proved within budget) is counted, and trimmed,
    on the worker threads too, the event loop serving other requests meanwhile. tiktoken
    and riptoken release the GIL while they encode, so the count runs on another core (gigatoken
    holds it: its count overlaps the upstream's wait, not other requests' work); behind a model that
    takes longer to answer than the count it adds no latency. Below the default (~15k tokens)
    the threads' GIL hand-offs cost more than they save.
    ``count_threads``: the worker threads (0: as many as the CPUs this process may use).
    ``overlap_bytes: 0`` counts every request before forwarding it, on the event loop.

    ``bpe``: which implementation encodes the tiktoken encodings; the counts are the same.
    ``auto`` takes gigatoken (the opt-in ``gigatoken`` extra), else riptoken (the ``fast``
    extra, in the image), where it is installed and agrees with tiktoken token for token on the
    packaged check text, else tiktoken; ``riptoken`` or ``gigatoken`` insists on that one
    (startup fails with the reason); ``tiktoken`` uses neither."""

    cache_mib: float = Field(default=64, ge=0)
    strategy: Literal["exact", "bounded"] = "bounded"
    sample_every: int = Field(default=1, ge=1)
    sample_cpu: float = Field(default=0.02, gt=0, le=1)
    #: seconds of ``sample_cpu`` the sampled counts may spend at once while other requests are
    #: in flight: of the ten seconds' worth an idle pod saves up (a quiet pod samples a burst of
    #: long requests), what traffic returning after a pause sees spent beside it; 10: all of it
    sample_cpu_burst_seconds: float = Field(default=1.0, gt=0, le=10)
    #: how many reported requests the observe bound needs before it is used (and keeps)
    calibration: int = Field(default=32, ge=1)
    overlap_bytes: int = Field(default=65536, ge=0)
    count_threads: int = Field(default=0, ge=0, le=64)
    bpe: Bpe = "auto"


class Retrieval(_Section):
    """How retrieved chunks inlined as text are recognised (Anthropic ``document`` and
    ``search_result`` blocks are always recognised)."""

    chunk_pattern: str | None = DEFAULT_CHUNK_PATTERN

    @field_validator("chunk_pattern")
    @classmethod
    def _compiles(cls, v: str | None) -> str | None:
        if v:
            try:
                re.compile(v)
            except re.error as exc:
                raise ValueError(f"not a valid regular expression: {exc}") from exc
        return v or None


class WorkloadEnforcement(_Section):
    """Overrides for one workload; unset fields inherit the defaults."""

    mode: ModeValue | None = None
    policy: Policy | None = None
    strategy: Strategy | None = None
    over_ceiling: OverCeiling | None = None
    fallback: list[str] | None = None
    max_trimmed_share: float | None = Field(default=None, gt=0, le=1)


class Enforcement(_Section):
    """Trimming to the ceiling. ``off``: forward unchanged; ``observe``: compute what would be
    trimmed, record it, forward unchanged; ``enforce``: trim (or reject) to fit."""

    #: off: forward unchanged; observe: record what trimming would remove; enforce: trim (or
    #: reject) to fit
    mode: ModeValue = "off"
    #: what trimming may remove, in which order (see the enforcement page)
    policy: Policy = Field(default_factory=Policy)
    #: output reservation for requests that do not say max_tokens / max_completion_tokens
    default_output_reservation: int = Field(default=4096, ge=0)
    #: trim: the sidecar trims to the ceiling; native: the provider's own context management
    #: (Anthropic context editing, the Responses API's compaction) gets the ceiling as its
    #: threshold and the sidecar trims only to the window; auto: native where the upstream is
    #: Anthropic's or OpenAI's own API. A model entry's ``strategy`` wins over this one.
    strategy: Strategy = "trim"
    #: what a request over its ceiling gets in enforce mode: trim (to fit; rejected when
    #: trimming cannot), reject, fallback (to the first model of ``fallback`` whose own measured
    #: ceiling it fits, unchanged), trim_then_fallback (trim within ``max_trimmed_share``, else
    #: fall back). A model entry's ``over_ceiling`` wins over this one
    over_ceiling: OverCeiling = "trim"
    #: models (as clients name them, each with a model entry) a request over its ceiling may go
    #: to instead, in order; a model entry's ``fallback`` wins over this list
    fallback: list[str] = Field(default_factory=list)
    #: trim_then_fallback: the largest share of a request's input tokens trimming may remove
    #: before the request falls back instead (unset: any trim that fits)
    max_trimmed_share: float | None = Field(default=None, gt=0, le=1)
    #: per-workload overrides of mode, policy, strategy and the over-ceiling action
    workloads: dict[str, WorkloadEnforcement] = Field(default_factory=dict)

    def for_workload(self, workload: str) -> tuple[Mode, Policy]:
        o = self.workloads.get(workload)
        if o is None:
            return self.mode, self.policy
        return o.mode or self.mode, o.policy or self.policy

    def strategy_for(self, workload: str) -> Strategy:
        o = self.workloads.get(workload)
        return (o.strategy if o is not None else None) or self.strategy

    def over_ceiling_for(self, workload: str) -> tuple[OverCeiling, list[str], float | None]:
        """The over-ceiling action, the fallback models and the trim allowance in force for a
        workload (a model entry's own action and list win over these)."""
        o = self.workloads.get(workload)
        if o is None:
            return self.over_ceiling, list(self.fallback), self.max_trimmed_share
        return (
            o.over_ceiling or self.over_ceiling,
            list(o.fallback if o.fallback is not None else self.fallback),
            o.max_trimmed_share if o.max_trimmed_share is not None else self.max_trimmed_share,
        )


class Staleness(_Section):
    """When live traffic stops resembling the traffic a ceiling was measured on."""

    tolerance: float = Field(default=0.25, gt=0, description="relative change that counts as drift")
    window: int = Field(default=50, ge=2, description="requests in the moving average")
    min_requests: int = Field(
        default=20, ge=1, description="requests seen before judging the shape"
    )


class CaptureWorkload(_Section):
    sample_rate: float = Field(ge=0, le=1)


class Redaction(_Section):
    """Applied before anything is written. Built-in patterns for API keys and bearer tokens are
    always on; ``patterns`` adds yours (e.g. e-mail addresses, account numbers); ``fields``
    names JSON keys whose values are replaced wherever they appear in a captured request."""

    patterns: list[str] = Field(default_factory=list)
    fields: list[str] = Field(default_factory=lambda: ["user", "metadata", "safety_identifier"])

    @field_validator("patterns")
    @classmethod
    def _compile(cls, v: list[str]) -> list[str]:
        for p in v:
            try:
                re.compile(p)
            except re.error as exc:
                raise ValueError(f"{p!r} is not a valid regular expression: {exc}") from exc
        return v


class Capture(_Section):
    """Sample live requests into a capture store, for building task sets from your own traffic
    (``ceiling taskset build``). Off unless enabled, and then only at the sampled rates."""

    #: capture sampled requests into the store (off by default)
    enabled: bool = False
    #: the SQLite store; ``{hostname}`` becomes this replica's host name (one file per pod)
    store: Path = Path("capture-{hostname}.sqlite")
    #: share of a workload's requests captured, unless the workload sets its own
    sample_rate: float = Field(default=0.0, ge=0, le=1)
    workloads: dict[str, CaptureWorkload] = Field(default_factory=dict)
    #: a request body larger than this is not captured (counted as dropped: too_large)
    max_request_bytes: int = Field(default=1_048_576, ge=1024)
    #: the response text is cut to this many characters
    max_response_chars: int = Field(default=32_768, ge=0)
    #: rotation: the oldest records go first once the records exceed this size ...
    max_store_mib: float = Field(default=256, gt=0)
    #: ... and every record older than this
    max_age_hours: float = Field(default=336, gt=0)
    redact: Redaction = Field(default_factory=Redaction)

    def rate(self, workload: str) -> float:
        w = self.workloads.get(workload)
        return w.sample_rate if w is not None else self.sample_rate


class Answers(_Section):
    """Answer signals by fill (docs/observability.md): every answer of a measured generation
    route is read once it was relayed, on one checker thread, and counted by why it stopped and
    what was wrong with it, by fill bucket. Nothing of the answer is kept."""

    #: read and count answers (on by default)
    enabled: bool = True
    #: an answer larger than this (a body, or a stream's events) is not read: only its stop
    #: reason is counted (``llm_context_answer_checks_skipped_total{reason="too_large"}``)
    max_bytes: int = Field(default=1_048_576, ge=1024)
    #: answers waiting for the checker; past it a check is dropped (``queue_full``), never waited on
    queue_size: int = Field(default=256, ge=1)
    #: answer bytes held at once, kept by streams being relayed, waiting for their record's
    #: batch and queued for the checker; past it an answer is counted by its stop reason only
    #: (``busy``): memory stays bounded however many long answers stream at once
    max_held_mib: float = Field(default=64, gt=0)
    #: the share of one core the checker's thread may take (reading answers, counting them),
    #: averaged over 10 s (per worker): past it an answer is counted by its stop reason only
    #: (``llm_context_answer_checks_skipped_total{reason="cpu"}``), so at the rates a pod serves
    #: with CPU to spare every answer is read, and under load the checker's cost stops at this
    #: share instead of growing with the traffic; 1: no limit
    cpu_share: float = Field(default=0.02, gt=0, le=1)
    #: seconds of ``cpu_share`` the checker may spend at once while other requests are in
    #: flight: of the ten seconds' worth an idle pod saves up (a quiet pod reads a burst of
    #: long answers), what traffic returning after a pause sees spent beside it; 10: all of it
    cpu_burst_seconds: float = Field(default=1.0, gt=0, le=10)


class Recording(_Section):
    """How finished requests are recorded (their metrics, log line, span and answer check)
    while other requests are in flight: together, in batches, which costs less CPU than
    recording each one between two others (docs/observability.md). A request that finishes with
    no other in flight is recorded at once."""

    #: requests recorded together at most; 1: each one as it finishes
    batch_size: int = Field(default=32, ge=1, le=4096)
    #: the longest a finished request waits for its batch: every output is at most this far
    #: behind the traffic
    max_delay_seconds: float = Field(default=0.05, gt=0, le=10)


class Settings(BaseSettings):
    """The whole sidecar configuration."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="__",
        extra="forbid",
        validate_default=True,
    )

    #: where the sidecar listens
    listen: Listen = Field(default_factory=Listen)
    #: where requests go
    upstreams: Upstreams = Field(default_factory=Upstreams)
    #: the model registry: window, tokenizer and upstream per model name or glob; a request whose
    #: model matches no entry counts as `other`, with no utilization
    models: list[ModelSpec] = Field(default_factory=list)
    #: the workload names a client may send in X-Ceiling-Workload (anything else counts as default)
    workloads: list[str] = Field(default_factory=lambda: ["default"])
    #: the ceilings document (YAML or JSON), relative to the config file
    ceilings_file: Path | None = None
    #: write accepted admin-API pushes to ceilings_file (off when it is a read-only ConfigMap)
    ceilings_persist: bool = True
    #: follow ceilings_file for changes (off: only SIGHUP and the admin API reload)
    ceilings_watch: bool = True
    #: the admin API's bearer token (env CEILING_ADMIN_TOKEN) or a file holding it; neither: API off
    admin_token: SecretStr | None = None
    #: a file holding the admin API's bearer token (a mounted Secret)
    admin_token_file: Path | None = None
    #: the read-only ``GET /budget``'s own bearer token (env CEILING_BUDGET_TOKEN) or a file
    #: holding it; neither: the budget is readable by any client of the sidecar (it is not a
    #: secret: request builders ask for it). Never the admin token.
    budget_token: SecretStr | None = None
    budget_token_file: Path | None = None
    #: when live traffic stops resembling the traffic a ceiling was measured on
    staleness: Staleness = Field(default_factory=Staleness)
    #: how retrieved chunks inlined as text are recognised
    retrieval: Retrieval = Field(default_factory=Retrieval)
    #: token counting: cache, strategy, engine
    counting: Counting = Field(default_factory=Counting)
    #: trimming to the ceiling
    enforcement: Enforcement = Field(default_factory=Enforcement)
    #: bounds on what one client or upstream can make the sidecar hold or wait for
    limits: Limits = Field(default_factory=Limits)
    #: traffic capture for task sets built from your own traffic
    capture: Capture = Field(default_factory=Capture)
    #: answer signals by fill: stops, empty and malformed answers, repetition
    answers: Answers = Field(default_factory=Answers)
    #: finished requests recorded in batches under load
    recording: Recording = Field(default_factory=Recording)
    #: the JSON log's level (one line per request at info)
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    #: worker processes behind the one port (1: a single process). More than one gives a pod
    #: more than one core (one process's event loop holds the GIL; tiktoken and riptoken
    #: release it only while they encode, gigatoken never): metrics are summed over the
    #: workers (Prometheus multiprocess mode) and a pushed ceiling reaches every worker before
    #: the push is answered. Set it to the pod's CPU limit.
    workers: int = Field(default=1, ge=1, le=64)

    @field_validator("workloads")
    @classmethod
    def _workload_names(cls, v: list[str]) -> list[str]:
        for name in v:
            if not re.fullmatch(r"[a-z0-9][a-z0-9_.-]{0,62}", name):
                raise ValueError(f"workload name {name!r} must match [a-z0-9][a-z0-9_.-]*")
        return v if "default" in v else ["default", *v]

    @model_validator(mode="after")
    def _model_upstreams(self) -> Settings:
        known = {*APIS, *self.upstreams.named}
        for spec in self.models:
            if spec.upstream is not None and spec.upstream not in known:
                raise ValueError(
                    f"models[{spec.match}].upstream: {spec.upstream!r} is not an upstream "
                    f"(known: {', '.join(sorted(known))})"
                )
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # init kwargs carry the YAML document; the environment wins over it.
        return (env_settings, init_settings)


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{path}: {where}invalid YAML: {problem}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of settings")
    return data


def _env_source(loc: tuple[int | str, ...]) -> str | None:
    """The environment variable that set the value at ``loc`` (itself or a parent section's
    JSON), if one did."""
    names = {k.upper() for k in os.environ}
    for i in range(len(loc), 0, -1):
        env = ENV_PREFIX + "__".join(str(p) for p in loc[:i]).upper()
        if env in names:
            return env
    return None


def _fields_at(loc: tuple[Any, ...]) -> list[str]:
    """The setting names a key may have at ``loc`` (a path of keys and list indexes from the
    top), walking the settings' models; [] where the path leaves them."""
    import types
    import typing

    kind: Any = Settings
    for part in loc:
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            field = kind.model_fields.get(str(part))
            if field is None:
                return []
            kind = field.annotation
        elif typing.get_origin(kind) in (dict, list, tuple):
            kind = typing.get_args(kind)[-1] if typing.get_args(kind) else Any
        else:
            return []
        # Optional[X], X | None, Annotated[X, ...]: the model inside, if there is one
        while typing.get_origin(kind) in (typing.Union, types.UnionType, typing.Annotated):
            args = [a for a in typing.get_args(kind) if a is not type(None)]
            kind = args[0] if args else Any
    if isinstance(kind, type) and issubclass(kind, BaseModel):
        return sorted(kind.model_fields)
    return []


def _describe_one(err: Any, path: Path | None) -> str:
    loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
    env = _env_source(tuple(err["loc"]))
    source = f"env {env}" if env else (str(path) if path else "config")
    message = err["msg"]
    if err["type"] == "extra_forbidden" and err["loc"]:
        known = _fields_at(tuple(err["loc"][:-1]))
        close = difflib.get_close_matches(str(err["loc"][-1]), known, n=1, cutoff=0.6)
        message = "not a setting here" + (f"; did you mean {close[0]!r}?" if close else "")
        if known and not close and len(known) <= 8:  # a short section: what may be there
            message += f" (settings here: {', '.join(known)})"
    return f"{source}: {loc}: {message}"


def _describe(exc: ValidationError, path: Path | None) -> list[str]:
    """Every problem pydantic found, one line each, with the source that set the value and,
    for an unknown key, the setting it is closest to."""
    return [_describe_one(err, path) for err in exc.errors()]


def _check_env_names() -> None:
    """A ``CEILING_`` variable that names no setting is a typo (``CEILING_WORKLOAD``), refused
    like a misspelt nested key rather than silently ignored."""
    fields = set(Settings.model_fields)
    for name in sorted(os.environ):
        upper = name.upper()
        if not upper.startswith(ENV_PREFIX):
            continue
        rest = upper[len(ENV_PREFIX) :]
        if rest.startswith(OTHER_ENV):
            continue
        top = rest.split("__", 1)[0].lower()
        if top not in fields:
            close = difflib.get_close_matches(top, sorted(fields), n=1)
            hint = f" (did you mean {ENV_PREFIX}{close[0].upper()}?)" if close else ""
            raise ConfigError(f"env {name}: {top!r} is not a sidecar setting{hint}")


def _settings_error(exc: SettingsError) -> ConfigError:
    """pydantic-settings' own error (a list or object variable that is not JSON) -> one line
    naming the variable."""
    m = re.search(r'field "(\w+)"', str(exc))
    field_name = m.group(1) if m else ""
    env = next(
        (k for k in sorted(os.environ) if k.upper() == ENV_PREFIX + field_name.upper()),
        ENV_PREFIX + field_name.upper(),
    )
    cause = exc.__cause__
    why = f"not valid JSON ({cause})" if cause is not None else str(exc)
    return ConfigError(f"env {env}: {field_name}: {why}")


def load_settings(path: str | Path | None = None) -> Settings:
    """Load and validate; raises :class:`ConfigError` with a one-line description that names
    the problem's real source (the file, or the environment variable that set the value)."""
    p = Path(path) if path else None
    if p is None and os.environ.get(ENV_PREFIX + "CONFIG"):
        p = Path(os.environ[ENV_PREFIX + "CONFIG"])
    data = _read_yaml(p) if p else {}
    _check_env_names()
    try:
        settings = Settings(**data)
    except ValidationError as exc:
        problems = _describe(exc, p)
        error = ConfigError("; ".join(problems))
        error.problems = problems
        raise error from exc
    except SettingsError as exc:
        raise _settings_error(exc) from exc
    u = settings.upstreams
    if not u.defaults() and not u.named:
        raise ConfigError(
            f"{p or 'config'}: upstreams: configure at least one upstream ("
            + ", ".join(f"upstreams.{api}" for api in APIS)
            + " or a named one)"
        )
    if p is not None:
        for name in ("ceilings_file", "admin_token_file", "budget_token_file"):
            value = getattr(settings, name)
            if value is not None and not value.is_absolute():
                setattr(settings, name, p.parent / value)
        if not settings.capture.store.is_absolute():
            settings.capture.store = p.parent / settings.capture.store
    unknown = set(settings.capture.workloads) - set(settings.workloads)
    if unknown:
        raise ConfigError(
            f"{p or 'config'}: capture.workloads: {', '.join(sorted(unknown))} "
            f"not in workloads ({', '.join(settings.workloads)})"
        )
    return settings


def admin_token(settings: Settings) -> str | None:
    """The admin API token, or None when the admin API is off."""
    return _token(settings.admin_token, settings.admin_token_file, "admin_token_file")


def budget_token(settings: Settings) -> str | None:
    """The read token of ``GET /budget``, or None when it is open."""
    return _token(settings.budget_token, settings.budget_token_file, "budget_token_file")


def _token(value: SecretStr | None, path: Path | None, name: str) -> str | None:
    if value is not None and value.get_secret_value():
        return value.get_secret_value()
    if path is not None:
        try:
            token = path.read_text().strip()
        except OSError as exc:
            raise ConfigError(f"{name}: cannot read {path}: {exc.strerror}") from exc
        return token or None
    return None
