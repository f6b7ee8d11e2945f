"""What the tests and the benchmarks share, in one place: the provider doubles (``doubles``:
stand-ins for what cannot run here, each named as a double), generated traffic and canned
documents (``traffic``), the raw-ASGI pieces of the doubles (``asgi``), free loopback ports and
servers on them (``serving``), and the ``ceiling`` command as a child process (``cli``).

It is not part of the installed package; both ``pytest`` (``pythonpath``) and
``python -m benchmarks.<name>`` from the repository root import it as ``testkit``."""

from pathlib import Path

#: the repository's root (the tests and the benchmarks read its docs, charts and generated files)
REPO = Path(__file__).resolve().parents[1]

__all__ = ["REPO"]
