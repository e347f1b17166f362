"""``python -m opt4torch`` runs the ``opt4torch`` command."""

import sys

from .cli import main

sys.exit(main())
