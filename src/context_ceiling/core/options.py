"""How a typed options model is spelled on the command line, declared beside its fields.

A command's options are a pydantic model whose fields carry their help as attribute docstrings
(``use_attribute_docstrings``) and, where the flag is not simply ``--field-name``, an
:class:`Option` in ``Annotated`` metadata. The command line is generated from the model
(:func:`context_ceiling.cli.add_model_arguments`), so a name, a default or a help text is written
once, where the layers below read it.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Option"]


@dataclass(frozen=True, slots=True)
class Option:
    """A field's command-line spelling where it is not ``--field-name``.

    ``flag``: the flag (``--no-control`` for a field that is on unless turned off, ``--batch-poll``
    for ``batch_poll_s``); ``metavar``: the value's name in the help; ``choices``: the values
    offered (a ``Literal`` field offers its own); ``elsewhere``: the flag is added by the command
    itself (``--json``, shared by every command), and the field reads the parsed value under the
    flag's name."""

    flag: str | None = None
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    elsewhere: bool = False
