"""opt4torch.Parquet: Parquet files read in place (python/opt4torch/sources/parquet.py).

The files are written by pyarrow with several row-group and page sizes, with
and without an offset index (the page index), snappy and zstd; every row must
equal pyarrow's own reading. Through opt4torch.DataLoader (fork and spawn
workers, the C prefetcher): every sample equals that row, hits equal the
plan's, and the bytes read from storage equal the plan's miss bytes (the
plan is over row groups, what a read fetches). Bad files are refused naming
the file.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

import opt4torch  # noqa: E402
from opt4torch.sources.parquet import ParquetError  # noqa: E402

pytestmark = pytest.mark.usefixtures("no_leaked_pools")


def table(n: int, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    blobs = [rng.integers(0, 256, size=int(rng.integers(20, 900)), dtype=np.uint8).tobytes() for _ in range(n)]
    return pa.table({
        "id": pa.array(np.arange(n, dtype=np.int64) + seed * 1000),
        "image": pa.array([{"bytes": b, "path": f"{k}.jpg" if k % 4 else None} for k, b in enumerate(blobs)],
                          pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
        "label": pa.array(rng.integers(0, 10, size=n), pa.int64()),
        "score": pa.array([None if k % 9 == 0 else float(k) / 3 for k in range(n)], pa.float64()),
        "tags": pa.array([list(range(k % 4)) for k in range(n)], pa.list_(pa.int32())),
        "caption": pa.array([("word " * (k % 6)) + str(k) for k in range(n)]),
    })


CONFIGS = {
    "rg7-smallpages-index-snappy": dict(row_group_size=7, data_page_size=512, write_page_index=True,
                                        compression="snappy"),
    "rg25-noindex-zstd": dict(row_group_size=25, write_page_index=False, compression="zstd"),
    "rg60-index-zstd-dict": dict(row_group_size=60, data_page_size=1024, write_page_index=True,
                                 compression="zstd", use_dictionary=True),
}


def write(folder, name: str, n: int, seed: int, **kw) -> str:
    path = os.path.join(os.fspath(folder), name)
    pq.write_table(table(n, seed), path, **kw)
    return path


@pytest.fixture(scope="module", params=list(CONFIGS))
def files(request, tmp_path_factory) -> list[str]:
    folder = tmp_path_factory.mktemp(request.param)
    return [write(folder, f"part-{k}.parquet", n, k, **CONFIGS[request.param]) for k, n in enumerate((50, 33, 61))]


def reference(paths: list[str]) -> list[dict]:
    return [row for p in paths for row in pq.read_table(p).to_pylist()]


def refused_or_right(bad: str, want: list[dict]) -> None:
    """A damaged file ``bad`` is refused at indexing naming it, or each of
    its rows is refused naming it or equals ``want``'s: never a wrong row."""
    name = os.path.basename(bad)
    try:
        ds = opt4torch.Parquet(bad)
    except ParquetError as e:
        assert name in str(e)
        return
    for i in range(len(ds)):
        try:
            got = ds[i]
        except ParquetError as e:
            assert name in str(e)
            continue
        assert got == want[i], i


def test_every_row_equals_pyarrows_reading(files: list[str]) -> None:
    ds = opt4torch.Parquet(files)
    want = reference(files)
    assert len(ds) == len(want)
    for i in range(len(ds)):
        assert ds[i] == want[i], i
    assert ds[-1] == want[-1]
    with pytest.raises(IndexError):
        ds[len(ds)]
    meta = [pq.ParquetFile(p).metadata for p in files]
    assert len(ds.unit_sizes()) == sum(m.num_row_groups for m in meta)


def test_brace_patterns_and_globs(files: list[str]) -> None:
    folder = os.path.dirname(files[0])
    by_glob = opt4torch.Parquet(os.path.join(folder, "*.parquet"))
    by_brace = opt4torch.Parquet(os.path.join(folder, "part-{0..2}.parquet"))
    assert by_glob.paths == by_brace.paths == files
    with pytest.raises(FileNotFoundError):
        opt4torch.Parquet(os.path.join(folder, "nothing-*.parquet"))


def run(ds, *, context: str, epochs: int = 2, count_storage: bool = True, **kw) -> dict:
    ref = reference(ds.paths)
    loader = opt4torch.DataLoader(ds, batch_size=5, shuffle=True, seed=3, num_workers=2,
                                  multiprocessing_context=context, epochs=epochs, collate_fn=list, **kw)
    try:
        rows = loader.dataset.transform.rows  # the row each position asked for
        t = 0
        for _ in range(epochs):
            for batch in loader:
                for got in batch:
                    assert got == ref[int(rows[t])], f"position {t}"
                    t += 1
        assert t == len(rows) == epochs * len(ds)
        st = loader.cache.stats()
        plan = loader.cache.plan
        sizes = ds.unit_sizes()
        assert st["fallbacks"] == 0 and st["timeouts"] == 0, st
        assert st["hits"] == st["plan_hits"] > 0, st
        if count_storage:
            assert st["storage_bytes"] == int(sizes[plan.seq[plan.kinds != opt4torch.HIT]].sum()), st
            pieces = np.diff(ds._groups.first)  # a unit's reads: one, or one for each column's pages
            assert st["storage_reads"] == int(pieces[plan.seq[plan.kinds != opt4torch.HIT]].sum()), st
        return st
    finally:
        loader.cache.close()


@pytest.mark.timeout(240)
def test_loader_plans_over_row_groups_fork(files: list[str]) -> None:
    ds = opt4torch.Parquet(files)
    sizes = ds.unit_sizes()
    run(ds, context="fork", cache_bytes=max(int(sizes.sum()) // 3, 2 * int(sizes.max()) + 1024), prefetch_threads=2)


@pytest.mark.timeout(300)
def test_loader_spawn_without_prefetch(tmp_path) -> None:
    paths = [write(tmp_path, f"s{k}.parquet", 40, k, row_group_size=8) for k in range(2)]
    ds = opt4torch.Parquet(paths)
    # The reader's counters are shared with forked workers only (as for
    # ImageFolder): a spawned worker's reads are its own, so bytes are
    # checked in the fork test.
    run(ds, context="spawn", cache_items=3, prefetch=False, count_storage=False)


# ---- bad input: each refused naming the file ----


def test_a_file_that_is_not_parquet(tmp_path) -> None:
    good = write(tmp_path, "good.parquet", 10, 0)
    bad = tmp_path / "notes.parquet"
    bad.write_bytes(b"just some text, not columns\n" * 10)
    with pytest.raises(ParquetError, match=f"{bad} is not a Parquet file"):
        opt4torch.Parquet([good, os.fspath(bad)])
    empty = tmp_path / "empty.parquet"
    empty.write_bytes(b"")
    with pytest.raises(ParquetError, match="empty.parquet is not a Parquet file"):
        opt4torch.Parquet(os.fspath(empty))


def test_a_corrupt_footer(tmp_path) -> None:
    path = write(tmp_path, "f.parquet", 30, 0)
    raw = bytearray(open(path, "rb").read())
    flen = int.from_bytes(raw[-8:-4], "little")
    start = len(raw) - 8 - flen
    raw[start:start + flen // 2] = b"\xff" * (flen // 2)
    open(path, "wb").write(bytes(raw))
    with pytest.raises(ParquetError, match="f.parquet: its footer is corrupt"):
        opt4torch.Parquet(path)
    raw[-8:-4] = (len(raw) + 10).to_bytes(4, "little")
    open(path, "wb").write(bytes(raw))
    with pytest.raises(ParquetError, match="f.parquet: its footer claims"):
        opt4torch.Parquet(path)


def test_a_row_group_cut_short(tmp_path) -> None:
    """The file's data cut in the middle, its footer (which says where the
    row groups are) kept: the last row groups reach past the data."""
    path = write(tmp_path, "cut.parquet", 60, 0, row_group_size=20)
    raw = open(path, "rb").read()
    flen = int.from_bytes(raw[-8:-4], "little")
    data, tail = raw[:len(raw) - 8 - flen], raw[len(raw) - 8 - flen:]
    open(path, "wb").write(data[:len(data) * 2 // 3] + tail)
    with pytest.raises(ParquetError, match=r"cut.parquet: row group \d lies at bytes .* cut short"):
        opt4torch.Parquet(path)


def test_a_schema_that_differs_between_files(tmp_path) -> None:
    a = write(tmp_path, "a.parquet", 10, 0)
    b = os.fspath(tmp_path / "b.parquet")
    pq.write_table(table(10, 1).drop_columns(["caption"]), b)
    with pytest.raises(ParquetError, match="b.parquet has another schema than .*a.parquet"):
        opt4torch.Parquet([a, b])


def test_a_file_changed_after_it_was_indexed(tmp_path) -> None:
    path = write(tmp_path, "c.parquet", 30, 0, row_group_size=10)
    ds = opt4torch.Parquet(path)
    assert ds[0] == reference([path])[0]
    write(tmp_path, "c.parquet", 30, 5, row_group_size=10)  # another file under the name
    # The engine's read checks the file against its identity at indexing.
    with pytest.raises(opt4torch.Opt4IOError, match="c.parquet was not served: the file changed since it was"):
        ds[15]


# ---- objects in an S3-compatible store (the loopback server the object-store tests use) ----


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    boto3 = pytest.importorskip("boto3")
    from s3store import Server

    key, secret = "opt4-test-key", "opt4-test-secret"
    server = Server(0.002, key, secret=secret)
    try:
        folder = tmp_path_factory.mktemp("s3pq")
        # The second file has an offset index and pages of 3 rows: its units
        # are page ranges, each gathered from several ranged GETs.
        paths = [write(folder, f"part-{k}.parquet", n, k, row_group_size=9, write_page_index=k == 1,
                       max_rows_per_page=3 if k == 1 else None, compression="zstd" if k else "snappy")
                 for k, n in enumerate((30, 41, 17))]
        client = boto3.client("s3", endpoint_url=server.endpoint, region_name="us-east-1", aws_access_key_id=key,
                              aws_secret_access_key=secret)
        client.create_bucket(Bucket="tables")
        for p in paths:
            client.put_object(Bucket="tables", Key=f"train/{os.path.basename(p)}", Body=open(p, "rb").read())
        client.put_object(Bucket="tables", Key="train/readme.txt", Body=b"not a table")
        yield server, paths, key, secret
    finally:
        server.stop()


@pytest.fixture
def s3_env(store, monkeypatch: pytest.MonkeyPatch):
    _, _, key, secret = store
    from s3store import only_these_credentials

    only_these_credentials(monkeypatch, key, secret, "us-east-1")


@pytest.mark.timeout(240)
@pytest.mark.usefixtures("s3_env")
def test_s3_rows_equal_the_local_files_and_the_loader_is_exact(store) -> None:
    server, paths, _, _ = store
    for url in ("s3://tables/train/part-{0..2}.parquet", "s3://tables/train/*.parquet"):
        ds = opt4torch.Parquet(url, endpoint_url=server.endpoint)
        assert ds.paths == [f"s3://tables/train/{os.path.basename(p)}" for p in paths]
        local = opt4torch.Parquet(paths)
        assert len(ds) == len(local)
        assert all(ds[i] == local[i] for i in range(len(ds)))
    ds = opt4torch.Parquet("s3://tables/train/*.parquet", endpoint_url=server.endpoint)
    assert not ds._groups.single and ds._decoder.units[:, 4].sum() == 4 * 3 + 2  # row groups of 9, 5 rows; pages of 3
    ds.paths = paths  # run() compares with pyarrow's reading of the local copies
    sizes = ds.unit_sizes()
    run(ds, context="fork", cache_bytes=max(int(sizes.sum()) // 3, 2 * int(sizes.max()) + 1024), prefetch_threads=2)
    with pytest.raises(ParquetError, match="s3://tables/train/readme.txt is not a Parquet file"):
        opt4torch.Parquet("s3://tables/train/{part-0.parquet,readme.txt}", endpoint_url=server.endpoint)
