"""Google Gemini (``models/{model}:generateContent``, ``:streamGenerateContent`` and
``:countTokens``, on the Gemini API and Vertex AI): ``contents`` of ``parts``, the model and the
streaming in the path, and google.rpc.Status errors."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from types import MappingProxyType
from typing import Any

import orjson

from context_ceiling.core.counting import (
    TOOL_FRAME,
    Prior,
    RequestCount,
    Tally,
    call_tokens,
    count_context,
    json_text,
    walk_items,
)
from context_ceiling.core.models import ChatFormat
from context_ceiling.core.shape_checks import (
    RequestShapeError,
    check_depth_around,
    optional_type,
    require_type,
)
from context_ceiling.core.tokenizers import CountCache, TextCounter
from context_ceiling.core.trim_rules import PLACEHOLDER, ToolUse, TrimRules
from context_ceiling.core.utilization import Component
from context_ceiling.formats.base import (
    Answer,
    ApiInfo,
    Expect,
    Format,
    Prompt,
    Route,
    StreamTap,
    Usage,
    event_data,
    expectation,
    int_of,
    latest,
    load_json,
    model_in_path,
    output_cap,
    text_of,
)

__all__ = [
    "API",
    "FORMAT",
    "IMAGE_TOKENS",
    "PASSTHROUGH_ROUTES",
    "PATH",
    "ROUTES",
    "GenerateRules",
    "GenerateStreamTap",
    "body_usage",
    "check_content",
    "check_top",
    "count",
    "error_body",
    "expect",
    "prompt",
    "read_answer",
    "requested_output",
    "too_long",
]

_MODEL_PATH = (
    r"^/v1(?:beta\d*|alpha)?/(?:projects/[^/]+/locations/[^/]+/publishers/google/)?models/[^/:]+:"
)
#: the Gemini API's and Vertex AI's model methods the sidecar measures
PATH = re.compile(_MODEL_PATH + r"(?:generateContent|streamGenerateContent|countTokens)$")
_GENERATE = re.compile(_MODEL_PATH + r"(?:generateContent|streamGenerateContent)$")
_COUNT = re.compile(_MODEL_PATH + r"countTokens$")

# -- shape ---------------------------------------------------------------------------------------


def check_top(body: Mapping[str, Any]) -> None:
    """Everything of a generateContent body but its contents' insides."""
    check_depth_around(body, "contents")
    contents = body.get("contents")
    if not isinstance(contents, list):
        raise RequestShapeError("'contents' is required and must be an array")
    si = body.get("systemInstruction")
    if si is not None:
        require_type(si, dict, "'systemInstruction'", "an object")
        _check_parts(si.get("parts"), "systemInstruction")
    if body.get("tools") is not None:
        require_type(body["tools"], list, "'tools'", "an array")
    if body.get("generationConfig") is not None:
        require_type(body["generationConfig"], dict, "'generationConfig'", "an object")


def check_content(i: int, c: Any) -> None:
    """One Gemini content (``contents[i]``)."""
    require_type(c, dict, f"contents[{i}]", "an object")
    optional_type(c, "role", str, f"contents[{i}]", "a string")
    _check_parts(c.get("parts"), f"contents[{i}]")


def _check_parts(parts: Any, where: str) -> None:
    if parts is None:
        return
    require_type(parts, list, f"{where}.parts", "an array")
    for j, p in enumerate(parts):
        pw = f"{where}.parts[{j}]"
        require_type(p, dict, pw, "an object")
        optional_type(p, "text", str, pw, "a string")
        for key in ("inlineData", "fileData", "functionCall", "functionResponse"):
            optional_type(p, key, dict, pw, "an object")


# -- count ---------------------------------------------------------------------------------------


IMAGE_TOKENS = 258


def count(
    body: Mapping[str, Any],
    counter: TextCounter,
    fmt: ChatFormat | None = None,
    chunks: re.Pattern[str] | None = None,
    prior: Prior | None = None,
    memo: CountCache | None = None,
) -> RequestCount:
    """Input tokens of a Gemini ``generateContent`` body (a ``countTokens`` body carries the same
    fields, or a ``generateContentRequest`` holding them). Gemini's tokenizer ships with no
    package: the model entry's calibrated estimate counts, and ``countTokens`` is the reference
    the estimate-error metric compares it with. ``memo``: the count cache, which remembers
    contents by their bytes."""
    if isinstance(body.get("generateContentRequest"), dict):
        body = body["generateContentRequest"]
    check = check_content if prior is None else None
    if check is not None:  # a body derived from a checked one has its shape
        check_top(body)
    fmt = fmt or ChatFormat()
    tally = Tally(counter, prior)
    count = counter.count
    si = body.get("systemInstruction")
    if isinstance(si, dict):
        for j, part in enumerate(si.get("parts") or []):
            tally.add(-1, j, Component.SYSTEM, count(str(part.get("text") or "")))
    for k, tool in enumerate(body.get("tools") or []):
        tally.add(-2, k, Component.TOOL_DEFINITIONS, count(json_text(tool)))
    contents = body["contents"]
    last_user = max(
        (
            i
            for i, c in enumerate(contents)
            if isinstance(c, dict) and c.get("role", "user") == "user"
        ),
        default=-1,
    )
    ctx = count_context("gemini", counter, fmt, chunks)

    def classify(i: int, _content: Any) -> tuple[Component, bool, bool]:
        return (Component.LATEST_USER if i == last_user else Component.HISTORY), False, False

    marks = (last_user, -1)
    walk_items(tally, memo, prior, ctx, contents, marks, fmt, chunks, check, classify, _content)
    tally.add(-1, -1, Component.LATEST_USER, fmt.reply_priming)
    return tally.result()


def _content(
    tally: Tally,
    i: int,
    c: Any,
    comp: Component,
    _flag: bool,
    fmt: ChatFormat,
    chunks: re.Pattern[str] | None,
) -> None:
    count = tally.counter.count
    tally.add(i, -1, comp, fmt.per_message, frame=True)
    for j, part in enumerate(c.get("parts") or []):
        if "text" in part:
            tally.text(i, j, comp, str(part.get("text") or ""), chunks)
        elif "inlineData" in part:
            tally.add(i, j, comp, IMAGE_TOKENS)
        elif "fileData" in part:
            tally.add(i, j, Component.RETRIEVED, count(json_text(part)))
        elif isinstance(part.get("functionResponse"), dict):
            tally.add(
                i, j, Component.TOOL_RESULTS, _response_tokens(part["functionResponse"], count)
            )
        elif isinstance(part.get("functionCall"), dict):
            tally.add(i, j, comp, _call_tokens(part, count))
        else:
            tally.add(i, j, comp, count(json_text(part)))


def _framed(named: Mapping[str, Any], count: Callable[[str], int]) -> int:
    """A function response's framing and its name, as the other APIs frame a tool result."""
    return TOOL_FRAME + count(str(named.get("name") or ""))


def _call_tokens(part: Mapping[str, Any], count: Callable[[str], int]) -> int:
    """A ``functionCall`` part as the other APIs count a tool call: its name and its arguments'
    JSON (the id only pairs it with its response); anything else the part carries (a thought
    signature) as its JSON."""
    fc = part["functionCall"]
    rest = {k: v for k, v in part.items() if k != "functionCall"}
    call = call_tokens(str(fc.get("name") or ""), json_text(fc.get("args") or {}), count)
    return call + (count(json_text(rest)) if rest else 0)


def _response_overhead(fr: Mapping[str, Any], count: Callable[[str], int]) -> int:
    """What a ``functionResponse`` costs besides its result: its framing, its name and the key
    of its text field (``result`` once shortened or cleared)."""
    key = _text_field(fr.get("response")) or "result"
    return _framed(fr, count) + count(key)


def _response_tokens(fr: Mapping[str, Any], count: Callable[[str], int]) -> int:
    """A ``functionResponse`` as the other APIs count a tool result: a response of one text
    field as that text (not the JSON escapes of it), any other as its JSON; with its name and
    framing (the id only pairs it with its call)."""
    response = fr.get("response")
    key = _text_field(response)
    if key is not None and isinstance(response, Mapping):
        return _response_overhead(fr, count) + count(str(response[key]))
    body = response if response is not None else {}
    return _framed(fr, count) + count(json_text(body))


def requested_output(body: Mapping[str, Any]) -> int | None:
    """``generationConfig.maxOutputTokens``."""
    cfg = body.get("generationConfig")
    return output_cap(cfg.get("maxOutputTokens")) if isinstance(cfg, dict) else None


# -- usage ---------------------------------------------------------------------------------------


def _usage(u: Usage, obj: Any) -> None:
    if not isinstance(obj, dict):
        return
    meta = obj.get("usageMetadata")
    if isinstance(meta, dict):
        if int_of(meta.get("promptTokenCount")) is not None:
            u.input_tokens = int_of(meta.get("promptTokenCount"))
        if int_of(meta.get("candidatesTokenCount")) is not None:
            u.output_tokens = int_of(meta.get("candidatesTokenCount"))
        if int_of(meta.get("cachedContentTokenCount")) is not None:
            u.cached_tokens = int_of(meta.get("cachedContentTokenCount"))
        if int_of(meta.get("thoughtsTokenCount")) is not None:
            u.reasoning_tokens = int_of(meta.get("thoughtsTokenCount"))
    if isinstance(obj.get("modelVersion"), str):
        u.response_model = obj["modelVersion"]
    cands = obj.get("candidates")
    if isinstance(cands, list):
        for c in cands:
            if isinstance(c, dict) and isinstance(c.get("finishReason"), str):
                u.finish_reason = c["finishReason"]


def body_usage(body: bytes) -> Usage:
    """A ``generateContent`` reply, or a ``countTokens`` one (``totalTokens``)."""
    u = Usage()
    obj = load_json(body)
    _usage(u, obj)
    if isinstance(obj, dict) and u.input_tokens is None:
        u.input_tokens = int_of(obj.get("totalTokens"))
    return u


class GenerateStreamTap(StreamTap):
    """``streamGenerateContent?alt=sse``: every event is a partial response; usage comes with
    the last ones, and the stream is whole once a candidate carries its ``finishReason`` (the
    API sends no end marker)."""

    __slots__ = ()

    @staticmethod
    def error_event(message: str) -> bytes:
        err = {"error": {"code": 502, "message": message, "status": "UNAVAILABLE"}}
        return b"data: " + orjson.dumps(err) + b"\n\n"

    whole_reads = True
    marks = (b"usageMetadata", b"finishReason", b'"error"')

    def on_event(self, event: bytes) -> bytes | None:
        if (
            b"usageMetadata" not in event
            and b"finishReason" not in event
            and b'"error"' not in event
        ):
            return event
        _, data = event_data(event)
        with contextlib.suppress(orjson.JSONDecodeError):
            obj = orjson.loads(data)
            if isinstance(obj, dict) and "error" in obj:
                self.upstream_error = True
                return event
            _usage(self.usage, obj)
            if self.usage.finish_reason:
                self.complete = True
        return event


# -- the answer ----------------------------------------------------------------------------------


def _openapi_to_json_schema(node: Any, depth: int = 0) -> Any:
    """Gemini's ``responseSchema`` and function ``parameters`` are OpenAPI 3.0 schema objects
    (upper-case ``type`` names, ``nullable``): the same schema in JSON Schema terms."""
    if depth > 64:
        return {}
    if isinstance(node, list):
        return [_openapi_to_json_schema(x, depth + 1) for x in node]
    if not isinstance(node, Mapping):
        return node
    out: dict[str, Any] = {}
    for k, v in node.items():
        if k == "type" and isinstance(v, str):
            out[k] = v.lower()
        elif k == "nullable":
            continue
        elif k in ("properties",) and isinstance(v, Mapping):
            out[k] = {p: _openapi_to_json_schema(s, depth + 1) for p, s in v.items()}
        elif k in ("items", "anyOf", "oneOf", "allOf"):
            out[k] = _openapi_to_json_schema(v, depth + 1)
        else:
            out[k] = v
    if node.get("nullable") is True and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    return out


def _schema(node: Mapping[str, Any], json_key: str, openapi_key: str) -> Any:
    """A JSON Schema as given (``*JsonSchema``), else the OpenAPI one converted, else None."""
    js = node.get(json_key)
    if isinstance(js, Mapping):
        return js
    api = node.get(openapi_key)
    return _openapi_to_json_schema(api) if isinstance(api, Mapping) else None


def expect(obj: Mapping[str, Any]) -> Expect:
    """What a generateContent request asks its answer to be (``generationConfig``'s JSON
    response settings, function declarations)."""
    gc = obj.get("generationConfig") or obj.get("generation_config")
    json_, schema = False, None
    if isinstance(gc, Mapping):
        json_ = (gc.get("responseMimeType") or gc.get("response_mime_type")) == "application/json"
        schema = _schema(gc, "responseJsonSchema", "responseSchema") or _schema(
            gc, "response_json_schema", "response_schema"
        )
    named: dict[str, Any] = {}
    for t in obj.get("tools") or () if isinstance(obj.get("tools"), list) else ():
        decls = (
            t.get("functionDeclarations") or t.get("function_declarations")
            if isinstance(t, Mapping)
            else None
        )
        for d in decls if isinstance(decls, list) else ():
            if isinstance(d, Mapping) and isinstance(d.get("name"), str):
                named[d["name"]] = _schema(d, "parametersJsonSchema", "parameters") or _schema(
                    d, "parameters_json_schema", "parameters"
                )
    return expectation(json_, schema, (named, set()) if named else None)


def read_answer(objs: Iterable[Any], stream: bool) -> Answer:
    """The first candidate of a response, or of each streamed partial response (thought
    parts skipped)."""
    a = Answer()
    text: list[str] = []
    for o in objs:
        if not isinstance(o, Mapping):
            continue
        cands = o.get("candidates")
        if not isinstance(cands, list) or not cands or not isinstance(cands[0], Mapping):
            continue
        c = cands[0]
        if isinstance(c.get("finishReason"), str):
            a.finish = c["finishReason"]
        content = c.get("content")
        for p in content.get("parts") or () if isinstance(content, Mapping) else ():
            if not isinstance(p, Mapping) or p.get("thought") is True:
                continue
            if isinstance(p.get("text"), str):
                text.append(p["text"])
            fc = p.get("functionCall") or p.get("function_call")
            if isinstance(fc, Mapping):
                a.tool_calls.append((str(fc.get("name") or ""), fc.get("args", {})))
    a.text = "".join(text)
    a.malformed_call = a.finish in ("MALFORMED_FUNCTION_CALL", "UNEXPECTED_TOOL_CALL")
    return a


def prompt(body: Mapping[str, Any]) -> Prompt:
    """``systemInstruction``, the latest user content, the tools."""
    si = body.get("systemInstruction") or body.get("system_instruction")
    return Prompt(
        text_of(si.get("parts")) if isinstance(si, Mapping) else "",
        text_of(latest(body.get("contents"), ("user",))),
        body.get("tools"),
    )


# -- errors --------------------------------------------------------------------------------------

ERROR_STATUS = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    408: "DEADLINE_EXCEEDED",
    413: "INVALID_ARGUMENT",
    429: "RESOURCE_EXHAUSTED",
    431: "INVALID_ARGUMENT",
    500: "INTERNAL",
    502: "UNAVAILABLE",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


def error_body(status: int, message: str, code: str | None = None) -> bytes:
    """google.rpc.Status, as the Gemini API and the google-genai SDK use it."""
    return orjson.dumps(
        {
            "error": {
                "code": status,
                "message": message,
                "status": ERROR_STATUS.get(status, "UNKNOWN"),
            }
        }
    )


# -- trimming ------------------------------------------------------------------------------------


def _answers_call(m: Any) -> bool:
    parts = m.get("parts") if isinstance(m, dict) else None
    return isinstance(parts, list) and any(
        isinstance(p, dict) and "functionResponse" in p for p in parts
    )


class GenerateRules(TrimRules):
    """The contents play the part of messages and their parts the blocks: tool results are
    ``functionResponse`` parts of a user content, answering the ``functionCall`` parts of a
    ``model`` content by id (without ids: the oldest open call of the same name). A result
    whose response is one text field (``result``, ``output``...) is shortened in that field;
    any other response is shortened as its JSON text under ``result``; a result is cleared
    under ``result``."""

    blocks_key = "parts"
    items_key = "contents"

    def empty_block(self) -> Any:
        return {"text": PLACEHOLDER}

    def is_result(self, m: dict[str, Any]) -> bool:
        return m.get("role", "user") == "user" and _answers_call(m)

    def starts_turn(self, m: Any) -> bool:
        return isinstance(m, dict) and m.get("role", "user") == "user" and not _answers_call(m)

    def tool_uses(self, messages: list[Any], tokens: Callable[[int, int], int]) -> list[ToolUse]:
        calls: dict[str, tuple[tuple[int, int], str]] = {}
        pending: list[str] = []  # calls not answered yet, in order
        uses: list[ToolUse] = []
        for i, m in enumerate(messages):
            if not (isinstance(m, dict) and isinstance(m.get("parts"), list)):
                continue
            for j, part in enumerate(m["parts"]):
                if not isinstance(part, dict):
                    continue
                if isinstance(part.get("functionCall"), dict):
                    fc = part["functionCall"]
                    name = str(fc.get("name", ""))
                    calls[str(fc.get("id") or f"{name}#{len(calls)}")] = ((i, j), name)
                    pending.append(str(fc.get("id") or f"{name}#{len(calls) - 1}"))
                elif isinstance(part.get("functionResponse"), dict):
                    fr = part["functionResponse"]
                    name = str(fr.get("name", ""))
                    cid = str(fr.get("id") or "")
                    if not cid:  # no ids: a response answers the oldest open call of its name
                        cid = next((c for c in pending if calls[c][1] == name), "")
                    if cid in pending:
                        pending.remove(cid)
                    where = calls[cid][0] if cid in calls else None
                    uses.append(ToolUse((i, j), where, name, fr.get("id") or name, tokens(i, j)))
        return uses

    def placeholder(self, m: dict[str, Any], j: int, text: str) -> Any:
        part = m["parts"][j]
        key = _text_field(part["functionResponse"].get("response")) or "result"
        return {
            **part,
            "functionResponse": {**part["functionResponse"], "response": {key: text}},
        }

    def result_text(self, m: dict[str, Any], j: int) -> Any:
        response = m["parts"][j]["functionResponse"].get("response")
        key = _text_field(response)
        return response[key] if key else None

    def results(self, m: dict[str, Any]) -> Iterator[tuple[int, str | None]]:
        parts = m.get("parts")
        for j, part in enumerate(parts if isinstance(parts, list) else []):
            fr = part.get("functionResponse") if isinstance(part, dict) else None
            if not isinstance(fr, dict):
                continue
            response = fr.get("response")
            key = _text_field(response)
            if key and isinstance(response, dict):
                yield j, response[key]
            else:
                yield j, json_text(response) if isinstance(response, dict) else None

    def result_overhead(self, m: dict[str, Any], j: int, counter: TextCounter) -> int:
        # the name, the framing and the text field's key stay when the result is replaced or
        # shortened (see _response_tokens)
        return _response_overhead(m["parts"][j]["functionResponse"], counter.count)

    def call_input(self, m: dict[str, Any], k: int) -> Any:
        return m["parts"][k]["functionCall"].get("args", {})

    def without_inputs(self, m: dict[str, Any], calls: set[int]) -> dict[str, Any]:
        m["parts"] = [
            {**p, "functionCall": {**p["functionCall"], "args": {}}} if k in calls else p
            for k, p in enumerate(m["parts"])
        ]
        return m


def _text_field(response: Any) -> str | None:
    """The one field of a response that holds its text (``{"result": "..."}``); None: the
    response is structured otherwise."""
    if isinstance(response, dict) and len(response) == 1:
        key, value = next(iter(response.items()))
        if isinstance(value, str):
            return str(key)
    return None


def too_long(tokens: int, budget: int, detail: str) -> str:
    """Gemini's words for a prompt over the window."""
    return (
        f"The input token count ({tokens}) exceeds the maximum number of tokens allowed "
        f"({budget}) ({detail})."
    )


def _provider(path: str) -> str:
    return "gcp.vertex_ai" if "/projects/" in path else "gcp.gemini"


#: the provider's other routes (passed through): first path segment -> the ``route`` label
PASSTHROUGH_ROUTES = MappingProxyType(
    {
        "models": "models",
        "files": "files",
        "cachedContents": "cached_contents",
        "tunedModels": "tuned_models",
        "projects": "vertex",
    }
)


#: Google's Gemini API and Vertex AI; a Google API key goes to no other upstream
API = ApiInfo(
    "gemini",
    "Google's Gemini API (``https://generativelanguage.googleapis.com``) or Vertex AI "
    "(``https://REGION-aiplatform.googleapis.com``)",
    "https://generativelanguage.googleapis.com",
    owns=lambda headers: "x-goog-api-key" in headers,
    credentials="a Google API key (x-goog-api-key)",
    prices="google",
    key_headers=lambda key: {"x-goog-api-key": key} if key else {},
    key_env="GEMINI_API_KEY",
)

FORMAT = Format(
    shape="gemini",
    api="gemini",
    count=count,
    trim=GenerateRules(),
    requested_output=requested_output,
    body_usage=body_usage,
    tap=lambda _changed: GenerateStreamTap(),
    expect=expect,
    read_answer=read_answer,
    prompt=prompt,
    error_body=error_body,
    too_long=too_long,
    path_as_sent=True,
    operation="generate_content",
    provider=_provider,
    stream_suffix=":streamGenerateContent",
    passthrough_routes=PASSTHROUGH_ROUTES,
    client_headers=("x-goog-api-key",),
    client_paths=("/v1beta/", "/v1alpha/", "/v1/projects/", "/upload/"),
)

ROUTES = (
    Route(
        FORMAT,
        "gemini_generate",
        "/{version}/models/{model}:generateContent",
        pattern=_GENERATE,
        path_model=model_in_path,
        path_model_first=True,
    ),
    Route(
        FORMAT,
        "gemini_count_tokens",
        "/{version}/models/{model}:countTokens",
        pattern=_COUNT,
        count_only=True,
        path_model=model_in_path,
        path_model_first=True,
    ),
)
