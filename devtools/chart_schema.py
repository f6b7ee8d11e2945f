"""The generated parts of the chart's ``values.schema.json``: ``config`` (the sidecar's
``sidecar.yaml``) from the pydantic model the sidecar itself loads, and ``prometheusRule.alerts``
from the dashboards' alert list, so neither can drift from what they describe (``helm install``
refuses a config the pod would crash-loop on). The rest of the schema is written by hand.

Regenerate: ``python -m devtools.chart_schema`` (a test fails when the committed file is stale).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from context_ceiling.sidecar.config import Settings
from dashboards.config import ALERTS

SCHEMA = Path(__file__).resolve().parent.parent / "helm" / "context-ceiling" / "values.schema.json"
#: what the chart sets in the rendered sidecar.yaml itself (templates/_helpers.tpl)
CHART_OWNED = ("listen", "ceilings_file", "ceilings_persist")
DURATION = r"^[0-9]+(ms|s|m|h|d|w|y)$"


def _strip_titles(node: Any) -> Any:
    """pydantic's ``title`` on every field only repeats the key."""
    if isinstance(node, dict):
        return {
            k: _strip_titles(v) for k, v in node.items() if k != "title" or not isinstance(v, str)
        }
    if isinstance(node, list):
        return [_strip_titles(v) for v in node]
    return node


def config_schema() -> tuple[dict[str, Any], dict[str, Any]]:
    """(the ``config`` property, its definitions): the model's validation schema, refs pointing
    into the values schema's ``definitions``."""
    raw = Settings.model_json_schema(ref_template="#/definitions/{model}")
    definitions = _strip_titles(raw.pop("$defs", {}))
    prop = _strip_titles(raw)
    prop["description"] = (
        "sidecar.yaml (docs/reference/config.md), validated by the sidecar's own model; "
        + ", ".join(CHART_OWNED)
        + " are set by the chart"
    )
    prop["not"] = {"anyOf": [{"required": [k]} for k in CHART_OWNED]}
    return prop, definitions


def alerts_schema() -> dict[str, Any]:
    props: dict[str, Any] = {}
    for name, d in ALERTS.items():
        fields: dict[str, Any] = {
            "enabled": {"type": "boolean"},
            "severity": {"enum": ["critical", "warning", "info"]},
            "for": {"type": "string", "pattern": DURATION},
        }
        required = ["enabled", "severity", "for"]
        if d.threshold is not None:
            fields["threshold"] = {
                "description": d.threshold_means,
                # a number; `helm --set` passes a decimal as a string
                "anyOf": [
                    {"type": "number", "minimum": 0},
                    {"type": "string", "pattern": r"^[0-9]+(\.[0-9]+)?$"},
                ],
            }
            required.append("threshold")
        for param in d.params:
            fields[param.key] = {
                "description": param.means,
                "anyOf": [
                    {"type": "number", "minimum": 0},
                    {"type": "string", "pattern": r"^[0-9]+(\.[0-9]+)?$"},
                ],
            }
            required.append(param.key)
        props[name] = {
            "type": "object",
            "additionalProperties": False,
            "required": required,
            "properties": fields,
        }
    return {
        "type": "object",
        "additionalProperties": False,
        "required": list(ALERTS),
        "properties": props,
    }


def render(current: dict[str, Any]) -> dict[str, Any]:
    schema = copy.deepcopy(current)
    config, definitions = config_schema()
    schema["properties"]["config"] = config
    schema["definitions"] = definitions
    schema["properties"]["prometheusRule"]["properties"]["alerts"] = alerts_schema()
    return schema


def text(schema: dict[str, Any]) -> str:
    return json.dumps(schema, indent=2) + "\n"


def main() -> None:
    SCHEMA.write_text(text(render(json.loads(SCHEMA.read_text()))))


if __name__ == "__main__":
    main()
