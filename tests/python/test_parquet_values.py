"""opt4torch.Parquet, a row alone as the read unit (sources/parquetvalues.py).

Where a row group's largest column is PLAIN, uncompressed and every value
present (the Hub's image shards, as ``datasets`` writes them), each row is
read alone: its value's byte range. Files are written here by pyarrow (data
pages v1 and v2, a struct as the Hub's ``Image``, a top-level binary column,
text) and by ``datasets``; every row must equal pyarrow's own reading, and
through the loader hits and storage bytes equal the plan's. Row groups that
do not allow it (a null, a dictionary, compression, small values) keep
their page ranges, and still read right. A damaged value chain is refused
naming the file, the row group and the column.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

import opt4torch  # noqa: E402
from opt4torch.sources import parquetmeta as pm  # noqa: E402
from opt4torch.sources.parquet import ParquetError  # noqa: E402
from opt4torch.sources.parquetvalues import _all_defined, load_walks, save_walks  # noqa: E402
from test_parquet import reference, refused_or_right, run  # noqa: E402

pytestmark = pytest.mark.usefixtures("no_leaked_pools")

IMAGE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])


def hub_table(n: int, seed: int, *, null_at: int | None = None, small: bool = False) -> pa.Table:
    rng = np.random.default_rng(seed)
    lo, hi = (20, 900) if small else (4200, 30000)
    blobs = [rng.integers(0, 256, size=int(rng.integers(lo, hi)), dtype=np.uint8).tobytes() for _ in range(n)]
    images = [{"bytes": None if k == null_at else b, "path": f"{seed}/{k}.jpg" if k % 3 else None}
              for k, b in enumerate(blobs)]
    return pa.table({"image": pa.array(images, IMAGE), "label": pa.array(rng.integers(0, 10, n), pa.int64())})


def write(path: str, t: pa.Table, **kw) -> str:
    opts = dict(row_group_size=40, data_page_size=64 << 10, write_page_index=True, use_dictionary=["label"],
                compression={"image.bytes": "none", "image.path": "zstd", "label": "snappy"})
    opts.update(kw)
    pq.write_table(t, path, **opts)
    return path


def kinds(ds) -> np.ndarray:
    return np.bincount(ds._decoder.units[:, 4], minlength=3)


@pytest.fixture(scope="module")
def hub_files(tmp_path_factory) -> list[str]:
    folder = tmp_path_factory.mktemp("values")
    return [write(os.fspath(folder / "a.parquet"), hub_table(90, 1)),
            write(os.fspath(folder / "b.parquet"), hub_table(57, 2), data_page_version="2.0")]


def test_hub_rows_alone_equal_pyarrows_reading(hub_files: list[str]) -> None:
    ds = opt4torch.Parquet(hub_files)
    assert list(kinds(ds)) == [0, 0, 147]  # every row its own unit (v1 and v2 pages)
    want = reference(hub_files)
    assert [ds[i] for i in range(len(ds))] == want
    assert [list(ds[i]["image"]) for i in (0, 1)] == [["bytes", "path"]] * 2  # the struct's own order
    sizes = ds.unit_sizes()
    assert (sizes == np.asarray([len(r["image"]["bytes"]) + 4 for r in want])).all()  # a row's read: its value
    pages = opt4torch.Parquet(hub_files, values=False)
    assert kinds(pages)[2] == 0 and [pages[i] for i in range(len(pages))] == want
    # Rows are taken ahead from a decoded unit only where a unit holds several
    order = np.arange(len(ds), dtype=np.int64)
    assert ds.opt4_read_units(order, None)[1].lookahead == 0
    assert pages.opt4_read_units(order, None)[1].lookahead > 0


def test_indexing_reads_each_place_once(hub_files: list[str], monkeypatch) -> None:
    """The header check of page ranges and rows alone's walk both read a
    page's start (parquetpages.PageHeads): indexing asks for no offset of
    a file twice."""
    from collections import Counter

    from opt4torch.sources import parquet as parquet_module

    asked: Counter[tuple[str, int]] = Counter()
    pread = parquet_module.pread_exact

    def counted(path: str, offset: int, length: int) -> bytes:
        asked[(path, offset)] += 1
        return pread(path, offset, length)

    monkeypatch.setattr(parquet_module, "pread_exact", counted)
    ds = opt4torch.Parquet(hub_files)
    assert list(kinds(ds)) == [0, 0, 147] and len(asked) > 147
    assert max(asked.values()) == 1, [k for k, n in asked.items() if n > 1]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_loader_over_rows_alone_is_exact(hub_files: list[str], context: str) -> None:
    ds = opt4torch.Parquet(hub_files)
    sizes = ds.unit_sizes()
    # A spawned worker's reads are counted in its own process (as in test_parquet.py): bytes are checked forked.
    run(ds, context=context, cache_bytes=int(sizes.sum()) // 2, prefetch_threads=2, count_storage=context == "fork")


def test_other_layouts_read_alone(tmp_path) -> None:
    rng = np.random.default_rng(5)
    n = 30
    blobs = [rng.integers(0, 256, size=int(rng.integers(5000, 9000)), dtype=np.uint8).tobytes() for _ in range(n)]
    texts = ["".join(chr(0x61 + (k + j) % 26) for j in range(4100 + k)) + "é" for k in range(n)]
    cases = {
        "top-level binary": pa.table({"jpeg": pa.array(blobs, pa.binary()), "id": pa.array(range(n), pa.int32())}),
        "text": pa.table({"text": pa.array(texts, pa.string()), "id": pa.array(range(n), pa.int64())}),
        "required": pa.table({"jpeg": pa.array(blobs, pa.large_binary())},
                             schema=pa.schema([pa.field("jpeg", pa.large_binary(), nullable=False)])),
    }
    for name, t in cases.items():
        path = os.fspath(tmp_path / f"{name}.parquet")
        pq.write_table(t, path, row_group_size=13, data_page_size=20000, write_page_index=True,
                       use_dictionary=False, compression="none")
        ds = opt4torch.Parquet(path)
        assert kinds(ds)[2] == n, name
        assert [ds[i] for i in range(n)] == pq.read_table(path).to_pylist(), name


def test_row_groups_that_do_not_allow_it_keep_their_page_ranges(tmp_path) -> None:
    cases = {
        "a null value": (hub_table(40, 3, null_at=17), {}),
        "compressed": (hub_table(40, 4), {"compression": "snappy"}),
        "a dictionary": (hub_table(40, 5), {"use_dictionary": True}),
        "small values": (hub_table(40, 6, small=True), {}),
    }
    for name, (t, kw) in cases.items():
        path = write(os.fspath(tmp_path / f"{name}.parquet"), t, **kw)
        ds = opt4torch.Parquet(path)
        assert kinds(ds)[2] == 0 and kinds(ds)[1] > 0, name
        assert [ds[i] for i in range(len(ds))] == pq.read_table(path).to_pylist(), name
    # One row group of a file that allows it and one that does not: each as it allows.
    path = os.fspath(tmp_path / "mixed.parquet")
    write(path, pa.concat_tables([hub_table(40, 7), hub_table(40, 8, null_at=3)]))
    ds = opt4torch.Parquet(path)
    assert kinds(ds)[2] == 40 and kinds(ds)[1] > 0
    assert [ds[i] for i in range(len(ds))] == pq.read_table(path).to_pylist()


def test_a_damaged_value_chain_is_refused_naming_the_file(tmp_path) -> None:
    path = write(os.fspath(tmp_path / "d.parquet"), hub_table(40, 9))
    first = opt4torch.Parquet(path)
    off = int(first._decoder.pieces[5, 1])  # row 5's value: its length, then its bytes
    with open(path, "r+b") as fh:  # a length 2 bytes longer: the page's values no longer end at its end
        fh.seek(off)
        n = int.from_bytes(fh.read(4), "little")
        fh.seek(off)
        fh.write((n + 2).to_bytes(4, "little"))
    with pytest.raises(ParquetError, match=r"d\.parquet: row group 0, column image\.bytes: .*the page at byte \d+"):
        opt4torch.Parquet(path)


class Hostile:
    """A file of rows alone (its path; its rows as they were, where each
    row's value lay, and where its value column's pages lie), short in a
    failing example's report."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.rows = pq.read_table(path).to_pylist()
        ds = opt4torch.Parquet(path)
        assert kinds(ds)[2] == len(self.rows)
        self.values = ds._decoder.pieces[:, 1:].tolist()  # (offset, bytes) of each row's length and value
        c = pq.ParquetFile(path).metadata.row_group(0).column(0)
        self.lo, self.n = int(c.data_page_offset), int(c.total_compressed_size)

    def __repr__(self) -> str:
        return f"Hostile({os.path.basename(self.path)})"


@pytest.fixture(scope="module")
def hostile(tmp_path_factory) -> Hostile:
    return Hostile(write(os.fspath(tmp_path_factory.mktemp("hostile") / "v.parquet"), hub_table(24, 12),
                         data_page_size=30000))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_damaged_value_pages_are_refused_or_read_right(hostile: Hostile, tmp_path_factory, data) -> None:
    """Bytes of the value column's pages (headers, levels, lengths, values)
    changed at random: each row is refused naming the file, or is what the
    damaged file holds: as pyarrow reads it, where it can; else the row as
    it was, with its value's bytes as they now are (where the damage
    spared the page's layout)."""
    raw = bytearray(open(hostile.path, "rb").read())
    near = data.draw(st.booleans())  # near a page's start: its header and levels
    for _ in range(data.draw(st.integers(1, 3))):
        k = hostile.lo + (data.draw(st.integers(0, 40)) if near else data.draw(st.integers(0, hostile.n - 1)))
        raw[k] = data.draw(st.integers(0, 255))
    bad = os.fspath(tmp_path_factory.mktemp("bad") / "v.parquet")
    open(bad, "wb").write(bytes(raw))
    try:
        want = pq.read_table(bad).to_pylist()
    except Exception:  # noqa: BLE001 - pyarrow refuses it: the rows as they were, their bytes as they are
        want = [{**row, "image": {**row["image"], "bytes": bytes(raw[off + 4:off + n])}}
                for row, (off, n) in zip(hostile.rows, hostile.values)]
    refused_or_right(bad, want)


@settings(max_examples=300, deadline=None)
@given(levels=st.binary(max_size=40), count=st.integers(0, 200), max_def=st.integers(1, 3))
def test_the_level_reader_takes_any_bytes(levels: bytes, count: int, max_def: int) -> None:
    try:
        assert _all_defined(levels, count, max_def) in (True, False)
    except pm.ThriftError:
        pass


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_cached_walk_takes_any_bytes(tmp_path, data) -> None:
    """The walk cache is read as hostile bytes: a mutated or foreign file
    gives walks of the right shape or none (a warning), never an error."""
    ident = {"url": "s3://b/k.parquet", "endpoint": "http://127.0.0.1:1", "size": 1000, "etag": "e"}
    where = os.fspath(tmp_path / "k.opt4pq.json")
    save_walks(where, ident, {0: np.array([[4, 10], [14, 20]]), 1: np.array([[40, 8]])})
    raw = bytearray(open(where, "rb").read())
    if data.draw(st.booleans()):
        for _ in range(data.draw(st.integers(1, 4))):
            raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    else:
        raw = bytearray(data.draw(st.binary(max_size=200)))
    with open(where, "wb") as f:
        f.write(bytes(raw))
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        got = load_walks(where, ident, 3)
    assert isinstance(got, dict)
    for rg, walk in got.items():
        assert isinstance(rg, int) and walk.dtype == np.int64 and walk.ndim == 2 and walk.shape[1] == 2


def test_the_level_reader_reads_both_run_kinds() -> None:
    assert _all_defined(bytes([40 << 1, 2]), 40, 2)  # a run of 40 twos
    assert not _all_defined(bytes([40 << 1, 1]), 40, 2)
    assert _all_defined(bytes([(1 << 1) | 1, 0b10101010, 0b10101010]), 8, 2)  # 8 bit-packed twos
    assert not _all_defined(bytes([(1 << 1) | 1, 0b10101010, 0b10101000]), 8, 2)
    assert _all_defined(bytes([(1 << 1) | 1, 0b10101010, 0b00000000]), 4, 2)  # only the first 4 count
    with pytest.raises(pm.ThriftError, match="end after 40 of 41"):
        _all_defined(bytes([40 << 1, 2]), 41, 2)


def test_a_datasets_image_dataset_is_read_row_by_row(tmp_path) -> None:
    datasets = pytest.importorskip("datasets")
    PIL = pytest.importorskip("PIL.Image")
    import io

    rng = np.random.default_rng(11)
    images = []
    for k in range(24):
        buf = io.BytesIO()
        PIL.fromarray(rng.integers(0, 256, (64 + k, 48, 3), dtype=np.uint8)).save(buf, format="PNG")
        images.append({"bytes": buf.getvalue(), "path": None})
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=["a", "b", "c"])})
    hf = datasets.Dataset.from_dict({"image": images, "label": [k % 3 for k in range(24)]}, features=features)
    path = os.fspath(tmp_path / "hf.parquet")
    hf.to_parquet(path)
    ds = opt4torch.Parquet(path)
    want = pq.read_table(path).to_pylist()
    assert [ds[i] for i in range(len(ds))] == want
    assert kinds(ds)[2] == len(ds)  # datasets 5.2 writes images PLAIN, uncompressed, with a page index


@pytest.mark.timeout(240)
def test_s3_rows_alone_equal_the_local_files_and_the_loader_is_exact(tmp_path, monkeypatch) -> None:
    boto3 = pytest.importorskip("boto3")
    from s3store import Server, only_these_credentials

    key, secret = "opt4-test-key", "opt4-test-secret"
    only_these_credentials(monkeypatch, key, secret, "us-east-1")
    server = Server(0.001, key, secret=secret)
    try:
        paths = [write(os.fspath(tmp_path / f"part-{k}.parquet"), hub_table(n, 20 + k)) for k, n in enumerate((45, 31))]
        client = boto3.client("s3", endpoint_url=server.endpoint, region_name="us-east-1", aws_access_key_id=key,
                              aws_secret_access_key=secret)
        client.create_bucket(Bucket="tables")
        for p in paths:
            client.put_object(Bucket="tables", Key=f"train/{os.path.basename(p)}", Body=open(p, "rb").read())
        url, cache = "s3://tables/train/part-{0..1}.parquet", tmp_path / "cache"
        ds = opt4torch.Parquet(url, endpoint_url=server.endpoint, cache_dir=cache)
        assert kinds(ds)[2] == 76
        assert [ds[i] for i in range(len(ds))] == reference(paths)
        walked = ds.info()["requests"]
        # Again: the walks come from the cache, checked by a page header a page (and each read's length).
        ds = opt4torch.Parquet(url, endpoint_url=server.endpoint, cache_dir=cache)
        assert ds.info()["requests"] <= walked - 76 and kinds(ds)[2] == 76
        assert [ds[i] for i in range(len(ds))] == reference(paths)
        # A cache that does not tile the pages (a value moved by a byte) is walked again, and written again.
        (where,) = [p for p in cache.iterdir() if p.name.startswith("part-0.parquet-")]
        body = json.loads(where.read_text())
        body["row_groups"]["0"][0] += 1
        body["row_groups"]["0"][1] -= 1
        where.write_text(json.dumps(body))
        ds = opt4torch.Parquet(url, endpoint_url=server.endpoint, cache_dir=cache)
        assert [ds[i] for i in range(len(ds))] == reference(paths)
        assert json.loads(where.read_text())["row_groups"]["0"][0] == body["row_groups"]["0"][0] - 1
        ds = opt4torch.Parquet(url, endpoint_url=server.endpoint, cache_dir=cache)  # its reads uncounted
        ds.paths = paths  # run() compares with pyarrow's reading of the local copies
        sizes = ds.unit_sizes()
        run(ds, context="fork", cache_bytes=int(sizes.sum()) // 3, prefetch_threads=2)
    finally:
        server.stop()
