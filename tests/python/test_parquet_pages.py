"""opt4torch.Parquet's page-level reads through the offset index
(python/opt4torch/sources/parquetpages.py, parquetmeta.py).

Files written by pyarrow whose row groups hold several pages per column (a
row cap per page, small pages, content-defined chunking as the Hub writes,
pages v2, a dictionary that falls back to plain pages, a list of structs):
every row equals pyarrow's own reading, and equals the row-group reading;
the units are page ranges, smaller than their row groups. Through the
loader (fork workers, the C prefetcher gathering each unit's pieces):
hits and storage bytes equal the plan's, and the reads are the pieces of
the missed units. The thrift reader is fed random and mutated bytes
(hypothesis), and a file whose offset index is damaged gives a
ParquetError naming it or its rows as they are, never another row.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

import opt4torch  # noqa: E402
from opt4torch.sources import parquetmeta as pm  # noqa: E402
from opt4torch.sources import parquetpages  # noqa: E402
from opt4torch.sources.parquet import ParquetError  # noqa: E402
from test_parquet import refused_or_right  # noqa: E402

pytestmark = pytest.mark.usefixtures("no_leaked_pools")


def table(n: int, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    blobs = [rng.integers(0, 256, size=int(rng.integers(20, 700)), dtype=np.uint8).tobytes() for _ in range(n)]
    return pa.table({
        "image": pa.array([{"bytes": b, "path": f"{k}.jpg" if k % 5 else None} for k, b in enumerate(blobs)],
                          pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
        "label": pa.array(rng.integers(0, 10, size=n), pa.int64()),
        "score": pa.array([None if k % 9 == 0 else float(k) / 3 for k in range(n)], pa.float64()),
        "boxes": pa.array([[{"x": float(j), "y": k * j} for j in range(k % 3)] if k % 7 else None for k in range(n)],
                          pa.list_(pa.struct([("x", pa.float32()), ("y", pa.int64())]))),
        "caption": pa.array([("word " * (k % 6)) + str(k) for k in range(n)]),
    })


CONFIGS = {
    "rows-per-page-5-snappy": dict(row_group_size=40, max_rows_per_page=5, compression="snappy",
                                   use_dictionary=["label", "caption", "image.path"]),
    "small-pages-zstd-dict": dict(row_group_size=64, write_batch_size=3, data_page_size=600, compression="zstd",
                                  dictionary_pagesize_limit=2000),
    "cdc-as-the-hub": dict(row_group_size=1000, compression="zstd",
                           use_content_defined_chunking={"min_chunk_size": 1024, "max_chunk_size": 4096},
                           dictionary_pagesize_limit=4096),
    "pages-v2": dict(row_group_size=50, max_rows_per_page=6, data_page_version="2.0", compression="zstd",
                     use_dictionary=False),
}


def write(folder, name: str, n: int, seed: int, **kw) -> str:
    path = os.path.join(os.fspath(folder), name)
    pq.write_table(table(n, seed), path, write_page_index=True, **kw)
    return path


@pytest.fixture(scope="module", params=list(CONFIGS))
def files(request, tmp_path_factory) -> list[str]:
    folder = tmp_path_factory.mktemp(request.param)
    return [write(folder, f"part-{k}.parquet", n, k, **CONFIGS[request.param]) for k, n in enumerate((90, 47))]


def reference(paths: list[str]) -> list[dict]:
    return [row for p in paths for row in pq.read_table(p).to_pylist()]


def test_page_units_read_pages_and_every_row_equals_pyarrows(files: list[str]) -> None:
    ds = opt4torch.Parquet(files)
    whole = opt4torch.Parquet(files, pages=False)
    want = reference(files)
    assert len(ds) == len(whole) == len(want)
    got = [ds[i] for i in range(len(ds))]
    assert got == want
    assert [whole[i] for i in range(len(ds))] == want
    # Backwards too (each unit decoded again, not the last one kept).
    assert [ds[i] for i in reversed(range(len(ds)))] == want[::-1]
    units, sizes = ds._decoder.units, ds.unit_sizes()
    assert units[:, 4].all(), "every row group has an offset index: every unit is a page range"
    groups = sum(pq.ParquetFile(p).metadata.num_row_groups for p in files)
    assert len(units) > groups
    # A unit reads less than its row group (pyarrow's sizes of its column chunks).
    rg_bytes = {}
    for f, p in enumerate(files):
        meta = pq.ParquetFile(p).metadata
        for rg in range(meta.num_row_groups):
            rg_bytes[(f, rg)] = sum(meta.row_group(rg).column(c).total_compressed_size
                                    for c in range(meta.num_columns))
    small = [sizes[u] / rg_bytes[(int(units[u, 0]), int(units[u, 1]))] for u in range(len(units))]
    assert np.median(small) < 0.75, small


def test_without_pickling_s_footer_parser_the_public_one_reads_the_same_rows(files, monkeypatch) -> None:
    """The small footers are parsed by the function pyarrow's pickling of
    FileMetaData names, where it gives back the file's own footer; another
    pyarrow gets the public parser (a reader over the footer), with the
    same rows."""
    meta = pq.read_metadata(files[0])
    with open(files[0], "rb") as f:
        data = f.read()
    footer = data[-8 - int.from_bytes(data[-8:-4], "little"):-8]

    class Opaque:  # a FileMetaData whose pickling names no parser
        def __reduce__(self):
            raise TypeError("no pickling here")

    public = parquetpages._footer_parser(Opaque())
    assert public(footer).equals(meta)
    assert public.__name__ == "public"
    assert parquetpages._footer_parser(meta).__name__ != "public"  # this pyarrow: pickling's function, checked
    monkeypatch.setattr(parquetpages, "_footer_parser", lambda parsed: public)
    ds = opt4torch.Parquet(files)
    assert [ds[i] for i in range(len(ds))] == reference(files)


def test_a_file_without_an_offset_index_is_read_by_row_groups(tmp_path) -> None:
    a = write(tmp_path, "a.parquet", 30, 0, row_group_size=10, max_rows_per_page=3)
    b = os.fspath(tmp_path / "b.parquet")
    pq.write_table(table(25, 1), b, row_group_size=10, max_rows_per_page=3, write_page_index=False)
    ds = opt4torch.Parquet([a, b])
    assert ds._decoder.units[:, 4].tolist() == [1] * (len(ds._decoder.units) - 3) + [0, 0, 0]
    assert [ds[i] for i in range(len(ds))] == reference([a, b])


@pytest.mark.timeout(240)
def test_the_loader_gathers_page_units_exactly(tmp_path) -> None:
    paths = [write(tmp_path, f"p{k}.parquet", 60, k, row_group_size=30, max_rows_per_page=4) for k in range(2)]
    ds = opt4torch.Parquet(paths)
    units = ds._groups
    assert not units.single and len(units) == 2 * 2 * 8  # 8 pages of 4 rows (the last of 2) per row group
    ref = reference(paths)
    sizes = ds.unit_sizes()
    loader = opt4torch.DataLoader(ds, batch_size=5, shuffle=True, seed=3, num_workers=2,
                                  multiprocessing_context="fork", epochs=2, collate_fn=list,
                                  cache_bytes=int(sizes.sum()) // 3, prefetch_threads=2)
    try:
        rows = loader.dataset.transform.rows
        t = 0
        for _ in range(2):
            for batch in loader:
                for got in batch:
                    assert got == ref[int(rows[t])], f"position {t}"
                    t += 1
        st_ = loader.cache.stats()
        plan = loader.cache.plan
        missed = plan.seq[plan.kinds != opt4torch.HIT]
        assert st_["fallbacks"] == 0 and st_["timeouts"] == 0, st_
        assert st_["hits"] == st_["plan_hits"] > 0, st_
        assert st_["storage_bytes"] == int(sizes[missed].sum()), st_
        assert st_["storage_reads"] == int(np.diff(units.first)[missed].sum()) > st_["plan_misses"], st_
    finally:
        loader.cache.close()


def test_a_worker_takes_its_next_batches_rows_from_a_unit_it_decodes(tmp_path) -> None:
    """_RowAt as a worker of 2 runs it: batches 0, 2, 4, ... of 5. Every row
    equals pyarrow's, units are decoded fewer times than without the
    lookahead, the rows held stay within the lookahead's batches, and a
    stride guessed wrong (batches not a constant stride apart) still gives
    every position its own row."""
    paths = [write(tmp_path, f"p{k}.parquet", 60, k, row_group_size=30, max_rows_per_page=4) for k in range(2)]
    ds = opt4torch.Parquet(paths)
    ref = reference(paths)
    rng = np.random.default_rng(5)
    rows = np.concatenate([rng.permutation(len(ds)) for _ in range(3)]).astype(np.int64)
    real = ds._decoder.table
    decodes = []

    def counted(unit, blob):
        if ds._decoder._last is None or ds._decoder._last[0] != unit:
            decodes.append(unit)
        return real(unit, blob)

    ds._decoder.table = counted

    def serve(batches, lookahead):
        _, at, units = ds.opt4_read_units(rows, None)
        at.lookahead = lookahead
        decodes.clear()
        ds._decoder._last = None
        held = 0
        for lo in batches:
            where = list(range(lo, min(lo + 5, len(rows))))
            got = at.at_positions([ds._groups[int(units[t])] for t in where], where)
            assert got == [ref[int(rows[t])] for t in where], f"positions {where}"
            held = max(held, len(at._held))
            assert all(t > lo for t in at._held)
        return len(decodes), held

    mine = range(0, len(rows), 10)
    plain, _ = serve(mine, 0)
    ahead, held = serve(mine, 4)
    assert ahead < 0.8 * plain, (ahead, plain)
    assert 0 < held <= 4 * 5
    odd = [0, 10, 15, 40, 45, 50, 75, 80, 120, 125, 130, 200, 205, 300, 305]
    serve(odd, 4)


# ---- hostile bytes ----


@pytest.fixture(scope="module")
def sample(tmp_path_factory) -> tuple[str, bytes, bytes, list[tuple[int, int]], bytes]:
    """A file, its footer's thrift, one offset index's bytes, where the
    offset indexes lie, and a data page's header (with what follows it)."""
    path = write(tmp_path_factory.mktemp("hostile"), "h.parquet", 40, 3, row_group_size=20, max_rows_per_page=4)
    raw = open(path, "rb").read()
    flen = int.from_bytes(raw[-8:-4], "little")
    meta, used = pm.parse(raw[-8 - flen:-8])
    assert used == flen and pm.write(meta) == raw[-8 - flen:-8]  # the writer writes what the reader read
    places = []
    for rg in pm.field(meta, 4)[1]:
        for cc in pm.field(rg, 1)[1]:
            places.append((pm.field(cc, 4), pm.field(cc, 5)))
    off, n = places[0]
    first = pm.offset_index(raw[off:off + n], 4, len(raw), 20).offsets[0]
    assert pm.page_header(raw[first:first + 256]).kind in (pm.DATA_PAGE, pm.DATA_PAGE_V2)
    return path, raw[-8 - flen:-8], raw[off:off + n], places, raw[first:first + 256]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_the_thrift_reader_takes_any_bytes(sample, data) -> None:
    _, footer, oindex, _, header = sample
    base = data.draw(st.sampled_from([footer, oindex, header, b""]))
    raw = bytearray(data.draw(st.binary(max_size=300)) if not base else base)
    for _ in range(data.draw(st.integers(0, 6)) if base else 0):
        k = data.draw(st.integers(0, len(raw) - 1))
        raw[k] = data.draw(st.integers(0, 255))
    if base and data.draw(st.booleans()):
        raw = raw[:data.draw(st.integers(0, len(raw)))]
    try:
        tree, used = pm.parse(bytes(raw))
    except pm.ThriftError:
        return
    assert 0 < used <= len(raw)
    assert pm.parse(pm.write(tree))[0] == tree
    path = sample[0]
    data = open(path, "rb").read()
    end = len(data) - 8 - len(sample[1])
    for check in (lambda: parquetpages.leaf_levels(tree), lambda: pm.offset_index(bytes(raw), 4, 1 << 20, 40),
                  lambda: parquetpages.read_chunks(tree, 0, lambda off, n: data[off:off + n], end),
                  lambda: pm.page_header(bytes(raw))):
        try:
            got = check()
        except pm.ThriftError:
            continue
        if isinstance(got, pm.PageLocations):
            assert got.first_rows[0] == 0 and list(got.first_rows) == sorted(set(got.first_rows))
            assert all(o + s <= 1 << 20 for o, s in zip(got.offsets, got.sizes))
            # Its pages' headers, read from the file where the locations lie in it.
            if all(o + s <= len(data) for o, s in zip(got.offsets, got.sizes)):
                try:
                    parquetpages.check_pages(got, 40, False, lambda off, n: data[off:off + n], "c")
                except pm.ThriftError:
                    pass
        elif isinstance(got, pm.PageHead):
            assert 0 < got.head <= len(raw) and got.body >= 0 and got.values >= 0
            assert got.kind != pm.DATA_PAGE_V2 or got.rows is not None and got.rows >= 0


def test_deep_nesting_and_huge_counts_are_refused() -> None:
    with pytest.raises(pm.ThriftError, match="nesting deeper"):
        pm.parse(b"\x1c" * 200 + b"\x00" * 200)  # field 1, a struct, inside itself
    with pytest.raises(pm.ThriftError, match="cannot hold"):
        pm.parse(b"\x19\xfc\xff\xff\xff\x0f")  # a list of 2^32 structs in 6 bytes
    with pytest.raises(pm.ThriftError, match="varint longer"):
        pm.parse(b"\x16" + b"\xff" * 11)
    # An empty map where a list belongs (the fuzzer's find: was a KeyError).
    with pytest.raises(pm.ThriftError, match="field 4 holds thrift type 11 where type 9 belongs"):
        pm.items(pm.parse(b"\x4b\x00\x00")[0], 4, pm.STRUCT)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_damaged_offset_index_is_refused_or_read_right(sample, tmp_path_factory, data) -> None:
    path, _, _, places, _ = sample
    raw = bytearray(open(path, "rb").read())
    off, n = data.draw(st.sampled_from(places))
    for _ in range(data.draw(st.integers(1, 3))):
        raw[off + data.draw(st.integers(0, n - 1))] = data.draw(st.integers(0, 255))
    bad = os.fspath(tmp_path_factory.mktemp("bad") / "h.parquet")
    open(bad, "wb").write(bytes(raw))
    want = pq.read_table(path).to_pylist()
    refused_or_right(bad, want)


def _shift_offset_indexes(path: str, out: str, shift: int) -> None:
    """``path`` written again to ``out`` with every offset index's pages
    after the first claiming to start ``shift`` rows later: an index still
    in order, every column alike, that names wrong rows. The indexes are
    written anew after the data (the column indexes left out), the footer
    pointing at them."""
    raw = open(path, "rb").read()
    flen = int.from_bytes(raw[-8:-4], "little")
    meta, _ = pm.parse(raw[-8 - flen:-8])
    ccs = [cc for rg in pm.field(meta, 4)[1] for cc in pm.field(rg, 1)[1]]
    data_end = min(pm.field(cc, f) for cc in ccs for f in (4, 6) if pm.field(cc, f) is not None)
    body = bytearray(raw[:data_end])
    for cc in ccs:
        at, n = pm.field(cc, 4), pm.field(cc, 5)
        index, _ = pm.parse(raw[at:at + n])
        locs = pm.field(index, 1)[1]
        for loc in locs[1:]:
            loc[:] = [(f, t, v + shift if f == 3 else v) for f, t, v in loc]
        new = pm.write(index)
        cc[:] = [(f, t, len(body) if f == 4 else len(new) if f == 5 else v) for f, t, v in cc if f not in (6, 7)]
        body += new
    footer = pm.write(meta)
    open(out, "wb").write(bytes(body) + footer + len(footer).to_bytes(4, "little") + b"PAR1")


@pytest.mark.parametrize("version", ["1.0", "2.0"])
def test_an_offset_index_shifted_in_itself_is_refused(tmp_path, version: str) -> None:
    path = os.fspath(tmp_path / "a.parquet")
    pq.write_table(table(40, 4), path, row_group_size=20, max_rows_per_page=5,
                   write_page_index=True, data_page_version=version, compression="snappy")
    same = os.fspath(tmp_path / "same.parquet")
    _shift_offset_indexes(path, same, 0)  # the rewriting itself keeps the rows
    assert [opt4torch.Parquet(same)[i] for i in range(40)] == pq.read_table(path).to_pylist()
    bad = os.fspath(tmp_path / "shifted.parquet")
    _shift_offset_indexes(path, bad, 1)
    with pytest.raises(ParquetError, match=r"shifted\.parquet: row group 0's offset index is damaged \(column "
                                           r"image\.bytes page 0 \(at byte \d+, rows 0-6 by the offset index\) holds "
                                           r"(5 rows|5 values)\)"):
        opt4torch.Parquet(bad)
    # Read by row groups, the file is read right.
    whole = opt4torch.Parquet(bad, pages=False)
    assert [whole[i] for i in range(40)] == pq.read_table(path).to_pylist()


def test_a_repeated_column_needs_a_value_a_row(tmp_path) -> None:
    """A list column's v1 pages say their values, not their rows; a row
    has at least one (an empty or null list one level): fewer values than
    the index's rows are refused."""
    path = os.fspath(tmp_path / "l.parquet")
    xs = pa.array([[k] if k % 4 else ([] if k % 8 else None) for k in range(30)], pa.list_(pa.int64()))
    pq.write_table(pa.table({"xs": xs}), path, row_group_size=30, max_rows_per_page=5, write_page_index=True,
                   data_page_version="1.0")
    same = os.fspath(tmp_path / "l-same.parquet")
    _shift_offset_indexes(path, same, 0)
    assert [opt4torch.Parquet(same)[i] for i in range(30)] == pq.read_table(path).to_pylist()
    bad = os.fspath(tmp_path / "l-shifted.parquet")
    _shift_offset_indexes(path, bad, 1)
    with pytest.raises(ParquetError, match=r"l-shifted\.parquet: .*column xs\.list\.element page 0 .* holds 5 values"):
        opt4torch.Parquet(bad)
