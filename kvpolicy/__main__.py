"""``python -m kvpolicy``: the ``kvpolicy`` command, for where its script is not on PATH."""

import sys

from kvpolicy.cli import main

sys.exit(main())
