"""The ``ceiling`` command: assembles the product, one module per command.

``serve`` runs the sidecar, ``push`` and ``ceilings`` handle the ceilings document, ``sweep``
measures a model. Errors are caught once, here: a :class:`~context_ceiling.core.errors.UserError`
is one line and exit status 2, any other :class:`~context_ceiling.core.errors.CeilingError` one
line and exit status 1; argparse's own usage errors are one line and exit 2 as well.

Every option carries help text and shows its default (:class:`HelpFormatter`); every command that
prints a result takes ``--json`` (:func:`add_json`): one JSON object on stdout, progress and notes
on stderr, so scripts and CI steps read the result without parsing prose.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import types
import typing
from collections.abc import Sequence
from typing import Any, NoReturn, TypeVar

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from context_ceiling import __version__
from context_ceiling.core.errors import CeilingError, UserError
from context_ceiling.core.options import Option

T = TypeVar("T")


class HelpFormatter(argparse.HelpFormatter):
    """Help that states each option's default, unless the default is "not given" (``None``,
    ``False``) or the help already says what happens without it."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            "default" in text
            or default is None
            or default is False
            or (default is True and action.nargs == 0)  # a flag that turns a default off
            or default == []
            or default is argparse.SUPPRESS
            or not action.option_strings
        ):
            return text
        return text + " (default: %(default)s)"


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (and still exit status 2), and help shows the
    defaults."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    from context_ceiling.cli import ceilings, completion, push, serve

    try:
        from context_ceiling.cli import sweep, taskset
    except ModuleNotFoundError as exc:  # the sidecar image: installed without the sweep extra
        sweep = _MissingExtra("sweep", "sweep", exc.name or "")  # type: ignore[assignment]
        taskset = _MissingExtra("taskset", "sweep", exc.name or "")  # type: ignore[assignment]

    parser = Parser(
        prog="ceiling", description="Keep LLM requests under their measured context ceiling."
    )
    parser.add_argument("--version", action="version", version=f"ceiling {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for command in (serve, push, sweep, taskset, ceilings, completion):
        command.add_parser(sub)
    return parser


class _MissingExtra:
    """A command whose dependencies are an extra that is not installed: it still parses, and
    says in one line what to install (exit 2)."""

    def __init__(self, command: str, extra: str, missing: str) -> None:
        self.command, self.extra, self.missing = command, extra, missing

    def add_parser(self, sub: argparse._SubParsersAction[Parser]) -> None:
        p = sub.add_parser(
            self.command, help=f"(needs: pip install 'context-ceiling[{self.extra}]')"
        )
        p.add_argument("rest", nargs=argparse.REMAINDER)
        p.set_defaults(func=self._refuse)

    def _refuse(self, args: argparse.Namespace) -> int:
        raise UserError(
            f"needs the {self.extra} extra ({self.missing} is not installed): "
            f"pip install 'context-ceiling[{self.extra}]'"
        )


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    where = " ".join(x for x in ("ceiling", args.command, getattr(args, "action", None)) if x)
    try:
        code: int = args.func(args)
    except CeilingError as exc:
        print(f"{where}: {exc}", file=sys.stderr)
        if getattr(args, "json", False) and not getattr(exc, "reported", False):
            # --json promises one JSON object on stdout, a failure included
            print_json({"ok": False, "errors": errors_of(exc)})
        return 2 if isinstance(exc, UserError) else 1
    return code


def errors_of(exc: CeilingError) -> list[str]:
    """An error's problems, one string each (a configuration's or a document's every problem,
    else its message)."""
    where = getattr(exc, "where", None)
    for name in ("problems", "reasons"):
        found = getattr(exc, name, None)
        if isinstance(found, list) and found:
            return [f"{where}: {p}" if where else str(p) for p in found]
    return [str(exc)]


def add_json(p: argparse.ArgumentParser) -> None:
    """``--json``: the command's result as one JSON object on stdout."""
    p.add_argument(
        "--json",
        action="store_true",
        help="print the result as one JSON object on stdout (progress and notes go to stderr)",
    )


def add_kube(p: argparse.ArgumentParser) -> None:
    """Where the ceilings ConfigMap is: ``--kubeconfig``, ``--context``, ``--namespace`` (as
    kubectl reads them; in a pod with none given, its service account)."""
    p.add_argument(
        "--kubeconfig",
        metavar="PATH",
        help="the kubeconfig to use (default: $KUBECONFIG, else ~/.kube/config; in a pod, its "
        "service account)",
    )
    p.add_argument("--context", help="the kubeconfig context (default: its current context)")
    p.add_argument(
        "--namespace",
        help="the ConfigMap's namespace (default: the context's, in a pod the pod's, else default)",
    )


def print_json(result: Any) -> None:
    """One JSON object on stdout (paths and other non-JSON values as strings)."""
    print(json.dumps(result, indent=2, default=str))


def options(cls: type[T], args: argparse.Namespace) -> T:
    """Typed options (a dataclass, or a pydantic model) from the parsed arguments it has fields
    for: the command line stops here, the layers below take typed options, never an
    ``argparse.Namespace``."""
    if isinstance(cls, type) and issubclass(cls, BaseModel):
        dests = {name: _dest(name, f) for name, f in cls.model_fields.items()}
        return cls(**{n: getattr(args, d) for n, d in dests.items() if hasattr(args, d)})
    names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    return cls(**{n: getattr(args, n) for n in names if hasattr(args, n)})


def _option(field: FieldInfo) -> Option:
    return next((m for m in field.metadata if isinstance(m, Option)), Option())


def _dest(name: str, field: FieldInfo) -> str:
    """Where argparse puts a field's value: the field's name, or a shared flag's own."""
    opt = _option(field)
    if opt.elsewhere and opt.flag:
        return opt.flag.lstrip("-").replace("-", "_")
    return name


def add_model_arguments(p: argparse.ArgumentParser, model: type[BaseModel]) -> None:
    """One option per field of ``model``, generated from the field: ``--field-name`` (or its
    :class:`~context_ceiling.core.options.Option` flag), the type, the choices of a ``Literal``,
    the default, and the field's docstring as the help. A flag that turns a default-on field off
    (``--no-control``) stores false; a ``bool | None`` field takes ``--x`` and ``--no-x``."""
    for name, field in model.model_fields.items():
        opt = _option(field)
        if opt.elsewhere:
            continue
        flag = opt.flag or "--" + name.replace("_", "-")
        help_text = " ".join((field.description or "").split())
        kind, choices = _kind(field.annotation)
        kw: dict[str, Any] = {"dest": name, "help": help_text, "default": field.default}
        if kind is bool:
            if field.default is None:
                kw["action"] = argparse.BooleanOptionalAction
            else:
                kw["action"] = "store_false" if field.default else "store_true"
        else:
            kw["type"] = kind
            if opt.choices or choices:
                kw["choices"] = list(opt.choices or choices)
            if opt.metavar:
                kw["metavar"] = opt.metavar
        p.add_argument(flag, **kw)


def _kind(annotation: Any) -> tuple[Any, tuple[str, ...]]:
    """The value type argparse converts to, and a ``Literal``'s values (``X | None`` as X)."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) is typing.Literal:
        return str, tuple(str(a) for a in typing.get_args(annotation))
    if args and typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return _kind(args[0])
    if annotation in (bool, int, float):
        return annotation, ()
    return str, ()
