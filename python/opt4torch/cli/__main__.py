"""``python -m opt4torch.cli``: the ``opt4torch`` command. May touch: what it runs."""

import sys

from .entry import main

sys.exit(main())
