"""``python -m context_ceiling``: the ``ceiling`` command without its script."""

import sys

from context_ceiling.cli import main

sys.exit(main())
