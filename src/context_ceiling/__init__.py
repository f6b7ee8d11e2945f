"""context-ceiling: keep LLM requests inside the part of the context window where the model still
works. Measure it (``context_ceiling.sweep``), enforce and observe it (``context_ceiling.sidecar``),
with the definitions both share in ``context_ceiling.core``; ``context_ceiling.cli`` assembles them
into the ``ceiling`` command."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("context-ceiling")
except PackageNotFoundError:  # pragma: no cover - a source tree that was never installed
    __version__ = "0+unknown"
