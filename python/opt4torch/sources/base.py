"""What a source is: the contract between a dataset the engine reads itself
and the loader, the Python side of src/source/source.h.

A :class:`Source` counts its own reads (``info()["reads"]`` and
``["bytes_read"]``, which ``cache.stats()`` reports as storage reads) and is
prefetched by default: by the engine's C threads straight into the pool when
:meth:`Source.engine_source` hands them an :class:`EngineSource`, else
through the Python callback (an object store whose GETs wait without the
GIL). Adding a source is one file here (a class with these two methods)
and, for the engine to read it, one file in src/source/.

Also the things every source shares: the image extensions (one tuple, two
names) and the index check. May touch: nothing but its arguments.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

__all__ = ["EngineSource", "IMAGE_EXTENSIONS", "IMG_EXTENSIONS", "ReadUnits", "Source", "checked_index",
           "counts_storage", "engine_source", "prefetch_by_default"]

#: The image files an image folder takes by default: torchvision's
#: ``IMG_EXTENSIONS``, under that name and under ``IMAGE_EXTENSIONS``
#: (image_folder_to_records' name), one tuple.
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
IMAGE_EXTENSIONS = IMG_EXTENSIONS


@dataclass(frozen=True)
class EngineSource:
    """What a source hands the engine's prefetcher (``_engine.Prefetcher``'s
    arguments): the engine's reader of its items, and how a read record
    becomes what ``dataset[i]`` returns, as the codec stores it."""

    #: The engine's reader: ``_engine.Records`` (a record file),
    #: ``_engine.Ranges`` (files or tar shards in place) or
    #: ``_engine.S3Ranges`` (objects in a store).
    records: Any
    #: ``"bytes"``: ``ds[i]`` is the record's bytes, or ``(bytes, label)``
    #: with ``labels``; ``"tar"``: a WebDataset sample dict, laid out from
    #: ``samples`` (binding/tarframe.c).
    frame: str = "bytes"
    #: One label per item (frame ``"bytes"``), or None.
    labels: Any = None
    #: Frame ``"tar"``: (keys, members) as TarShards holds them.
    samples: tuple[Any, Any] | None = None
    #: Read units of several of the reader's items (pieces): an int64 array
    #: of each unit's first piece and the count after the last; the engine
    #: reads unit ``u`` as pieces ``units[u]`` to ``units[u+1] - 1``, one
    #: after another (``opt4_source_gather``). None: one item a unit.
    units: Any = None

    def prefetcher_args(self) -> dict[str, Any]:
        """The keywords ``_engine.Prefetcher`` takes for this source."""
        args = {"records": self.records, "frame": self.frame, "labels": self.labels, "samples": self.samples}
        if self.units is not None:
            args["units"] = self.units
        return args


@runtime_checkable
class Source(Protocol):
    """A dataset the engine reads itself (see the module's docstring)."""

    def engine_source(self) -> EngineSource | None:
        """The engine's reader of this dataset's items, or None: prefetch
        it through the Python callback."""
        ...

    def info(self) -> dict[str, Any]:
        """The read counters (``reads``, ``bytes_read``; an object store's
        ``requests`` too), summed over every process that read."""
        ...


@runtime_checkable
class ReadUnits(Protocol):
    """A dataset whose items are smaller than what one read fetches
    (``opt4torch.Parquet``: rows in row groups). The loader plans over the
    read units, and takes each position's item from its unit after the
    cache (docs/algorithm.md, "Read units")."""

    def opt4_read_units(self, rows: Any, transform: Any) -> tuple[Any, Any, Any]:
        """Given the item at each position of the loader's sequence (every
        epoch's, and with ``share_across_ranks`` the node's ranks' merged):
        the dataset of read units the loader plans over, the transform that
        takes a position's item from its unit (an ``at_positions(blobs,
        positions)`` method), and the unit at each position."""
        ...


def engine_source(dataset: Any) -> EngineSource | None:
    """What the engine reads ``dataset`` through, or None (not a
    :class:`Source`, or one prefetched through the callback)."""
    if isinstance(dataset, Source):
        return dataset.engine_source()
    legacy = getattr(dataset, "_prefetch_source", None)  # the earlier spelling, a dict: kept one release
    if callable(legacy):
        spec = legacy()
        return None if spec is None else EngineSource(**spec)
    return None


def counts_storage(dataset: Any) -> bool:
    """Whether ``dataset`` counts its reads (``cache.stats()`` reports them)."""
    return isinstance(dataset, Source) or hasattr(dataset, "_prefetch_source") or bool(
        getattr(dataset, "_counts_storage", False))


def prefetch_by_default(dataset: Any) -> bool:
    """Whether the loader prefetches ``dataset`` when ``prefetch=`` is not
    given: every :class:`Source` (the engine's reads, or an object store's
    GETs, which wait without the GIL); other datasets opt in."""
    return isinstance(dataset, Source) or hasattr(dataset, "_prefetch_source") or bool(
        getattr(dataset, "_prefetch_by_callback", False))


def checked_index(index: int, n: int) -> int:
    """``index`` as a map-style dataset takes it (negative from the end), or
    IndexError: the one check every dataset here makes."""
    i = int(index)
    if i < 0:
        i += n
    if not 0 <= i < n:
        raise IndexError(f"index {index} is out of range for {n} items")
    return i
