"""The bundled ``landmarks`` task set: questions with no word in common with their evidence.

The generator is in the package (:mod:`context_ceiling.sweep.landmarks`), so the sweep extends
the corpus with notes of the same kind for a large window. Regenerate the committed files:
``python -m devtools.generate_landmarks`` (a test fails when they are stale).
"""

from __future__ import annotations

from context_ceiling.sweep.landmarks import generate
from context_ceiling.sweep.taskset import bundled_path

if __name__ == "__main__":
    generate(bundled_path("landmarks"))  # the editable install's package directory
