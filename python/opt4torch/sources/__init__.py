"""TODO"""
from .. import _engine  # noqa: F401
from .local import (IMG_EXTENSIONS, ImageFolder, LayoutError, TarShards, check_tar, checked_index,  # noqa: F401
                    find_classes, make_dataset, shard_index)
