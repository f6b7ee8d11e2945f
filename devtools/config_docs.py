"""Writes ``docs/reference/config.md`` from the pydantic model the sidecar itself loads
(``context_ceiling.sidecar.config.Settings``): every key, its type, default, environment
variable and meaning, taken from the model's field descriptions, ``#:`` comments and section
docstrings, so the reference cannot drift from what ``ceiling serve`` accepts.

Run ``python -m devtools.config_docs``; a test fails when the committed page is stale.
"""

from __future__ import annotations

import inspect
import re
import types
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from context_ceiling.sidecar.config import ENV_PREFIX, Settings

PAGE = Path(__file__).resolve().parent.parent / "docs" / "reference" / "config.md"


def _comments(cls: type) -> dict[str, str]:
    """``#:`` comments above each field of a class body (Sphinx's attribute-comment style)."""
    out: dict[str, str] = {}
    try:
        lines = inspect.getsource(cls).splitlines()
    except (OSError, TypeError):
        return out
    pending: list[str] = []
    for line in lines:
        stripped = line.strip()
        if stripped.startswith("#:"):
            pending.append(stripped[2:].strip())
            continue
        m = re.match(r"\s{4}(\w+)\s*:", line)
        if m and pending:
            out[m.group(1)] = " ".join(pending)
        if stripped and not stripped.startswith("#"):
            pending = []
    return out


def _models(annotation: Any) -> list[tuple[str, type[BaseModel]]]:
    """The pydantic models inside a field's type, with the key suffix they sit under."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [("", annotation)]
    if origin in (typing.Union, types.UnionType):
        return [m for a in args for m in _models(a)]
    if origin is list and args:
        return [("[]", m) for _, m in _models(args[0])]
    if origin is dict and len(args) == 2:
        return [(".<name>", m) for _, m in _models(args[1])]
    if origin is typing.Annotated:
        return _models(args[0])
    return []


def _type(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:  # the validators are not the type
        return _type(args[0])
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type(a) for a in args)
    if origin is typing.Literal:
        return " | ".join(repr(a) for a in args)
    text = str(annotation) if not isinstance(annotation, type) else annotation.__name__
    text = re.sub(r"\b(?:[a-z_]+\.)+([A-Za-z_]+)", r"\1", text)
    text = text.replace("typing.", "").replace("NoneType", "None")
    return text


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        try:
            value: Any = field.default_factory()  # type: ignore[call-arg]
        except TypeError:
            return ""
        if isinstance(value, BaseModel):
            return "(section)"
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    if value is None:
        return ""
    if hasattr(value, "get_secret_value"):
        return "(secret)"
    return f"`{value}`"


def _cell(text: str) -> str:
    return " ".join(text.replace("|", "\\|").split())


def _doc(cls: type) -> str:
    doc = inspect.getdoc(cls) or ""
    if doc.startswith(("Settings sections stay", "A model")) or cls is BaseModel:
        return ""
    return doc


def _section(
    prefix: str,
    cls: type[BaseModel],
    out: list[str],
    seen: set[tuple[str, str]],
    variants: set[str],
) -> None:
    comments = _comments(cls)
    rows: list[str] = []
    nested: list[tuple[str, type[BaseModel]]] = []
    for name, field in cls.model_fields.items():
        key = f"{prefix}.{name}" if prefix else name
        env = ENV_PREFIX + key.replace(".", "__").upper()
        env = env if "[" not in env and "<" not in env else ""
        about = field.description or comments.get(name, "")
        inner = _models(field.annotation)
        if inner:
            for suffix, model in inner:
                nested.append((key + suffix, model))
            about = about or f"see `{key}{inner[0][0]}`"
        rows.append(
            f"| `{key}` | {_cell(_type(field.annotation))} | {_cell(_default(field))} | "
            f"{'`' + env + '`' if env else ''} | {_cell(about)} |"
        )
    heading = f"`{prefix}`" if prefix else "Top level"
    if prefix and prefix in variants:
        heading += f" ({cls.__name__})"
    out += [f"## {heading}", ""]
    doc = _doc(cls)
    if doc:
        out += [doc, ""]
    out += ["| key | type | default | environment | meaning |", "|---|---|---|---|---|", *rows, ""]
    keys = [k for k, _ in nested]
    variants |= {k for k in keys if keys.count(k) > 1}  # a union: one table per kind
    for key, model in nested:
        if (key, model.__name__) in seen:
            continue
        seen.add((key, model.__name__))
        _section(key, model, out, seen, variants)


def render() -> str:
    """The page's Markdown."""
    out = [
        "# Configuration reference",
        "",
        "Generated from the sidecar's settings model by `python -m devtools.config_docs`. One",
        "YAML file (`ceiling serve --config FILE`, or `CEILING_CONFIG`); every key can also come",
        f"from the environment: `{ENV_PREFIX}` then the key path in capitals with `__` between",
        "levels, JSON for lists and sections. The environment wins over the file. Unknown keys",
        "are refused, naming the key. See [Configuration](../configuration.md) for a worked",
        "example.",
        "",
    ]
    _section("", Settings, out, set(), set())
    return "\n".join(out).rstrip() + "\n"


def main() -> None:
    PAGE.write_text(render())
    print(f"wrote {PAGE}")


if __name__ == "__main__":
    main()
