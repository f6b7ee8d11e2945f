"""The one base of every typed document the product reads or writes (the sidecar config, the
ceilings document, model specs, task sets, sweep plans and call records): unknown keys are
refused, so a typo is an error that names the key instead of a setting silently ignored; and a
parsed document is frozen, so what was validated is what is used."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
