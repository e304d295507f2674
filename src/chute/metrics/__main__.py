"""`python -m chute.metrics ...`."""

import sys

from ._cli import main

sys.exit(main(sys.argv[1:]))
