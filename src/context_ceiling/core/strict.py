"""The one base of every typed document the product reads or writes (the sidecar config, the
ceilings document, model specs, task sets, sweep plans and call records): unknown keys are
refused, so a typo is an error that names the key instead of a setting silently ignored; a
parsed document is frozen, so what was validated is what is used; and every number in it is one
that everything downstream can hold (finite floats, integers within a signed 64-bit range), so
no value that parses can crash a gauge, a log line or a file written later."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, field_validator

#: the largest integer a document may hold: what a Prometheus sample, JSON in other languages
#: and a signed 64-bit column hold exactly enough to compare
MAX_INT = 2**63 - 1
#: the largest float: beyond it a float no longer holds every integer (and a timeout or a size
#: that large is a typo that would overflow a timer)
MAX_FLOAT = float(2**53)


def _bounded(value: Any) -> Any:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and not -MAX_INT <= value <= MAX_INT:
        raise ValueError(
            f"a {value.bit_length()}-bit integer is out of range (at most {MAX_INT}, a signed "
            "64-bit integer)"
        )
    if isinstance(value, float) and not -MAX_FLOAT <= value <= MAX_FLOAT:
        raise ValueError(f"{value:.3e} is out of range (at most {MAX_FLOAT:.0f})")
    if isinstance(value, list | tuple | set | frozenset):
        for v in value:
            _bounded(v)
    elif isinstance(value, dict):
        for v in value.values():
            _bounded(v)
    return value


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @field_validator("*", mode="after")
    @classmethod
    def _in_range(cls, value: Any) -> Any:
        return _bounded(value)
