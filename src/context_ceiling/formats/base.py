"""What one wire format is: the :class:`Format` every format module fills in, the
:class:`Route` of each endpoint that speaks it, and the types their parts hand each other
(:class:`Usage`, :class:`StreamTap`, :class:`Expect`, :class:`Answer`, :class:`Prompt`).

Why one record of callables per format: the request path, the counter, the trimmer, the usage
readers, the answer checker, the capture writer and the error renderer each need a format's
knowledge, and kept in their own modules they each branched on the format's name. Here a
format is one module that fills in one :class:`Format`; everything else reads the record it is
handed, so a new provider is one module and one line in the registry.

Nothing here does I/O: the parts are pure functions of a parsed body or of response bytes
(a :class:`Signer` alone may read credentials, and is called on a thread).
"""

from __future__ import annotations

import asyncio
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Protocol

import orjson

from context_ceiling.core.counting import Prior, RequestCount
from context_ceiling.core.errors import CeilingError
from context_ceiling.core.models import ChatFormat
from context_ceiling.core.tokenizers import CountCache, TextCounter
from context_ceiling.core.trim import Policy
from context_ceiling.core.trim_rules import TrimRules
from context_ceiling.core.vocabulary import Api, Shape
from context_ceiling.formats.framing import SSE, Framing, json_events

__all__ = [
    "NOTHING",
    "Answer",
    "ApiInfo",
    "Ask",
    "Count",
    "Expect",
    "Format",
    "Native",
    "Prompt",
    "Provider",
    "Route",
    "Signer",
    "SigningRefused",
    "StreamTap",
    "Tools",
    "Usage",
    "as_mapping",
    "earliest",
    "event_data",
    "expectation",
    "int_of",
    "json_events",
    "latest",
    "load_json",
    "model_in_path",
    "output_cap",
    "text_of",
]


def int_of(v: Any) -> int | None:
    """``v`` when it is an integer (JSON's ``true`` is not), else None."""
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def model_in_path(path: str) -> str:
    """The model a ``.../models/{model}:{method}`` path names (Gemini and Vertex AI, for
    Google's models and for Anthropic's): the segment after ``/models/`` up to the method."""
    tail = path.rsplit("/models/", 1)[-1]
    return tail.split(":", 1)[0] if "/models/" in path else ""


def output_cap(v: Any) -> int | None:
    """A requested output limit: a positive integer, else None (not said)."""
    n = int_of(v)
    return n if n is not None and n > 0 else None


# -- what the upstream says it used ----------------------------------------------------------------


@dataclass(slots=True)
class Usage:
    """What the upstream reported for one answer, read from its body or tapped from its
    stream. ``input_tokens`` counts every token in the window (Anthropic's cached and
    cache-creation tokens included); ``reasoning_tokens`` are among ``output_tokens``."""

    input_tokens: int | None = None
    output_tokens: int | None = None
    cached_tokens: int | None = None
    reasoning_tokens: int | None = None
    finish_reason: str | None = None
    response_model: str | None = None
    #: the provider's own context management, as it reported it: edits applied (Anthropic's
    #: cleared tool uses, the Responses API's compaction items) and input tokens cleared
    native_edits: int = 0
    native_cleared_tokens: int | None = None
    #: input written to the provider's prompt cache (Anthropic's cache creation, Bedrock's cache
    #: writes): among ``input_tokens``
    cache_write_tokens: int | None = None
    #: the provider's own compaction steps in this answer (Anthropic's ``usage.iterations``
    #: entries of type ``compaction``), and what they used: billed, but not among the top-level
    #: ``input_tokens`` / ``output_tokens``, which are the answer's own
    compactions: int = 0
    compaction_input_tokens: int = 0
    compaction_output_tokens: int = 0

    @property
    def billed_input(self) -> int | None:
        """Input tokens billed for the answer: its own and its compaction steps'."""
        if self.input_tokens is None:
            return None
        return self.input_tokens + self.compaction_input_tokens

    @property
    def billed_output(self) -> int | None:
        """Output tokens billed for the answer: its own and its compaction steps'."""
        if self.output_tokens is None:
            return None
        return self.output_tokens + self.compaction_output_tokens


def load_json(body: bytes) -> Any:
    """A response body's JSON, None when it is not JSON (an upstream's HTML error page)."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return None


def event_data(event: bytes) -> tuple[bytes | None, bytes]:
    """The ``event:`` name (or None) and the joined ``data:`` payload of one Server-Sent
    Event."""
    name: bytes | None = None
    data: list[bytes] = []
    for line in event.splitlines():
        if line.startswith(b"data:"):
            data.append(line[6:] if line[5:6] == b" " else line[5:])
        elif line.startswith(b"event:"):
            name = line[6:].strip()
    return name, b"\n".join(data)


def earliest(offsets: Iterable[int]) -> int:
    """The smallest of ``offsets`` that was found (``bytes.find``'s), -1 when none was. A plain
    loop: it runs on every read a stream relays, where ``min`` over a filtered generator costs
    several times as much."""
    at = -1
    for i in offsets:
        if i >= 0 and (at < 0 or i < at):
            at = i
    return at


class StreamTap(ABC):
    """Reads one streamed answer as it is relayed: the usage read so far, whether the
    protocol's last event arrived (``complete``), and whether the upstream reported its own
    failure in the stream. A format's tap forwards every event unchanged unless it says
    otherwise (OpenAI chat hides the usage chunk the sidecar asked for)."""

    __slots__ = ("complete", "upstream_error", "usage")

    #: whether the relay hands this tap whole reads of events (a read's events before the
    #: first one :meth:`needed` finds forwarded as one, :meth:`plain`), not only single events
    #: (:meth:`on_chunk`)
    whole_reads: ClassVar[bool] = False
    #: byte strings of which every event this tap reads holds one (none: it reads every event)
    marks: ClassVar[tuple[bytes, ...]] = ()

    def __init__(self) -> None:
        self.usage = Usage()
        self.complete = False
        self.upstream_error = False

    @staticmethod
    @abstractmethod
    def error_event(message: str) -> bytes:
        """The event that tells this format's SDK the stream failed (it raises on it)."""

    def needed(self, chunk: bytes) -> int:
        """In a read of whole events, where the first event this tap reads may lie: the offset
        of the first of its :attr:`marks` (no event before the one holding it is read: a byte
        scan, not a parse), or -1 when no event in the read is read. One scan finds the few
        events a whole answer read at once holds for the tap (the first, with the model; the
        finish, the usage, the end), however many plain deltas lie between them. With no
        marks every event is read (0)."""
        if not self.marks:
            return 0
        return earliest(chunk.find(m) for m in self.marks)

    def plain(self, chunk: bytes) -> bytes:
        """The bytes to forward for whole events this tap does not read (:meth:`needed`)."""
        return chunk

    def on_chunk(self, chunk: bytes) -> bytes | None:
        """A whole upstream read of complete events, as one: the bytes to forward when no event
        in it carries anything this tap reads (:meth:`needed`), else None and each event goes
        through :meth:`on_event`. Most reads of a stream are one plain content delta; this
        skips splitting them into events."""
        return self.plain(chunk) if self.needed(chunk) < 0 else None

    def on_event(self, event: bytes) -> bytes | None:
        """The bytes to forward for this event (None: drop it)."""
        return event


# -- what the request asked of its answer, and what the answer was -------------------------------


@dataclass(frozen=True, slots=True)
class Expect:
    """What a request asked the answer to be: JSON (with a schema or without), and the tools it
    offered (name -> parameter schema, None when the tool takes any object; ``free``: tools
    whose input is free text). ``tools`` None: the request offered no tools. References into the
    client's parsed body: nothing is copied on the request path."""

    json: bool = False
    schema: Mapping[str, Any] | None = None
    tools: Mapping[str, Mapping[str, Any] | None] | None = None
    free: frozenset[str] = frozenset()


NOTHING = Expect()


def as_mapping(v: Any) -> Mapping[str, Any] | None:
    """``v`` when it is a JSON object, else None."""
    return v if isinstance(v, Mapping) else None


#: the tools a request offered: name -> parameter schema, and the names whose input is free text
Tools = tuple[dict[str, Any], set[str]]


def expectation(json_: bool, schema: Any, tools: Tools | None) -> Expect:
    """What a request asks its answer to be, from what a format's reader found: JSON (any
    schema asks for JSON), the schema when it is an object, the tools offered."""
    return Expect(
        json=json_ or isinstance(schema, Mapping),
        schema=schema if isinstance(schema, Mapping) else None,
        tools=tools[0] if tools is not None else None,
        free=frozenset(tools[1]) if tools is not None else frozenset(),
    )


@dataclass(slots=True)
class Answer:
    """One answer as the client received it: its text, whether the model refused, its tool calls
    (name, arguments: JSON text, or an object the API already parsed) and the provider's stop
    reason. Its token counts are the usage readers' (:class:`Usage`)."""

    text: str = ""
    refusal: bool = False
    tool_calls: list[tuple[str, Any]] = field(default_factory=list)
    finish: str | None = None
    #: Gemini's MALFORMED_FUNCTION_CALL: a call so broken the API returned none
    malformed_call: bool = False


@dataclass(slots=True)
class Prompt:
    """What a request says, for the capture store: its system prompt, the latest user message's
    text, its tool definitions (as sent) and the retrieved documents it carries as blocks of
    their own (text, title), in rank order."""

    system: str = ""
    question: str = ""
    tools: Any = None
    documents: list[tuple[str, str | None]] = field(default_factory=list)


def latest(messages: Any, roles: tuple[str, ...]) -> Any:
    """The content (or Gemini parts) of the latest message in one of ``roles``."""
    if isinstance(messages, list):
        for m in reversed(messages):
            if isinstance(m, Mapping) and m.get("role") in roles:
                return m.get("content") if "content" in m else m.get("parts")
    return None


def text_of(content: Any) -> str:
    """The text of a message content: a string, or the text parts of a list of blocks (every
    format names a text block's text ``text``)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for b in content:
            if isinstance(b, str):
                out.append(b)
            elif isinstance(b, Mapping):
                t = b.get("text")
                if isinstance(t, str) and b.get("type") in (None, "text", "input_text"):
                    out.append(t)
        return "\n".join(out)
    return ""


# -- the record ------------------------------------------------------------------------------------


class Count(Protocol):
    """A format's count: the input tokens of a body, its shape checked first (``prior``: the
    parts of a body this one was derived from, which need no check; ``memo``: the count
    cache)."""

    def __call__(
        self,
        body: Mapping[str, Any],
        counter: TextCounter,
        fmt: ChatFormat | None = None,
        chunks: re.Pattern[str] | None = None,
        prior: Prior | None = None,
        memo: CountCache | None = None,
    ) -> RequestCount: ...


@dataclass(frozen=True, slots=True)
class Native:
    """A provider's own context management, given the measured ceiling as its threshold
    (``strategy: native``, or ``auto`` on the provider's own API)."""

    #: what goes in the request's ``context_management``: (the ceiling, the trimming policy)
    build: Callable[[int, Policy], Any]
    #: the hosts of the provider's own API (a leading dot: any subdomain)
    hosts: tuple[str, ...]
    #: the beta that turns it on, sent in the format's :attr:`Format.betas_header`
    beta: str | None = None
    #: request keys that rule it out: the client's own context management, or a request that
    #: cannot carry it (Anthropic's on-demand ``compaction`` shares no request with
    #: ``context_management``)
    excludes: tuple[str, ...] = ("context_management",)

    def served_by(self, host: str) -> bool:
        """Whether an upstream at ``host`` is the provider's own API."""
        host = host.lower()
        return any(host.endswith(h) if h.startswith(".") else host == h for h in self.hosts)


@dataclass(frozen=True, slots=True)
class Ask:
    """One question put to a model as the sweep asks it (the same at every fill level but for
    the user text): what a format's :attr:`Format.ask` writes as a request of its API."""

    model: str
    user: str
    system: str = ""
    #: the first ``shared`` characters of ``user`` are a haystack other questions share: a
    #: prompt-cache breakpoint goes after them where the API marks one
    shared: int = 0
    max_tokens: int = 100
    temperature: float = 0.0
    #: ask for a JSON object where the API has a switch for it
    json: bool = False
    #: a thinking budget (tokens) on top of ``max_tokens``, where the API takes one (0: none)
    thinking: int = 0
    #: the form reasoning models take (OpenAI's ``max_completion_tokens``, no temperature)
    reasoning: bool = False


class SigningRefused(CeilingError):
    """The request cannot be sent signed: it was changed (trimmed) and the sidecar has no
    credentials to sign it again, or the credentials could not be read. The message says
    which, for the client; ``status`` and ``outcome`` are what the sidecar answers and
    records."""

    def __init__(
        self,
        message: str,
        status: int = 400,
        outcome: Literal["rejected", "unreachable"] = "rejected",
    ) -> None:
        super().__init__(message)
        self.status, self.outcome = status, outcome


class Signer(Protocol):
    """A route's signing step, where the provider's signature covers the request's body and
    host (AWS SigV4): the request the sidecar sends upstream is signed again with the sidecar's
    own credentials. May read credentials (a file, an instance's metadata): the sidecar calls it
    on a thread."""

    def sign(
        self,
        url: str,
        headers: list[tuple[str, str]],
        body: bytes,
        changed: bool,
        method: str = "POST",
    ) -> list[tuple[str, str]]:
        """The headers to send ``body`` to ``url`` with (by ``method``: the signature covers
        it). ``changed``: the sidecar changed the
        client's body (a signature of the client's no longer holds). Raises
        :class:`SigningRefused` when the request cannot go."""
        ...


@dataclass(frozen=True, slots=True)
class ApiInfo:
    """One API a client speaks, as the configuration and the credential checks see it: its
    name (the key under ``upstreams`` and a named upstream's ``api``), what its upstream is,
    and the credentials only its upstreams may receive."""

    name: Api
    #: what ``upstreams.<name>`` points at (the configuration reference's words)
    upstream: str
    #: a ``base_url`` for it, as the configuration examples give it
    example: str
    #: whether a request carries credentials that only this API's upstreams may see (a SigV4
    #: signature, a Google API key): such a request never goes to another API's upstream
    owns: Callable[[Mapping[str, str]], bool] | None = None
    #: those credentials, in a refusal's words
    credentials: str = ""
    #: the provider's id in the genai-prices data set (list prices of its models)
    prices: str | None = None
    #: the headers a client of this API sends with an API key (None: without one)
    key_headers: Callable[[str | None], dict[str, str]] = lambda key: (
        {"authorization": f"Bearer {key}"} if key else {}
    )
    #: the environment variable that holds the API's key, by its SDKs' convention
    key_env: str = ""

    async def signed(
        self,
        url: str,
        headers: list[tuple[str, str]],
        body: bytes,
        changed: bool,
        method: str = "POST",
    ) -> list[tuple[str, str]]:
        """The headers to send ``body`` to ``url`` with: signed again where this API signs its
        requests (on a thread: the signer may read credentials), else as they are. Raises
        :class:`SigningRefused`."""
        if self.signer is None:
            return headers
        return await asyncio.to_thread(self.signer.sign, url, headers, body, changed, method)

    #: the signing step, where the provider's signature covers the host and the body (every
    #: request to this API's upstreams is signed last; None: the client's credentials go
    #: upstream as sent)
    signer: Signer | None = None


def _no_preparation(_obj: dict[str, Any], body: bytes | None) -> tuple[bytes | None, bool]:
    return body, False


@dataclass(frozen=True, slots=True)
class Format:
    """Everything the product knows about one wire format. Each field is the format's answer to
    one question another part asks; the docstrings of the fields say which part asks."""

    #: the body's shape (the trimmer's and the counter's name for it)
    shape: Shape
    #: whose client sends it: the error body's format and the SDK that must parse it
    api: Api
    #: the counter: shape checks, then tokens by component (``core.counting``'s walk)
    count: Count
    #: the trimmer's rules: what a turn is, which blocks are tool calls and results, what may
    #: never be edited (``core.trim``)
    trim: TrimRules
    #: the output tokens the request asks for at most (None: not said)
    requested_output: Callable[[Mapping[str, Any]], int | None]
    #: the upstream's usage in a whole response body
    body_usage: Callable[[bytes], Usage]
    #: a stream's tap (given whether :attr:`prepare_stream` changed the request)
    tap: Callable[[bool], StreamTap]
    #: what the request asks the answer to be (answer signals)
    expect: Callable[[Mapping[str, Any]], Expect]
    #: the answer in a response body's JSON (one object) or a stream's events (``stream``)
    read_answer: Callable[[Iterable[Any], bool], Answer]
    #: what the request says, for the capture store
    prompt: Callable[[Mapping[str, Any]], Prompt]
    #: an error response body in this API's own shape: (status, message, code)
    error_body: Callable[[int, str, str | None], bytes]
    #: a rejection's message in the words the provider uses for a prompt over the window:
    #: (input tokens, the budget, what the sidecar did)
    too_long: Callable[[int, int, str], str]
    #: a streamed request's body made ready to send: (the bytes, None to serialize the object;
    #: whether it was changed, which the tap then hides from the client)
    prepare_stream: Callable[[dict[str, Any], bytes | None], tuple[bytes | None, bool]] = (
        _no_preparation
    )
    #: the GenAI semantic conventions' ``gen_ai.operation.name``
    operation: str = "chat"
    #: ``gen_ai.provider.name`` for a request path of this format
    provider: Callable[[str], str] = lambda _path: ""
    #: a path suffix that asks for a stream whatever the body says (Gemini's
    #: ``:streamGenerateContent``); None: only ``"stream": true`` does
    stream_suffix: str | None = None
    #: the header that names beta features changing the window (Anthropic's ``anthropic-beta``)
    betas_header: str | None = None
    #: the provider's own context management (None: the format has none)
    native: Native | None = None
    #: the upstream gets the path and query as the client sent them (the model is in the path)
    path_as_sent: bool = False
    #: the provider's other routes, passed through: first path segment (after the version) ->
    #: the bounded ``route`` label of the pass-through metrics
    passthrough_routes: Mapping[str, str] = field(default_factory=dict)
    #: headers only this API's SDKs send, and path prefixes only its routes have: how a
    #: pass-through request's client is told apart (none: the OpenAI-style default)
    client_headers: tuple[str, ...] = ()
    client_paths: tuple[str, ...] = ()
    #: a serving engine's chat template renders this body (its tokenize endpoint counts it
    #: exactly: ``tokenizer: upstream``)
    chat_template: bool = False
    #: how a streamed answer's bytes split into events (the relay's splitter, the answer
    #: checker's and the capture store's reading of a whole stream)
    framing: Framing = SSE
    #: the request that asks a question (the sweep's calls): (the path under the API's base
    #: URL, the body); None: the sweep does not call this format
    ask: Callable[[Ask], tuple[str, dict[str, Any]]] | None = None
    #: the headers an error response carries beside :attr:`error_body` (status, code): what
    #: the API's SDK reads the error's type from (botocore: ``x-amzn-ErrorType``)
    error_headers: Callable[[int, str | None], Mapping[str, str]] = lambda _s, _c: {}

    def streams(self, obj: Mapping[str, Any], path: str) -> bool:
        """Whether a request asks for a streamed answer."""
        return obj.get("stream") is True or (
            self.stream_suffix is not None and path.endswith(self.stream_suffix)
        )


@dataclass(frozen=True, slots=True)
class Provider:
    """A provider that serves a format on paths of its own (Azure OpenAI serves OpenAI's,
    Vertex AI and Bedrock serve Anthropic's): the wire format is the format's; what differs is
    where a request goes and what it is called. A value a route carries, not a flag the request
    path tests: each consumer reads the fact it needs from it."""

    #: ``gen_ai.provider.name`` of its requests
    genai: str
    #: its id in the price data set (None: the format's API's)
    prices: str | None = None
    #: requests go to the named upstream whose settings set this flag (``azure: true``) when the
    #: model names no upstream; None: the API's default upstream
    marked_by: str | None = None
    #: the upstream gets the path and query as the client sent them (a deployment, a project or
    #: a model in the path; a signature that covers them)
    path_as_sent: bool = True


@dataclass(frozen=True, slots=True)
class Route:
    """One measured endpoint: the format it speaks and what is particular to the endpoint."""

    format: Format
    #: the ``api`` label of its metrics and log lines
    metric_api: str
    #: the path as documented (the sidecar's own paths are :attr:`paths` and :attr:`pattern`)
    path: str
    #: the request paths the sidecar answers for it exactly
    paths: tuple[str, ...] = ()
    #: request paths it answers by pattern (a deployment or model in the path)
    pattern: re.Pattern[str] | None = None
    #: a token-counting endpoint: measured and compared with the provider's count, never
    #: trimmed, traced or streamed
    count_only: bool = False
    #: who serves it, where that is not the format's own API (where requests go, what they
    #: are called and priced as)
    provider: Provider | None = None
    #: the model named in the path (Gemini's ``models/{model}``, Azure's deployment)
    path_model: Callable[[str], str] | None = None
    #: the path's model wins over the body's (else it is only the fallback)
    path_model_first: bool = False
    #: the usage in a response body, where the endpoint answers otherwise than the format's
    #: generation endpoint (a token count)
    usage: Callable[[bytes], Usage] | None = None

    @property
    def api(self) -> Api:
        return self.format.api

    @property
    def path_as_sent(self) -> bool:
        """The upstream gets the path and query as the client sent them."""
        if self.provider is not None:
            return self.provider.path_as_sent
        return self.format.path_as_sent

    @property
    def shape(self) -> Shape:
        return self.format.shape

    @property
    def count(self) -> Count:
        return self.format.count

    @property
    def tap(self) -> Callable[[bool], StreamTap]:
        return self.format.tap

    @property
    def body_usage(self) -> Callable[[bytes], Usage]:
        return self.usage or self.format.body_usage

    def model(self, obj: Mapping[str, Any], path: str) -> Any:
        """The model a request names: the body's ``model``, or the path's."""
        model = obj.get("model")
        if self.path_model is not None and (
            self.path_model_first or not (isinstance(model, str) and model)
        ):
            model = self.path_model(path)
        return model

    def provider_name(self, path: str) -> str:
        """``gen_ai.provider.name`` of a request on this route."""
        if self.provider is not None:
            return self.provider.genai
        return self.format.provider(path) or self.api

    @property
    def price_provider(self) -> str:
        """Who prices a request on this route: the provider's id in the price data set, else
        the format's API's name."""
        if self.provider is not None and self.provider.prices is not None:
            return self.provider.prices
        return self.api

    def answers(self, path: str) -> bool:
        """Whether a request path is this route's."""
        return path in self.paths or (self.pattern is not None and bool(self.pattern.match(path)))
