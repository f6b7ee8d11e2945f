"""The model registry: which window, output limit and tokenizer a model name gets.

Shared by the sidecar (to count and label live traffic) and the sweep (to fill a level to a
target utilization with the same counter). A name resolves to the first entry whose exact name
matches, else the first glob that matches, in file order; anything else is ``other`` and is
never given a window it does not have.
"""

from __future__ import annotations

import fnmatch
import re
from typing import Annotated, Literal

from pydantic import Field, model_validator

from context_ceiling.core.strict import Strict
from context_ceiling.core.tokenizers import (
    Bpe,
    CalibratedCounter,
    CountCache,
    HuggingFaceCounter,
    TextCounter,
    TiktokenCounter,
)
from context_ceiling.core.vocabulary import OverCeiling, Strategy

OTHER = "other"


class TiktokenSpec(Strict):
    """Count with a shipped tiktoken encoding (OpenAI models)."""

    kind: Literal["tiktoken"] = "tiktoken"
    encoding: Literal["o200k_base", "cl100k_base"] = "o200k_base"


class HuggingFaceSpec(Strict):
    """Count with a local Hugging Face ``tokenizer.json`` (open models)."""

    kind: Literal["huggingface"]
    path: str


class CalibratedSpec(Strict):
    """A shipped encoding times a fitted factor, for models without a public tokenizer."""

    kind: Literal["calibrated"]
    encoding: Literal["o200k_base", "cl100k_base"] = "cl100k_base"
    factor: float = Field(gt=0, default=1.0)


class UpstreamSpec(Strict):
    """Ask the serving engine itself (llama.cpp ``/apply-template`` + ``/tokenize``, vLLM
    ``/tokenize``): exact for the prompt the engine will see, at one extra loopback call.
    Components are split in proportion to the ``fallback`` encoding's counts."""

    kind: Literal["upstream"]
    url: str
    style: Literal["llamacpp", "vllm"] = "llamacpp"
    fallback: Literal["o200k_base", "cl100k_base"] = "o200k_base"
    timeout_s: float = Field(gt=0, default=5.0)


TokenizerSpec = Annotated[
    TiktokenSpec | HuggingFaceSpec | CalibratedSpec | UpstreamSpec, Field(discriminator="kind")
]


class ChatFormat(Strict):
    """Per-message framing tokens the chat template adds around each message.

    OpenAI's published rule is 3 per message, 1 per name and 3 to prime the reply; ChatML
    models served by llama.cpp add 5 per message (``<|im_start|>role\\n ... <|im_end|>\\n``)."""

    per_message: int = Field(ge=0, default=3)
    per_name: int = Field(ge=0, default=1)
    reply_priming: int = Field(ge=0, default=3)
    #: tokens the template adds when the request has no system message (Qwen adds a default one)
    default_system: int = Field(ge=0, default=0)


class ModelPrice(Strict):
    """What a model's tokens cost, in US dollars per million tokens: for a private deployment
    or a negotiated rate, and 0 for a self-hosted model (unset: the list price)."""

    input: float = Field(ge=0, description="dollars per million uncached input tokens")
    output: float = Field(ge=0, description="dollars per million output tokens")
    cached_input: float | None = Field(
        default=None,
        ge=0,
        description="dollars per million input tokens read from a prompt cache; unset: input",
    )


#: model families whose tokenizer is not OpenAI's, by how their names start: a model of one
#: counted with a tiktoken encoding is estimated, not counted (a third off on a short prompt)
FOREIGN_FAMILIES: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(p, re.IGNORECASE), family)
    for p, family in (
        (r"(anthropic\.)?claude", "Anthropic's"),
        (r"(models/|google/)?(gemini|gemma)", "Google's"),
        (r"(meta[-/.])?(meta-)?llama", "Meta's Llama"),
        (r"(mistral(ai)?[/.])?(mistral|mixtral|codestral|ministral|magistral)", "Mistral's"),
        (r"(qwen/)?qwen", "Qwen's"),
        (r"(deepseek-ai/)?deepseek", "DeepSeek's"),
        (r"(cohere\.)?command", "Cohere's"),
        (r"(amazon\.)?(nova|titan)", "Amazon's"),
    )
)


def foreign_tokenizer(spec: ModelSpec) -> str | None:
    """The family whose own tokenizer a model entry's names belong to when the entry counts
    with a tiktoken encoding (set or by default), else None: ``--check`` says so, since the
    count is then an estimate (``calibrated``, ``huggingface`` and ``upstream`` are chosen on
    purpose and not flagged)."""
    if not isinstance(spec.tokenizer, TiktokenSpec):
        return None
    for name in (spec.match, spec.label or ""):
        for pattern, family in FOREIGN_FAMILIES:
            if pattern.match(name):
                return family
    return None


class ModelSpec(Strict):
    """One registry entry."""

    match: str = Field(min_length=1, description="exact model name or a glob such as 'gpt-4o*'")
    label: str | None = Field(
        default=None,
        description="metric label; defaults to the match string without its glob (gpt-4o* -> gpt-4o)",
    )
    window: int = Field(gt=0, description="context window in tokens")
    max_output_tokens: int = Field(gt=0, default=4096)
    #: tokens kept free for hidden reasoning on top of the requested output (reasoning models)
    reasoning_reservation: int = Field(ge=0, default=0)
    #: how this model's ceiling is enforced (trim, native, auto); unset: the workload's
    strategy: Strategy | None = None
    #: what a request over this model's ceiling gets in enforce mode; unset: the workload's
    over_ceiling: OverCeiling | None = None
    fallback: list[str] = Field(
        default_factory=list,
        description="models (as clients name them) a request over this model's ceiling may be "
        "sent to instead, in order of preference; unset: the workload's",
    )
    tokenizer: TokenizerSpec = Field(default_factory=TiktokenSpec)
    chat_format: ChatFormat = Field(default_factory=ChatFormat)
    upstream: str | None = Field(
        default=None,
        description="the named upstream this model is served by (default: the API's own)",
    )
    price: ModelPrice | None = Field(
        default=None,
        description="what this model's tokens cost; unset: the list price of the requested model "
        "from genai-prices (a model it does not list is not priced)",
    )
    beta_windows: dict[str, int] = Field(
        default_factory=dict,
        description="the window when a request carries this anthropic-beta value, e.g. "
        "{'context-1m-2025-08-07': 1000000} (Claude's 1M-context beta)",
    )

    def for_betas(self, header: str | None) -> ModelSpec:
        """This entry as it applies to a request with this ``anthropic-beta`` header: a beta
        that widens the window widens it (a valid 275k-token request to a 1M-context Claude is
        not judged against 200k)."""
        if not header or not self.beta_windows:
            return self
        wider = [
            self.beta_windows[b.strip()]
            for b in header.split(",")
            if b.strip() in self.beta_windows
        ]
        return self.model_copy(update={"window": max(wider)}) if wider else self

    @model_validator(mode="after")
    def _output_fits(self) -> ModelSpec:
        if self.max_output_tokens >= self.window:
            raise ValueError(
                f"max_output_tokens ({self.max_output_tokens}) must be below window ({self.window})"
            )
        return self

    @property
    def is_glob(self) -> bool:
        return any(c in self.match for c in "*?[")

    @property
    def metric_label(self) -> str:
        """The model's name in metrics and ceilings documents: ``label``, else ``match`` with
        its glob cut off (``gpt-4o*`` -> ``gpt-4o``, ``claude-*`` -> ``claude``), so a ceiling
        written for the model's plain name applies to the entry that matches it."""
        if self.label:
            return self.label
        head = re.split(r"[*?\[]", self.match, maxsplit=1)[0].rstrip("-_.:/@")
        return head or self.match


def build_counter(spec: TokenizerSpec, bpe: Bpe = "auto") -> TextCounter:
    """The local text counter for a tokenizer spec (for ``upstream`` its fallback encoding);
    ``bpe``: which implementation encodes the tiktoken encodings (the same counts)."""
    if isinstance(spec, TiktokenSpec):
        return TiktokenCounter(spec.encoding, bpe)
    if isinstance(spec, HuggingFaceSpec):
        return HuggingFaceCounter(spec.path)
    if isinstance(spec, CalibratedSpec):
        return CalibratedCounter(TiktokenCounter(spec.encoding, bpe), spec.factor)
    return TiktokenCounter(spec.fallback, bpe)


class Registry:
    """Resolves request model names to entries; counters are built once per entry."""

    def __init__(
        self, specs: list[ModelSpec], cache: CountCache | None = None, bpe: Bpe = "auto"
    ) -> None:
        self.specs = list(specs)
        self._exact = {s.match: s for s in reversed(self.specs) if not s.is_glob}
        self._globs = [s for s in self.specs if s.is_glob]
        self._counters: dict[str, TextCounter] = {}
        self._memo: dict[str, ModelSpec | None] = {}
        for s in self.specs:
            counter = build_counter(s.tokenizer, bpe)
            self._counters[s.match] = cache.wrap(counter) if cache is not None else counter

    def resolve(self, model: str) -> ModelSpec | None:
        try:
            return self._memo[model]
        except KeyError:
            pass
        found = self._exact.get(model)
        if found is None:
            found = next((s for s in self._globs if fnmatch.fnmatchcase(model, s.match)), None)
        if len(self._memo) < 4096:  # bounded: model names come from clients
            self._memo[model] = found
        return found

    def counter(self, spec: ModelSpec) -> TextCounter:
        return self._counters[spec.match]

    def label(self, model: str) -> str:
        spec = self.resolve(model)
        return spec.metric_label if spec else OTHER
