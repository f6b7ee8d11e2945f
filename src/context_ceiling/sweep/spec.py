"""What a sweep measures, named once (:class:`Spec`): the command line fills it in, ``plan.json``
stores it, the solver calls with it, the analysis judges by it.

Why one model: options declared apart drift apart, in name and in default, and a sweep is
re-run and compared with a stored one, so what it measured must read the same wherever it is
read (the command's options are generated from this model: :class:`Asked`).
"""

from __future__ import annotations

from typing import Annotated, Literal, Self

from pydantic import ConfigDict, field_validator, model_validator

from context_ceiling.core.options import Option
from context_ceiling.core.strict import Strict
from context_ceiling.core.vocabulary import SweepApi
from context_ceiling.formats import SWEEP_APIS

#: the APIs whose batch interface the sweep speaks (OpenAI Batch, Anthropic Message Batches)
BATCH_APIS = ("openai", "anthropic")

__all__ = ["BATCH_APIS", "Asked", "Reasoning", "Spec"]

#: how a reasoning model is asked to think (``auto``: as the endpoint defaults)
Reasoning = Literal["auto", "off", "openai", "anthropic"]


class Asked(Strict):
    """What a sweep measures, as asked for, with ``base_url`` and ``model`` still optional (a
    ``--reduced`` run takes them from its baseline): ``ceiling sweep run``'s options are
    generated from these fields and their docstrings (:class:`Spec` is the finished form)."""

    model_config = ConfigDict(frozen=True, use_attribute_docstrings=True)

    # -- every call: the same at every level
    base_url: str | None = None
    """OpenAI-style base URL (with /v1), Anthropic base URL, or Bedrock runtime URL"""
    api: Annotated[SweepApi, Option(choices=tuple(SWEEP_APIS))] = "openai"
    """the upstream's API: openai = chat completions, anthropic = messages, bedrock = AWS
    Bedrock's Converse (signed with the AWS credential chain, or a Bedrock API key)"""
    model: str | None = None
    """model name sent upstream"""
    max_tokens: int = 100
    """output reservation per call"""
    json_mode: Annotated[bool, Option(flag="--no-json-mode")] = True
    """ask for a JSON object (response_format json_object); --no-json-mode does not"""
    reasoning: Reasoning = "auto"
    """reasoning models: openai = max_completion_tokens and no temperature, anthropic =
    extended thinking; auto switches to the openai form when the upstream refuses max_tokens or
    temperature"""
    reasoning_tokens: int = 0
    """reasoning reservation on top of --max-tokens (thinking budget for anthropic)"""
    batch: bool = False
    """send each step's calls through the provider's batch API (OpenAI Batch, Anthropic Message
    Batches): half the price, results within 24 hours; --resume waits on batches already sent"""

    # -- the material
    taskset: str = "contracts"
    """bundled name, a task set directory, inspect:FILE.py@TASK (an inspect_ai task) or
    records:FILE.jsonl (question / evidence / answer)"""
    items: int | None = None
    """items drawn (seeded) from the task set (default: as many as --tolerance needs, started at
    half and added adaptively where the decision is open)"""
    shared_haystack: bool = False
    """many items' evidence in one haystack per level (one haystack, several questions)"""

    # -- the design
    levels: str = "0.2,0.5,0.8,max"
    """utilization levels, comma-separated; max = the practical limit"""
    repeats: int = 3
    """calls per item and level"""
    window: str = "auto"
    """context window in tokens, or auto: a llama.cpp server's own, else the model's advertised
    window in the price data set"""
    tokenizer: Annotated[str, Option(choices=("auto", "engine", "o200k_base", "cl100k_base"))] = (
        "auto"
    )
    """how fill is counted: engine = the server's /tokenize; auto = engine when it answers"""
    tokenize_url: str | None = None
    """the engine's root URL for /tokenize when --base-url is a sidecar or proxy"""
    control: Annotated[bool, Option(flag="--no-control")] = True
    """the closed-book control calls (every item with no documents); --no-control skips them"""
    low_fill: float = 0.1
    """a control level below the reference, to see a drop that starts before it (0: none)"""
    seed: int = 0
    """seeds the item draw, the haystacks and the calls"""

    @field_validator("api")
    @classmethod
    def _callable(cls, v: str) -> str:
        if v not in SWEEP_APIS:
            raise ValueError(f"{v!r}: the sweep calls {', '.join(SWEEP_APIS)}")
        return v

    @model_validator(mode="after")
    def _batchable(self) -> Self:
        if self.batch and self.api not in BATCH_APIS:
            raise ValueError(f"batch: the {self.api} API's batch inference is not supported")
        return self

    # -- the decision
    tolerance: float = 0.05
    """largest accuracy drop from the reference that still passes; sizes the sweep"""
    margin: float = 0.05
    """share of the passing fill held back below it"""
    resolution: float = 0.05
    """smallest gap in utilization the refinement between levels measures"""


class Spec(Asked):
    """What a sweep measures, as asked for. ``levels`` and ``window`` are the arguments; the plan
    resolves them (the levels in fill, the window in tokens) before the first call."""

    # required here, so a finished spec types them as set; the option's help is the same
    base_url: str
    """OpenAI-style base URL (with /v1), Anthropic base URL, or Bedrock runtime URL"""
    model: str
    """model name sent upstream"""
