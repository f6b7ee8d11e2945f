"""One error base for everything the product raises on purpose.

``CeilingError`` is a failure the program understands (an upstream that refused a push, a stream
that broke): the command line prints its one line and exits 1. ``UserError`` is a problem the
user can fix (a bad config, a task set that does not parse, a flag that does not fit): one line
and exit 2. The command line catches both once, at its top; no layer below it prints or exits.
Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class CeilingError(Exception):
    """A failure the program understands: one line, exit status 1."""

    #: set once a command has printed this failure as its ``--json`` object
    reported: bool = False


class UserError(CeilingError):
    """A problem the user can fix: one line, exit status 2."""
