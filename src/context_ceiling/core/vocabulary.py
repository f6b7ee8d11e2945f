"""The vocabulary every layer shares, defined once: which API a client speaks, which shape a
request body has, the enforcement modes, and the trimming stages with the input component each
one removes tokens from.

Why one module: the sidecar renders errors per ``Api``, the trimmer works per ``Shape``, the
config, the ceilings document and the command line all accept a ``Mode``, and the metrics and
spans report trimmed tokens per component. Defined apart, they drifted; here a new stage is one
edit that mypy then follows everywhere. APIs and shapes are the format registry's names: a new
provider is a module under ``formats/``, not an edit of this vocabulary.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Annotated, Literal, get_args

from pydantic import BeforeValidator

from context_ceiling.core.utilization import Component

#: whose client called: the error body's format and the SDK that must parse it. A name the
#: format registry defines (``context_ceiling.formats.APIS``): a provider module adds one
#: without an edit here
Api = str

#: an API a sweep calls a model through: a name of the format registry whose format writes a
#: question (``context_ceiling.formats.SWEEP_APIS``: OpenAI chat, Anthropic messages, Bedrock
#: Converse)
SweepApi = str

#: the request body's shape (OpenAI's Responses API is an OpenAI client with another shape): a
#: name the format registry defines (``context_ceiling.formats.FORMATS``), whose format module
#: gives the trimmer its rules
Shape = str

#: ``off``: forward untouched; ``observe``: measure and report what enforcing would do;
#: ``enforce``: trim (or reject) to the ceiling
Mode = Literal["off", "observe", "enforce"]
MODES: tuple[Mode, ...] = get_args(Mode)


def _yaml_off(value: object) -> object:
    """YAML 1.1 (PyYAML, Helm values) reads an unquoted ``off`` as false: take it as ``"off"``,
    so ``mode: off`` means what it says whether quoted or not (``on`` is no mode: still an
    error)."""
    return "off" if value is False else value


#: a mode as documents and config files spell it (``mode: off`` unquoted included)
ModeValue = Annotated[
    Mode,
    BeforeValidator(_yaml_off, json_schema_input_type=Mode | Literal[False]),
]

#: how a ceiling is enforced: ``trim`` (the sidecar trims to it), ``native`` (the provider's own
#: context management is given the ceiling as its threshold; the sidecar's trimming stays the
#: safety net for the window), ``auto`` (native where the upstream is known to support it)
Strategy = Literal["trim", "native", "auto"]

#: what happens to a request over its ceiling in enforce mode: ``trim`` to fit (rejected when
#: trimming cannot), ``reject`` it, ``fallback`` to the first listed model whose own ceiling it
#: fits, or ``trim_then_fallback`` (trim within the stated loss, fall back when that is not
#: enough)
OverCeiling = Literal["trim", "reject", "fallback", "trim_then_fallback"]

#: the trimming stages, in their default order (``clear``: older tool results replaced whole)
Stage = Literal["clear", "tool_results", "retrieved", "history"]
STAGES: tuple[Stage, ...] = get_args(Stage)

#: the input component each stage removes tokens from
STAGE_COMPONENT: Mapping[Stage, Component] = MappingProxyType(
    {
        "clear": Component.TOOL_RESULTS,
        "tool_results": Component.TOOL_RESULTS,
        "retrieved": Component.RETRIEVED,
        "history": Component.HISTORY,
    }
)
