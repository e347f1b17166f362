"""Datasets read in place: opt4torch.ImageFolder (an image folder tree) and
opt4torch.TarShards (WebDataset tar shards), on real files.

Each is compared with a reference written out here (torchvision's numbering
of an image folder; Python's tarfile and WebDataset's grouping rule for
shards), then run through opt4torch.DataLoader with fork workers and
prefetch for two epochs: every sample equals ``dataset[i]``, hits equal the
plan's, and the bytes read from storage equal the plan's miss bytes.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import re
import tarfile
import warnings
from pathlib import Path

import numpy as np
import pytest

import opt4torch
from opt4torch import _engine, sources
from opt4torch._shardnames import expand_braces

pytestmark = pytest.mark.usefixtures("no_leaked_pools")


def _blob(i: int) -> bytes:
    rng = np.random.default_rng(500 + i)
    return rng.integers(0, 256, size=50 + (i * 53) % 3000, dtype=np.uint8).tobytes()


def plan_miss_bytes(loader: opt4torch.DataLoader, sizes: np.ndarray) -> int:
    plan = loader.cache.plan
    return int(sizes[plan.seq[plan.kinds != opt4torch.HIT]].sum())


def run_two_epochs(ds, workers: int = 2, prefetch: bool = True) -> dict:
    """Two epochs through opt4torch.DataLoader (fork workers, prefetch):
    every sample is dataset[seq[t]]; returns the cache's stats. ds must not
    have been read yet (its counters are what the loader reports); the
    samples are checked against a copy with counters of its own."""
    ref = pickle.loads(pickle.dumps(ds))
    loader = opt4torch.DataLoader(ds, batch_size=4, shuffle=True, seed=11, num_workers=workers,
                                  multiprocessing_context="fork" if workers else None, cache_items=len(ds) // 3,
                                  epochs=2, prefetch=prefetch, prefetch_threads=3, collate_fn=list)
    try:
        seq = loader.cache.plan.seq
        t = 0
        for _ in range(2):
            for batch in loader:
                for got in batch:
                    assert got == ref[int(seq[t])], f"position {t}"
                    t += 1
        assert t == len(seq)
        st = loader.cache.stats()
        assert st["fallbacks"] == 0 and st["timeouts"] == 0, st
        assert st["hits"] == st["plan_hits"], st
        assert st["storage_bytes"] == plan_miss_bytes(loader, ds.item_sizes()), st
        assert st["storage_reads"] == st["plan_misses"], st
        return st
    finally:
        loader.cache.close()


# ---- ImageFolder ----


@pytest.fixture(scope="module")
def image_root(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A tree with what torchvision's rules decide on: classes out of order,
    a nested folder, upper-case extensions, files that are not images, a
    hidden class folder (torchvision keeps it), a file at the top."""
    root = tmp_path_factory.mktemp("imgs")
    layout = {
        "zebra": ["b.jpg", "a.PNG", "sub/c.jpeg", "notes.txt"],
        "ant": [f"{k:02d}.jpg" for k in range(20)] + ["x.webp", "y.TIFF"],
        ".hidden": ["h.bmp"],
        "moth": [f"m{k}.png" for k in range(15)],
    }
    i = 0
    for cls, files in layout.items():
        for name in files:
            p = root / cls / name
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(_blob(i))
            i += 1
    (root / "top.jpg").write_bytes(b"not in a class")
    return os.fspath(root)


def test_image_folder_numbers_as_torchvision(image_root: str) -> None:
    ds = opt4torch.ImageFolder(image_root)
    assert ds.classes == [".hidden", "ant", "moth", "zebra"]
    assert ds.class_to_idx == {".hidden": 0, "ant": 1, "moth": 2, "zebra": 3}
    want = ([(".hidden/h.bmp", 0)] + [(f"ant/{k:02d}.jpg", 1) for k in range(20)] + [("ant/x.webp", 1),
            ("ant/y.TIFF", 1)] + [(f"moth/m{k}.png", 2) for k in sorted(range(15), key=str)]
            + [("zebra/a.PNG", 3), ("zebra/b.jpg", 3), ("zebra/sub/c.jpeg", 3)])
    assert [(os.path.relpath(p, image_root), c) for p, c in ds.samples] == want
    assert ds.targets == [c for _, c in want]
    assert len(ds) == len(want)
    for i in range(len(ds)):
        data, label = ds[i]
        with open(ds.samples[i][0], "rb") as f:
            assert data == f.read()
        assert label == ds.targets[i]
    assert ds[-1] == ds[len(ds) - 1]
    with pytest.raises(IndexError):
        ds[len(ds)]
    info = ds.info()  # every file once, then the last twice
    assert info["reads"] == len(ds) + 2
    assert info["bytes_read"] == int(ds.item_sizes().sum()) + 2 * int(ds.item_sizes()[-1])


def test_image_folder_refuses_an_empty_class(tmp_path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.jpg").write_bytes(b"x")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "readme.txt").write_bytes(b"x")
    with pytest.raises(FileNotFoundError, match="no valid file for the classes b"):
        opt4torch.ImageFolder(tmp_path)


@pytest.mark.parametrize("direct", [False, True], ids=["buffered", "direct"])
@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_image_folder_loader_prefetch_is_exact(image_root: str, direct: bool) -> None:
    ds = opt4torch.ImageFolder(image_root, direct=direct, latency=0.0003)
    st = run_two_epochs(ds)
    assert st["prefetcher"]["kind"] == "records", st  # the C prefetcher
    assert st["prefetched"] > 0, st


# ---- TarShards ----


def _add(tf: tarfile.TarFile, name: str, data: bytes) -> None:
    ti = tarfile.TarInfo(name)
    ti.size = len(data)
    ti.mtime = 1700000000
    tf.addfile(ti, io.BytesIO(data))


LONG = "train/" + "l" * 150  # over ustar's 100 bytes: a GNU long name or a pax path


def _write_shards(folder) -> list[str]:
    """Two shards: GNU format (a long name, a directory, a file with no dot,
    WebDataset metadata) and pax (a non-ASCII path, upper-case fields)."""
    paths = [os.fspath(folder / "shard-000.tar"), os.fspath(folder / "shard-001.tar")]
    n = 0
    with tarfile.open(paths[0], "w", format=tarfile.GNU_FORMAT) as tf:
        d = tarfile.TarInfo("train")
        d.type = tarfile.DIRTYPE
        tf.addfile(d)
        _add(tf, "__meta__", b"{}")
        for k in range(25):
            _add(tf, f"train/{k:04d}.jpg", _blob(n))
            _add(tf, f"train/{k:04d}.cls", str(k % 5).encode())
            if k % 4 == 0:
                _add(tf, f"train/{k:04d}.seg.png", _blob(n + 1))
            n += 2
        _add(tf, "train/README", b"no dot: skipped")
        _add(tf, LONG + ".jpg", _blob(n))
        _add(tf, LONG + ".json", b'{"long": true}')
    with tarfile.open(paths[1], "w", format=tarfile.PAX_FORMAT) as tf:
        for k in range(20):
            _add(tf, f"val/\u00e9t\u00e9-{k:03d}.JPG", _blob(n))
            _add(tf, f"val/\u00e9t\u00e9-{k:03d}.Cls", str(k % 3).encode())
            n += 1
        _add(tf, LONG + "-pax.txt", b"pax path")
    return paths


def reference_samples(path: str) -> list[dict]:
    """Python's tarfile reading the shard, grouped by WebDataset's rule
    (webdataset.tariterators: base_plus_ext, group_by_keys, its metadata
    filters, lcase=True)."""
    out: list[dict] = []
    current: dict | None = None
    with tarfile.open(path) as tf:
        for ti in tf:
            name = ti.name
            if not ti.isreg():
                continue
            if "/" not in name and name.startswith("__") and name.endswith("__"):
                continue
            if re.match(r"__[^/]*__($|/)", name):
                continue
            m = re.match(r"^((?:.*/|)[^.]+)[.]([^/]*)$", name)
            if not m:
                continue
            prefix, suffix = m.group(1), m.group(2).lower()
            if current is None or prefix != current["__key__"]:
                if current is not None:
                    out.append(current)
                current = {"__key__": prefix}
            assert suffix not in current
            current[suffix] = tf.extractfile(ti).read()
    if current is not None:
        out.append(current)
    return out


@pytest.fixture
def shards(tmp_path) -> list[str]:
    return _write_shards(tmp_path)


def test_tar_shards_match_tarfile_and_webdataset(shards: list[str]) -> None:
    ds = opt4torch.TarShards(shards)
    want = reference_samples(shards[0]) + reference_samples(shards[1])
    assert len(want) == 25 + 1 + 20 + 1
    assert len(ds) == len(want)
    for i, sample in enumerate(want):
        assert ds[i] == sample, f"sample {i} ({sample['__key__']})"
    assert ds[25]["__key__"] == LONG and ds[-1]["__key__"] == LONG + "-pax"
    assert ds[26] == {"__key__": "val/\u00e9t\u00e9-000", "jpg": _blob(50), "cls": b"0"}
    for shard in shards:
        assert os.path.exists(shard + ".opt4idx.json")


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_tar_shards_loader_is_exact(shards: list[str]) -> None:
    ds = opt4torch.TarShards(shards, latency=0.0003)
    st = run_two_epochs(ds)
    assert st["prefetcher"]["kind"] == "records", st  # the C prefetcher (frame "tar")
    assert st["prefetched"] > 0 and st["prefetcher"]["errors"] == 0, st


def _records_as_the_codec_stores(ds: opt4torch.TarShards) -> list:
    from opt4torch._codec import encode

    return [b"".join(bytes(memoryview(p)) for p in encode(ds[i])) for i in range(len(ds))]


def test_tar_samples_laid_out_as_the_codec_stores_them(shards: list[str]) -> None:
    """The C prefetcher's record of each sample (binding/tarframe.c) is byte
    for byte the codec's record of ds[i], and its length is what the loader
    plans with (opt4_item_bytes)."""
    ds = opt4torch.TarShards(shards)
    got = _engine.tar_records(ds._r, (ds.keys, ds._members), range(len(ds)))
    want = _records_as_the_codec_stores(ds)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g == w, f"sample {i} ({ds.keys[i]})"
        assert ds.opt4_item_bytes(i) == len(w)


def test_tar_samples_with_odd_names(tmp_path) -> None:
    """Names that are not UTF-8 (the indexer decodes them with
    surrogateescape; the codec encodes with surrogatepass), a field named
    like the key (it replaces the key in the dict: the C layout leaves that
    sample to the worker), an empty member, many fields."""
    path = os.fspath(tmp_path / "odd.tar")
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT, encoding="utf-8", errors="surrogateescape") as tf:
        _add(tf, "caf\udce9/1.jpg", b"latin-1 folder")
        _add(tf, "caf\udce9/1.t\udcfft", b"")
        _add(tf, "k/2.jpg", b"two")
        _add(tf, "k/2.__key__", b"replaces the key")
        for f in range(40):
            _add(tf, f"m/3.f{f:02d}", bytes([f]) * f)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the index is cached, names that are not UTF-8 too
        ds = opt4torch.TarShards([path])
    assert os.path.exists(path + ".opt4idx.json")
    assert opt4torch.TarShards([path]).keys == ds.keys  # read back from the cache
    assert len(ds) == 3 and ds.keys[0] == "caf\udce9/1"
    assert ds[1] == {"__key__": b"replaces the key", "jpg": b"two"}
    got = _engine.tar_records(ds._r, (ds.keys, ds._members), range(len(ds)))
    want = _records_as_the_codec_stores(ds)
    assert got[1] is None  # the worker loads it
    assert got[0] == want[0] and got[2] == want[2]
    assert [ds.opt4_item_bytes(i) for i in range(3)] == [len(w) for w in want]
    st = run_two_epochs(opt4torch.TarShards([path]), workers=1)
    assert st["prefetcher"]["kind"] == "records", st


def test_tar_index_cache(shards: list[str], monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    first = [dict(s) for s in opt4torch.TarShards(shards[:1])]
    side = shards[0] + ".opt4idx.json"
    body = json.loads(open(side, encoding="utf-8").read())
    assert body["shard"]["size"] == os.path.getsize(shards[0])

    # Current: used as it is, the indexer not called.
    def no_indexing(path: str):
        raise AssertionError(f"indexed {path} again")

    monkeypatch.setattr(sources._engine, "tar_index", no_indexing)
    assert [dict(s) for s in opt4torch.TarShards(shards[:1])] == first
    monkeypatch.undo()

    # Stale: the shard rewritten (other samples); its index is rebuilt.
    with tarfile.open(shards[0], "w") as tf:
        _add(tf, "new/1.txt", b"one")
        _add(tf, "new/2.txt", b"two")
    ds = opt4torch.TarShards(shards[:1])
    assert [dict(s) for s in ds] == [{"__key__": "new/1", "txt": b"one"}, {"__key__": "new/2", "txt": b"two"}]
    assert len(json.loads(open(side, encoding="utf-8").read())["samples"]) == 2

    # Corrupt: rebuilt, with a warning naming it.
    with open(side, "w") as f:
        f.write('{"format": "opt4torch-tar-index", "version": 1, "shard": ')
    with pytest.warns(RuntimeWarning, match="is corrupt"):
        assert len(opt4torch.TarShards(shards[:1])) == 2
    body = json.loads(open(side, encoding="utf-8").read())
    body["samples"][0][2] = 10**9  # a range past the shard's end: corrupt too
    with open(side, "w") as f:
        json.dump(body, f)
    with pytest.warns(RuntimeWarning, match="outside the shard"):
        assert [dict(s) for s in opt4torch.TarShards(shards[:1])][1] == {"__key__": "new/2", "txt": b"two"}

    # A folder that is not writable: the index goes to cache_dir.
    folder = os.path.dirname(os.path.abspath(shards[1]))
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if os.fspath(p) == folder
                        else real_access(p, mode, **kw))
    os.unlink(shards[1] + ".opt4idx.json") if os.path.exists(shards[1] + ".opt4idx.json") else None
    cache = tmp_path / "cache"
    ds = opt4torch.TarShards(shards[1:], cache_dir=cache)
    assert len(ds) == 21
    assert not os.path.exists(shards[1] + ".opt4idx.json")
    assert [p.name for p in cache.iterdir()][0].startswith("shard-001.tar-")


def _headers(path: str) -> list[tuple[int, int]]:
    """(offset, size) of each member's header (for a long name, its ././@LongLink header)."""
    with tarfile.open(path) as tf:
        return [(ti.offset, ti.size) for ti in tf]


def test_hostile_tar_is_refused(shards: list[str], tmp_path) -> None:
    good = open(shards[0], "rb").read()
    bad = tmp_path / "bad.tar"
    at = _headers(shards[0])[3][0]
    raw = bytearray(good)
    raw[at + 2] ^= 0x01  # a name byte: the checksum no longer matches
    bad.write_bytes(bytes(raw))
    with pytest.raises(opt4torch.Opt4Error, match=rf"{re.escape(str(bad))}: bad checksum in the header at offset {at}"):
        opt4torch.TarShards([bad])
    big = next(off for off, size in _headers(shards[0]) if size > 1000)
    bad.write_bytes(good[:big + 700])  # cut inside a member's data
    with pytest.raises(opt4torch.Opt4Error, match=rf"{re.escape(str(bad))}: the member at offset {big} says \d+ "
                       "bytes, past the end"):
        opt4torch.TarShards([bad])
    bad.write_bytes(good[:at + 100])
    with pytest.raises(opt4torch.Opt4Error, match=f"truncated header at offset {at}"):
        opt4torch.TarShards([bad])
    bad.write_bytes(b"<html>not a tar file</html>" * 40)
    with pytest.raises(opt4torch.Opt4Error, match="bad checksum field in the header at offset 0"):
        opt4torch.TarShards([bad])
    assert not os.path.exists(os.fspath(bad) + ".opt4idx.json")


# ---- torchvision's arguments ----


def test_image_folder_takes_torchvisions_file_arguments(image_root: str) -> None:
    """extensions, is_valid_file and allow_empty, with torchvision's meaning:
    is_valid_file is given each file's path (root joined), extensions are
    suffixes of the name (case-insensitive), both together are refused, and
    an empty class keeps its number."""
    pngs = opt4torch.ImageFolder(image_root, extensions=".PNG", allow_empty=True)
    assert pngs.classes == [".hidden", "ant", "moth", "zebra"]  # numbers as without the filter
    assert [(os.path.relpath(p, image_root), c) for p, c in pngs.samples] == (
        [(f"moth/m{k}.png", 2) for k in sorted(range(15), key=str)] + [("zebra/a.PNG", 3)])
    with pytest.raises(FileNotFoundError, match=r"no valid file for the classes \.hidden, ant") as e:
        opt4torch.ImageFolder(image_root, extensions=(".png",))
    assert isinstance(e.value, ValueError)  # what pack raised, and still does
    assert "'.hidden' starts with a dot" in str(e.value) and "allow_empty=True" in str(e.value)

    seen: list[str] = []

    def in_a_subfolder(path: str) -> bool:
        seen.append(path)
        return os.sep + "sub" + os.sep in path

    sub = opt4torch.ImageFolder(image_root, is_valid_file=in_a_subfolder, allow_empty=True)
    assert [(os.path.relpath(p, image_root), c) for p, c in sub.samples] == [("zebra/sub/c.jpeg", 3)]
    with open(sub.samples[0][0], "rb") as f:
        assert sub[0] == (f.read(), 3)
    assert all(p.startswith(image_root + os.sep) for p in seen) and len(seen) == 42  # every file, notes.txt too
    assert pickle.loads(pickle.dumps(sub)).samples == sub.samples  # the callable is not kept
    with pytest.raises(ValueError, match="extensions or is_valid_file, not both"):
        opt4torch.ImageFolder(image_root, extensions=".jpg", is_valid_file=in_a_subfolder)
    with pytest.raises(TypeError, match="is_valid_file must be a callable"):
        opt4torch.ImageFolder(image_root, is_valid_file=".jpg")  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["transform", "target_transform", "loader"])
def test_image_folder_says_where_a_transform_goes(image_root: str, name: str) -> None:
    with pytest.raises(TypeError, match=rf"ImageFolder takes no {name}: .*opt4torch\.DataLoader\(ds, \.\.\., "
                                        r"transform=f\)"):
        opt4torch.ImageFolder(image_root, **{name: lambda x: x})
    # torchvision's positional order: root, transform, target_transform, loader.
    position = ["transform", "target_transform", "loader"].index(name)
    args: list = [None, None, None]
    args[position] = print
    with pytest.raises(TypeError, match=f"takes no {name}"):
        opt4torch.ImageFolder(image_root, *args)
    assert len(opt4torch.ImageFolder(image_root, **{name: None})) == 41  # torchvision's default is fine


# ---- shard names as WebDataset spells them ----


@pytest.mark.parametrize(("pattern", "names"), [
    # braceexpand's documented examples (the package WebDataset expands with)
    ("item{1..3}", ["item1", "item2", "item3"]),
    ("{a..c}", ["a", "b", "c"]),
    ("index.html{,.backup}", ["index.html", "index.html.backup"]),
    ("python{2.{5..7},3.{2,3}}", ["python2.5", "python2.6", "python2.7", "python3.2", "python3.3"]),
    ("{07..10}", ["07", "08", "09", "10"]),
    ("{a..g..2}", ["a", "c", "e", "g"]),
    ("{4..1}", ["4", "3", "2", "1"]),
    (r"{1\{2,3}", ["1{2", "3"]),
    # WebDataset's own spelling, and what braceexpand keeps as written
    ("shard-{000000..000003}.tar", [f"shard-{k:06d}.tar" for k in range(4)]),
    ("s{0..10..5}-{x,y}", ["s0-x", "s0-y", "s5-x", "s5-y", "s10-x", "s10-y"]),
    ("{9..11}", ["9", "10", "11"]),
    ("a{b}c", ["a{b}c"]),
    ("plain.tar", ["plain.tar"]),
])
def test_brace_expansion(pattern: str, names: list[str]) -> None:
    assert expand_braces(pattern) == names


@pytest.mark.parametrize("pattern", ["shard-{0..3.tar", "shard-0..3}.tar", "{1{2,3}"])
def test_unbalanced_braces_are_refused(pattern: str) -> None:
    with pytest.raises(ValueError, match=rf"unbalanced braces in the shard pattern {re.escape(repr(pattern))}"):
        expand_braces(pattern)


def test_brace_expansion_agrees_with_braceexpand() -> None:
    """Against the package itself, on generated patterns, where it is
    installed (it comes with webdataset; not a dependency of ours)."""
    braceexpand = pytest.importorskip("braceexpand", reason="braceexpand (webdataset's) is not installed")
    hypothesis = pytest.importorskip("hypothesis")
    st = hypothesis.strategies
    atom = st.one_of(
        st.text(alphabet="ab.-/_", min_size=0, max_size=3),
        st.builds(lambda a, b, w: "{" + f"{a:0{w}d}..{b:0{w}d}" + "}", st.integers(0, 12), st.integers(0, 12),
                  st.integers(0, 3)),
        st.builds(lambda a, b: "{" + f"{a}..{b}" + "}", st.sampled_from("abcxyz"), st.sampled_from("abcxyz")),
        st.lists(st.text(alphabet="ab1", max_size=2), min_size=2, max_size=3).map(lambda xs: "{" + ",".join(xs) + "}"),
    )
    nested = st.lists(atom, min_size=1, max_size=2).map("".join)
    pattern = st.lists(st.one_of(atom, nested.map(lambda s: "{" + s + ",z}")), min_size=1, max_size=3).map("".join)

    @hypothesis.settings(max_examples=300)
    @hypothesis.given(pattern)
    def agree(p: str) -> None:
        mine = expand_braces(p)
        hypothesis.assume(len(mine) <= 2000)  # a few ranges multiply quickly; braceexpand is slow on such
        assert mine == list(braceexpand.braceexpand(p)), p

    agree()


def _small_shards(folder, n: int = 4, per: int = 3) -> list[str]:
    paths = []
    for s in range(n):
        path = os.fspath(folder / f"shard-{s:06d}.tar")
        with tarfile.open(path, "w") as tf:
            for k in range(per):
                _add(tf, f"{s}/{k:03d}.jpg", _blob(s * per + k))
                _add(tf, f"{s}/{k:03d}.cls", str(k).encode())
        paths.append(path)
    return paths


def test_tar_shards_named_as_webdataset_names_them(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    paths = _small_shards(tmp_path)
    listed = opt4torch.TarShards(paths)
    want = [listed[i] for i in range(len(listed))]
    assert len(want) == 12
    monkeypatch.chdir(tmp_path)
    for spec in ["shard-{000000..000003}.tar", "shard-00000{0..3}.tar", "shard-*.tar", "shard-*",
                 "shard-{000000,000001}.tar::shard-00000[23].tar", os.fspath(tmp_path / "shard-{000000..000003}.tar"),
                 ["shard-{000000..000001}.tar", "shard-00000[23].tar"], tmp_path / "shard-*.tar"]:
        ds = opt4torch.TarShards(spec)
        assert [os.path.basename(p) for p in ds.paths] == [os.path.basename(p) for p in paths], spec
        assert [ds[i] for i in range(len(ds))] == want, spec
    assert os.path.exists(paths[0] + ".opt4idx.json")  # and "shard-*" did not take the index caches
    assert opt4torch.TarShards("shard-{000002..000000}.tar").paths == ["shard-000002.tar", "shard-000001.tar",
                                                                       "shard-000000.tar"]

    # A name that exists as written is taken as written, braces and all.
    odd = tmp_path / "odd{1,2}.tar"
    os.link(paths[0], odd)
    assert opt4torch.TarShards(str(odd)).paths == [str(odd)]

    with pytest.raises(FileNotFoundError, match=r"the tar shard pattern 'shard-\{000000\.\.000005\}\.tar' expands "
                                                r"to 6 names, and 2 of them are not there: 'shard-000004\.tar', "
                                                r"'shard-000005\.tar'"):
        opt4torch.TarShards("shard-{000000..000005}.tar")
    with pytest.raises(FileNotFoundError, match=r"the tar shard pattern 'train-\{0\.\.3\}\.tar' matches nothing: "
                                                r"it expands to 4 names, and none is there \('train-0\.tar'"):
        opt4torch.TarShards("train-{0..3}.tar")
    with pytest.raises(FileNotFoundError, match=r"the tar shard pattern 'val-\*\.tar' matches nothing"):
        opt4torch.TarShards("val-*.tar")
    with pytest.raises(FileNotFoundError, match=r"no tar shard at 'shard-9\.tar'"):
        opt4torch.TarShards(["shard-000000.tar", "shard-9.tar"])
    with pytest.raises(ValueError, match="unbalanced braces"):
        opt4torch.TarShards("shard-{0..3.tar")
    with pytest.raises(ValueError, match="at least one shard"):
        opt4torch.TarShards([])


def test_tar_shards_agree_with_webdataset(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Shards written by webdataset's ShardWriter, named by its pattern, read
    by WebDataset and by TarShards: the same shards, the same samples."""
    wds = pytest.importorskip("webdataset", reason="webdataset is not installed (not a dependency of ours)")
    monkeypatch.chdir(tmp_path)
    with wds.ShardWriter("ws-%06d.tar", maxcount=5, verbose=0) as sink:
        for k in range(17):
            sink.write({"__key__": f"s{k:04d}", "jpg": _blob(k), "cls": str(k % 3).encode(), "seg.png": _blob(k + 99)})
    spec = "ws-{000000..000003}.tar"
    # WebDataset adds where a sample came from (__url__, __local_path__): not part of the sample.
    theirs = [{k: v for k, v in s.items() if k == "__key__" or not k.startswith("__")}
              for s in wds.WebDataset(spec, shardshuffle=False)]
    ours = opt4torch.TarShards(spec)
    assert len(theirs) == len(ours) == 17
    assert [ours[i] for i in range(len(ours))] == theirs


def test_compressed_shards_are_refused_saying_what_to_do(tmp_path) -> None:
    """Known by their first bytes, not by their names."""
    import bz2
    import lzma

    plain = _small_shards(tmp_path, n=1)[0]
    with open(plain, "rb") as f:
        data = f.read()
    gz = os.fspath(tmp_path / "a.tar.gz")
    with tarfile.open(gz, "w:gz") as tf:  # as users make them
        _add(tf, "0/000.jpg", b"x")
    for path, tool in [(gz, "gzip"), (tmp_path / "b.tar.bz2", "bzip2"), (tmp_path / "c.tar.xz", "xz"),
                       (tmp_path / "named.tar", "gzip")]:
        path = os.fspath(path)
        if tool == "bzip2":
            Path(path).write_bytes(bz2.compress(data))
        elif tool == "xz":
            Path(path).write_bytes(lzma.compress(data))
        elif path.endswith("named.tar"):
            Path(path).write_bytes(Path(gz).read_bytes())
        out = path[:-4] + ".plain.tar" if path.endswith("named.tar") else path[:path.rindex(".tar") + 4]
        with pytest.raises(ValueError, match=rf"tar shard {re.escape(path)} is an? {tool}-compressed file: "
                                             rf"compressed shards are not read in place .* decompress it once, "
                                             rf"`{tool} -dc {re.escape(path)} > {re.escape(out)}`"):
            opt4torch.TarShards(path)
        assert not os.path.exists(path + ".opt4idx.json")
    # The command it gives works, and its output reads.
    import subprocess

    subprocess.run(f"gzip -dc {gz} > {tmp_path / 'a.tar'}", shell=True, check=True, timeout=60)
    assert opt4torch.TarShards(os.fspath(tmp_path / "a.tar"))[0] == {"__key__": "0/000", "jpg": b"x"}
    # A plain tar named .tar.gz is a tar.
    os.link(plain, tmp_path / "really-plain.tar.gz")
    assert len(opt4torch.TarShards(os.fspath(tmp_path / "really-plain.tar.gz"))) == 3
    # Our own files, handed over as shards.
    from opt4torch.records import write_records

    rec = tmp_path / "x.rec"
    write_records(rec, [b"a"])
    with pytest.raises(ValueError, match=r"x\.rec is an opt4 record file, not a tar archive: read it with "
                                         r"opt4torch\.RecordFile"):
        opt4torch.TarShards(os.fspath(rec))
