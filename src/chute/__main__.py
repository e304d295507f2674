"""``python -m chute`` runs the ``chute`` command."""

import sys

from chute.cli import main

sys.exit(main())
