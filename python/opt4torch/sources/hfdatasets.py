"""Hugging Face ``datasets`` as they are: a ``datasets.Dataset`` given to
:class:`opt4torch.DataLoader` unchanged.

What is cached is the row as the dataset's Arrow table holds it: one row's
record batch in Arrow's IPC form (its buffers, without the schema, which
every row shares), so an ``Image`` column is cached as its ``{bytes, path}``
struct (the JPEG as stored, not decoded pixels) and every other column as its
Arrow values. After the cache, in every worker, the row is read back from
those bytes and formatted by the dataset's own code (``format_table`` with
the dataset's formatter, features, format columns and transform: what
``Dataset.__getitem__`` runs), so ``sample == ds[i]`` on a hit as on a miss:
the same PIL type and pixels, the same label, the same dict; with
``with_format("torch" | "numpy")``, ``set_transform`` / ``with_transform``
and column selection as the dataset has them. The loader's own
``transform`` runs after that.

A ``datasets.IterableDataset`` (streaming) has no random access to plan
over, and is refused saying what to use instead. docs/sources.md, "Hugging
Face datasets", has the details and the bytes this saves.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

__all__ = ["HFDataset", "adapt_for_loader"]

_INSTALL = "pip install 'opt4torchdataset[hf]' (or pip install datasets pyarrow)"


def _datasets() -> Any:
    """The datasets module, or the error that says what to install (pyarrow
    is named when it is the one missing: datasets needs it)."""
    try:
        import pyarrow  # noqa: F401
        import datasets
    except ModuleNotFoundError as e:
        top = (e.name or "datasets").partition(".")[0]
        raise ModuleNotFoundError(f"opt4torch.HFDataset needs {top}, which is not installed: {_INSTALL}",
                                  name=e.name) from e
    return datasets


def adapt_for_loader(dataset: Any, transform: Callable[[Any], Any] | None) -> tuple[Any, Any]:
    """The hook :class:`opt4torch.DataLoader` calls first: a
    ``datasets.Dataset`` becomes its :class:`HFDataset` (what is cached) and
    the transform that formats a cached row as ``ds[i]`` and then runs
    ``transform``; a ``datasets.IterableDataset`` is refused; anything else
    is returned as given. ``datasets`` is not imported here: a dataset of
    its types exists only once it is."""
    hf = sys.modules.get("datasets")
    if hf is None or isinstance(dataset, HFDataset):
        return dataset, transform
    if isinstance(dataset, hf.IterableDataset):
        raise TypeError(
            "a datasets.IterableDataset (streaming) has no random access, so the OPT cache has no order of "
            "items to plan over: load it map-style instead, datasets.load_dataset(..., streaming=False) (or "
            "IterableDataset's source files with datasets.load_dataset('parquet', data_files=...)), or read "
            "its Parquet shards in place with opt4torch.Parquet(paths), local or s3://")
    if isinstance(dataset, hf.Dataset):
        rows = HFDataset(dataset)
        return rows, rows.formatter(then=transform)
    return dataset, transform


class HFDataset:
    """A ``datasets.Dataset`` as the cache sees it: ``self[i]`` is row ``i``
    encoded (its one-row Arrow record batch, IPC, without the schema: bytes),
    what the cache keeps; :meth:`format` turns those bytes into exactly
    ``ds[i]``. :class:`opt4torch.DataLoader` makes one of these from a
    ``datasets.Dataset`` by itself; made by hand, give the loader
    ``transform=rows.formatter()``.

    ``opt4_item_bytes(i)`` is row ``i``'s encoded size (every row serialised
    once, on first use), so a loader with ``cache_bytes`` plans in bytes.
    """

    def __init__(self, dataset: Any) -> None:
        hf = _datasets()
        if isinstance(dataset, hf.IterableDataset):
            adapt_for_loader(dataset, None)  # raises, saying what to do
        if not isinstance(dataset, hf.Dataset):
            raise TypeError(f"HFDataset takes a datasets.Dataset, not {type(dataset).__name__}")
        self.dataset = dataset
        self.schema = dataset.data.schema
        self._sizes: np.ndarray | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_sizes"] = None  # the parent's; a worker never needs them
        return state

    def __len__(self) -> int:
        return len(self.dataset)

    def _rows(self, key: Any) -> Any:
        from datasets.formatting import query_table

        ds = self.dataset
        return query_table(ds.data, key, indices=ds._indices).combine_chunks()

    @staticmethod
    def _encode(table: Any, k: int) -> bytes:
        # A slice of one row: Arrow's IPC writer keeps only that row's part
        # of every buffer (measured: a row of a 20-row table takes its JPEG
        # plus about 580 bytes of header and padding).
        data: bytes = table.slice(k, 1).to_batches()[0].serialize().to_pybytes()
        return data

    def __getitem__(self, index: int) -> bytes:
        if isinstance(index, (bool, np.bool_)) or not isinstance(index, (int, np.integer)):
            raise TypeError(f"HFDataset takes an int index, not {type(index).__name__}")
        return self._encode(self._rows(int(index)), 0)

    def __getitems__(self, indices: Sequence[int]) -> list[bytes]:
        table = self._rows([int(i) for i in indices])
        return [self._encode(table, k) for k in range(len(indices))]

    def item_sizes(self) -> np.ndarray:
        """Every row's encoded length in bytes (int64), serialised once in
        batches of 1024 rows and kept."""
        if self._sizes is None:
            n = len(self)
            sizes = np.empty(n, dtype=np.int64)
            for lo in range(0, n, 1024):
                hi = min(n, lo + 1024)
                table = self._rows(range(lo, hi))
                for k in range(hi - lo):
                    sizes[lo + k] = table.slice(k, 1).to_batches()[0].serialize().size
            self._sizes = sizes
        return self._sizes

    def opt4_item_bytes(self, index: int) -> int:
        """Bytes row ``index`` takes as cached (opt4torch.DataLoader plans in bytes with these)."""
        return int(self.item_sizes()[int(index)])

    def formatter(self, then: Callable[[Any], Any] | None = None) -> _RowFormatter:
        """The after-the-cache step: cached bytes -> ``ds[i]`` (then ``then``)."""
        ds = self.dataset
        return _RowFormatter(self.schema, ds._info.features, ds._format_type, dict(ds._format_kwargs or {}),
                             ds._format_columns, ds._output_all_columns, then)

    def format(self, blob: Any) -> Any:
        """The sample ``ds[i]`` from ``self[i]``'s bytes."""
        return self.formatter()(blob)

    def __repr__(self) -> str:
        return f"HFDataset({len(self)} rows, columns {self.schema.names})"


class _RowFormatter:
    """Cached row bytes -> the dataset's sample, by the dataset's own code.
    Picklable (spawned workers): the formatter is made again in each
    process."""

    def __init__(self, schema: Any, features: Any, format_type: str | None, format_kwargs: dict[str, Any],
                 format_columns: list[str] | None, output_all_columns: bool,
                 then: Callable[[Any], Any] | None) -> None:
        self.schema = schema
        self.features = features
        self.format_type = format_type
        self.format_kwargs = format_kwargs
        self.format_columns = format_columns
        self.output_all_columns = output_all_columns
        self.then = then
        self._formatter: Any = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_formatter"] = None
        return state

    def __call__(self, blob: Any) -> Any:
        import pyarrow as pa
        from datasets.formatting import format_table, get_formatter

        if self._formatter is None:
            self._formatter = get_formatter(self.format_type, features=self.features, **self.format_kwargs)
        batch = pa.ipc.read_record_batch(pa.py_buffer(blob), self.schema)
        # The key only tells format_table that this is a row (an int).
        sample = format_table(pa.Table.from_batches([batch]), 0, formatter=self._formatter,
                              format_columns=self.format_columns, output_all_columns=self.output_all_columns)
        return self.then(sample) if self.then is not None else sample
