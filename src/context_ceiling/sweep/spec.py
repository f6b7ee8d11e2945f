"""What a sweep measures, named once (:class:`Spec`): the command line fills it in, ``plan.json``
stores it, the solver calls with it, the analysis judges by it.

Why one model: options declared apart drift apart, in name and in default, and a sweep is
re-run and compared with a stored one, so what it measured must read the same wherever it is
read (the command's options are checked against this model by a test).
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, field_validator, model_validator

from context_ceiling.core.strict import Strict
from context_ceiling.core.vocabulary import SweepApi
from context_ceiling.formats import SWEEP_APIS

#: the APIs whose batch interface the sweep speaks (OpenAI Batch, Anthropic Message Batches)
BATCH_APIS = ("openai", "anthropic")

__all__ = ["BATCH_APIS", "Reasoning", "Spec"]

#: how a reasoning model is asked to think (``auto``: as the endpoint defaults)
Reasoning = Literal["auto", "off", "openai", "anthropic"]


class Spec(Strict):
    """What a sweep measures, as asked for. ``levels`` and ``window`` are the arguments; the plan
    resolves them (the levels in fill, the window in tokens) before the first call."""

    model_config = ConfigDict(frozen=True)

    # -- every call: the same at every level
    #: the endpoint's base URL (OpenAI style ``.../v1``, or Anthropic's)
    base_url: str
    #: the API called (``openai``: chat completions, ``anthropic``: messages, ``bedrock``: AWS
    #: Bedrock's Converse, signed with the AWS credential chain or sent with a Bedrock API key)
    api: SweepApi = "openai"
    model: str
    #: the output each call may write
    max_tokens: int = 100
    #: ask for a JSON object (``response_format``)
    json_mode: bool = True
    reasoning: Reasoning = "auto"
    #: the thinking budget a reasoning model gets (Anthropic), reserved on top of the output
    reasoning_tokens: int = 0
    #: the calls through the provider's batch API (OpenAI Batch, Anthropic Message Batches)
    batch: bool = False

    # -- the material
    #: a bundled task set's name or a task set directory
    taskset: str = "contracts"
    #: a fixed number of items (None: as many as the tolerance needs)
    items: int | None = None
    #: the padding shared by the items of a group (one haystack, several questions)
    shared_haystack: bool = False

    # -- the design
    #: fills, comma-separated, ``max`` for the practical limit
    levels: str = "0.2,0.5,0.8,max"
    repeats: int = 3
    #: the window in tokens, or ``auto`` (a llama.cpp server says)
    window: str = "auto"
    #: the counter that measures fill (``auto``: the engine's own tokenizer where it has one)
    tokenizer: str = "auto"
    tokenize_url: str | None = None
    #: the closed-book control (every item with no documents)
    control: bool = True
    #: a control level below the reference (0: none)
    low_fill: float = 0.1
    seed: int = 0

    @field_validator("api")
    @classmethod
    def _callable(cls, v: str) -> str:
        if v not in SWEEP_APIS:
            raise ValueError(f"{v!r}: the sweep calls {', '.join(SWEEP_APIS)}")
        return v

    @model_validator(mode="after")
    def _batchable(self) -> Spec:
        if self.batch and self.api not in BATCH_APIS:
            raise ValueError(f"batch: the {self.api} API's batch inference is not supported")
        return self

    # -- the decision
    tolerance: float = 0.05
    margin: float = 0.1
    resolution: float = 0.05
