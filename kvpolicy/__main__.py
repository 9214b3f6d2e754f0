"""``python -m kvpolicy``: the ``kvpolicy`` command, for where its script is not on PATH."""

import sys

from kvpolicy.cli import main

if __name__ == "__main__":
    sys.exit(main())
