"""The datasets the engine reads itself (the engine's src/source), one module
per kind: base.py (the :class:`Source` contract, :class:`EngineSource`, the
image extensions), local.py (ImageFolder and TarShards, read in place),
records.py (RecordFile, the record file), s3.py (objects in an S3-compatible
store), parquet.py (Parquet read in place, over row groups), hfdatasets.py
(a Hugging Face datasets.Dataset as it is); and what they share:
tarindex.py (the cached tar index, read as a hostile file), shardnames.py (WebDataset's shard names),
formats.py (what a file is, from its first bytes). Imports only io/ and the
binding.

``opt4torch.sources`` keeps the names it had before it became a folder.
"""

from .. import _engine  # noqa: F401  (tests patch opt4torch.sources._engine)
from .base import IMAGE_EXTENSIONS, IMG_EXTENSIONS, EngineSource, Source, checked_index
from .local import (FolderLoopError, ImageFolder, LayoutError, TarShards, check_tar, find_classes, make_dataset,
                    shard_index)

__all__ = ["EngineSource", "FolderLoopError", "IMAGE_EXTENSIONS", "IMG_EXTENSIONS", "ImageFolder", "LayoutError",
           "Source", "TarShards", "check_tar", "checked_index", "find_classes", "make_dataset", "shard_index"]
