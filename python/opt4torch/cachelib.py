"""``opt4torch.cachelib`` is :mod:`opt4torch.compat.cachelib`, under the name
users of the earlier design import (the same module object, not a copy)."""

import sys

from .compat import cachelib

sys.modules[__name__] = cachelib
