"""Writes ``docs/reference/http-api.md`` from the sidecar's OpenAPI document
(:func:`context_ceiling.sidecar.openapi.document`): every operation with its parameters and
answers, every schema with its fields, and the document itself, so the page and
``GET /openapi.json`` cannot drift.

Run ``python -m devtools.http_api_docs``; a test fails when the committed page is stale.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from context_ceiling.sidecar.openapi import document

PAGE = Path(__file__).resolve().parent.parent / "docs" / "reference" / "http-api.md"


def _type(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{name.lower()})"
    if "anyOf" in schema:
        return " or ".join(_type(s) for s in schema["anyOf"])
    if schema.get("type") == "array":
        return f"list of {_type(schema.get('items', {}))}"
    if "const" in schema:
        return f"`{schema['const']}`"
    return str(schema.get("type", "any"))


def render() -> str:
    spec = document()
    out = [
        "# HTTP API",
        "",
        "The sidecar's own API, generated from the OpenAPI document it serves at "
        "`GET /openapi.json` (OpenAPI 3.1; generate a client from it in any language). The "
        "proxied provider routes are the providers' own APIs; `/metrics` is Prometheus' text "
        "format.",
        "",
    ]
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            out += [f"## `{method.upper()} {path}`", "", op["summary"] + ".", ""]
            if op.get("security"):
                auth = "optional" if {} in op["security"] else "required"
                out += [f"Bearer token: {auth}.", ""]
            params = op.get("parameters") or []
            if params:
                out += ["| parameter | in | required | type | meaning |", "|---|---|---|---|---|"]
                for p in params:
                    out.append(
                        f"| `{p['name']}` | {p['in']} | {'yes' if p['required'] else 'no'} | "
                        f"{_type(p['schema'])} | {p.get('description', '')} |"
                    )
                out.append("")
            out += ["| status | answer |", "|---|---|"]
            for status, r in op["responses"].items():
                schema = r["content"]["application/json"]["schema"]
                out.append(f"| {status} | {r['description']}: {_type(schema)} |")
            out.append("")
    out += ["## Schemas", ""]
    for name, schema in spec["components"]["schemas"].items():
        out += [f"### {name}", "", (schema.get("description") or "").strip(), ""]
        required = set(schema.get("required") or [])
        props = schema.get("properties") or {}
        if props:
            out += ["| field | type | required | meaning |", "|---|---|---|---|"]
            for field, f in props.items():
                meaning = (f.get("description") or "").replace("\n", " ")
                out.append(
                    f"| `{field}` | {_type(f)} | {'yes' if field in required else 'no'} | "
                    f"{meaning} |"
                )
            out.append("")
    out += [
        "## The document",
        "",
        "```json",
        json.dumps(spec, indent=1, sort_keys=True),
        "```",
        "",
    ]
    return "\n".join(out)


def main() -> None:
    PAGE.write_text(render())
    print(f"wrote {PAGE}")


if __name__ == "__main__":
    main()
