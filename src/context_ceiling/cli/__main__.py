"""``python -m context_ceiling.cli``: the ``ceiling`` command without its script."""

import sys

from context_ceiling.cli import main

sys.exit(main())
