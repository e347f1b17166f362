"""``opt4torch.preload`` is :mod:`opt4torch.compat.preload`, under the name
docs/python-prefetch.md and the earlier design's users import (the same
module object, not a copy)."""

import sys

from .compat import preload

sys.modules[__name__] = preload
