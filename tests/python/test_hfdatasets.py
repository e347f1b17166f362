"""Hugging Face datasets given to opt4torch.DataLoader as they are
(python/opt4torch/sources/hfdatasets.py).

The data is made with the real tool, as a Hub user has it: a
``datasets.Dataset`` with ``Image``, ``ClassLabel``, ``Sequence`` and string
features, written with ``to_parquet`` and loaded back with
``load_dataset("parquet", data_files=...)``. Every sample the loader gives,
hit or miss, with fork and spawn workers, must equal ``ds[i]`` (the same PIL
type and pixels, the same label, the same dict), and the hits must equal the
plan's.
"""

from __future__ import annotations

import io
import os

import numpy as np
import pytest

datasets = pytest.importorskip("datasets")
pa = pytest.importorskip("pyarrow")
torch = pytest.importorskip("torch")
from PIL import Image  # noqa: E402

import opt4torch  # noqa: E402
from opt4torch._codec import encode, encoded_size  # noqa: E402

pytestmark = pytest.mark.usefixtures("no_leaked_pools")

N = 48
NAMES = ["cat", "dog", "eel"]


def _jpeg(i: int) -> bytes:
    # Smooth gradients with a little noise: as photographs, JPEG keeps them
    # in several times fewer bytes than their pixels.
    rng = np.random.default_rng(i)
    h, w = 64 + (i * 7) % 40, 80 + (i * 5) % 30
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([x * 3 + i, y * 2 + 2 * i, (x + y) + 5 * i], axis=-1)
    pixels = ((base + rng.integers(0, 8, size=(h, w, 3))) % 256).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG", quality=90)
    return out.getvalue()


@pytest.fixture(scope="module")
def hub_dataset(tmp_path_factory: pytest.TempPathFactory) -> datasets.Dataset:
    """Hub-style Parquet, written by datasets and loaded by it (memory-mapped Arrow)."""
    root = tmp_path_factory.mktemp("hf")
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=NAMES),
                                  "tags": datasets.Sequence(datasets.Value("int32")),
                                  "caption": datasets.Value("string")})
    ds = datasets.Dataset.from_dict(
        {"image": [{"bytes": _jpeg(i), "path": None} for i in range(N)],
         "label": [i % 3 for i in range(N)],
         "tags": [list(range(i % 5)) for i in range(N)],
         "caption": [f"picture {i} " + "x" * (i % 7) for i in range(N)]}, features=features)
    ds.to_parquet(os.fspath(root / "train.parquet"))
    loaded = datasets.load_dataset("parquet", data_files=os.fspath(root / "train.parquet"), split="train",
                                   cache_dir=os.fspath(root / "cache"))
    assert loaded.features == features
    return loaded


def same(a, b) -> bool:
    """Equal as a user would check: same types all the way down, PIL images
    by mode, size and pixels, tensors and arrays by dtype, shape and values."""
    if type(a) is not type(b):
        return False
    if isinstance(a, Image.Image):
        return a.mode == b.mode and a.size == b.size and a.tobytes() == b.tobytes()
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and bool(torch.equal(a, b))
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and bool(np.array_equal(a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return bool(a == b)


def _flip(batch: dict) -> dict:
    """A set_transform function (module level: spawned workers unpickle it)."""
    return {"image": [img.transpose(Image.FLIP_LEFT_RIGHT) for img in batch["image"]],
            "label": [lab + 100 for lab in batch["label"]]}


def _variant(ds: datasets.Dataset, name: str) -> datasets.Dataset:
    if name == "plain":
        return ds
    if name == "torch":
        return ds.with_format("torch")
    if name == "numpy":
        return ds.with_format("numpy", columns=["image", "label"], output_all_columns=True)
    if name == "transform":
        return ds.with_transform(_flip)
    if name == "columns":
        return ds.select_columns(["label", "caption"]).shuffle(seed=3)
    raise AssertionError(name)


def run(ds, *, workers: int, context: str | None, epochs: int = 2, sampler=None, **kw) -> dict:
    loader = opt4torch.DataLoader(ds, batch_size=4, shuffle=None if sampler is not None else True,
                                  sampler=sampler, seed=None if sampler is not None else 5,
                                  num_workers=workers, multiprocessing_context=context, epochs=epochs,
                                  collate_fn=list, **kw)
    try:
        seq = loader.cache.plan.seq
        t = 0
        for epoch in range(epochs):
            if sampler is not None:
                sampler.set_epoch(epoch)
            for batch in loader:
                for got in batch:
                    want = ds[int(seq[t])]
                    assert same(got, want), f"position {t}: {got!r} != {want!r}"
                    t += 1
        assert t == len(seq)
        st = loader.cache.stats()
        assert st["hits"] == st["plan_hits"] > 0, st
        assert st["fallbacks"] == 0 and st["timeouts"] == 0, st
        return st
    finally:
        loader.cache.close()


@pytest.mark.timeout(240)
@pytest.mark.parametrize("variant", ["plain", "torch", "numpy", "transform", "columns"])
def test_every_sample_equals_ds_i_with_fork_workers(hub_dataset, variant: str) -> None:
    run(_variant(hub_dataset, variant), workers=2, context="fork", cache_items=N // 3)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("variant", ["plain", "transform"])
def test_every_sample_equals_ds_i_with_spawn_workers(hub_dataset, variant: str) -> None:
    run(_variant(hub_dataset, variant), workers=2, context="spawn", cache_items=N // 3)


@pytest.mark.timeout(240)
def test_in_bytes_half_the_encoded_rows_get_opts_hits(hub_dataset) -> None:
    """cache_bytes half of the rows' encoded bytes: planned in bytes over the
    rows' sizes (HFDataset.opt4_item_bytes), hits exactly the plan's, with
    the misses loaded ahead by the prefetcher's threads."""
    rows = opt4torch.HFDataset(hub_dataset)
    total = int(rows.item_sizes().sum())
    st = run(hub_dataset, workers=2, context="fork", cache_bytes=total // 2, prefetch=True, prefetch_threads=2)
    assert st["plan_hits"] > 0


@pytest.mark.timeout(240)
def test_distributed_sampler(hub_dataset) -> None:
    """Each rank's DistributedSampler order, as it is given under torchrun."""
    for rank in range(2):
        sampler = torch.utils.data.DistributedSampler(hub_dataset, num_replicas=2, rank=rank, seed=9)
        run(hub_dataset, workers=1, context="fork", sampler=sampler, cache_items=N // 4)


def test_a_cached_row_is_the_jpeg_not_its_pixels(hub_dataset) -> None:
    """What is cached for a row: its JPEG as stored, plus the Arrow header
    and the other columns; against the decoded pixels (with_format('torch'),
    what the cache held before) it is many times smaller."""
    rows = opt4torch.HFDataset(hub_dataset)
    decoded = hub_dataset.with_format("torch")
    for i in (0, 7, 31):
        blob = rows[i]
        jpeg = hub_dataset.data.column("image")[i]["bytes"].as_py()
        assert jpeg in blob
        overhead = encoded_size(encode(blob)) - len(jpeg)
        assert 0 < overhead < 1024, overhead
        pixels = encoded_size(encode(decoded[i]))
        assert pixels > 3 * encoded_size(encode(blob)), (pixels, len(blob))
        assert same(rows.format(blob), hub_dataset[i])


def test_streaming_is_refused_saying_what_to_do(hub_dataset) -> None:
    stream = hub_dataset.to_iterable_dataset()
    with pytest.raises(TypeError, match="map-style") as err:
        opt4torch.DataLoader(stream, batch_size=2, cache_items=4)
    assert "opt4torch.Parquet" in str(err.value) and "streaming" in str(err.value)
