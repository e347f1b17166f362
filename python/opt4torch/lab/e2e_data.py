"""The end-to-end comparison's data: generated JPEGs in the ImageFolder layout,
packed into one record file, and (``Setup.store == "s3"``) uploaded to the
loopback S3 server with the peers' shards.
May touch: the data folder it is given, the S3 server it is given.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from .e2e_setup import Setup

__all__ = ["make_image_folder", "prepare_data", "S3_BUCKET", "upload_s3"]


# ---- the data ----


def _class_sizes(n: int, classes: int) -> list[int]:
    """Unequal classes (sizes proportional to 1/(k+1)), so class-balanced
    sampling draws the small classes' images more often."""
    w = np.array([1.0 / (k + 1) for k in range(classes)])
    sizes = np.floor(w / w.sum() * n).astype(int)
    sizes = np.maximum(sizes, 1)
    sizes[0] += n - int(sizes.sum())
    return [int(s) for s in sizes]


def make_image_folder(root: str, n: int, classes: int, size: int, seed: int, size_max: int = 0,
                      progress: bool = False) -> None:
    """``root/class_k/img_i.jpg``: each class a colour and a stripe direction,
    with noise, so the CNN has something to learn. With ``size_max > size``
    each image is square with a side drawn uniformly from ``[size, size_max]``
    (160 to 400 pixels give JPEGs of 15 to 97 KB, mean 51 KB: within the
    10-100 KiB of ImageNet's typical files)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    big = max(size, size_max)
    y, x = np.mgrid[0:big, 0:big].astype(np.float32)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=n, desc="generating JPEGs", unit="img")
    i = 0
    for k, count in enumerate(_class_sizes(n, classes)):
        d = os.path.join(root, f"class_{k:02d}")
        os.makedirs(d, exist_ok=True)
        colour = rng.uniform(40, 215, size=3).astype(np.float32)
        angle = math.pi * k / classes
        stripes_all = np.sin((x * math.cos(angle) + y * math.sin(angle)) / 3.0)[..., None]
        for _ in range(count):
            side = int(rng.integers(size, size_max + 1)) if size_max > size else size
            stripes = stripes_all[:side, :side]
            noise = rng.normal(0, 25, size=(side, side, 3)).astype(np.float32)
            shift = rng.uniform(-30, 30, size=3).astype(np.float32)
            img = np.clip(colour + shift + 40 * stripes + noise, 0, 255).astype(np.uint8)
            Image.fromarray(img).save(os.path.join(d, f"img_{i:06d}.jpg"), quality=90)
            i += 1
            if bar is not None:
                bar.update(1)
    if bar is not None:
        bar.close()


def prepare_data(data_dir: str, setup: Setup, log: Callable[[str], None] = print) -> str:
    """The record file for ``setup`` in ``data_dir`` (made once: reused when
    its description matches)."""
    from ..sources.records import image_folder_to_records

    os.makedirs(data_dir, exist_ok=True)
    desc = {"images": setup.images, "classes": setup.classes, "image_size": setup.image_size,
            "seed": setup.seed, "version": 1}
    px = f"{setup.image_size}px"
    if setup.image_size_max > setup.image_size:
        desc["image_size_max"] = setup.image_size_max
        px = f"{setup.image_size}-{setup.image_size_max}px"
    path = os.path.join(data_dir, f"images-{setup.images}-{px}.rec")
    stamp = path + ".made"
    if os.path.exists(path) and os.path.exists(stamp):
        with open(stamp) as f:
            if json.load(f) == desc:
                return path
    t0 = time.perf_counter()
    root = os.path.join(data_dir, f"images-{setup.images}-{px}")
    if os.path.isdir(root):
        import shutil

        shutil.rmtree(root)
    make_image_folder(root, setup.images, setup.classes, setup.image_size, setup.seed, setup.image_size_max,
                      progress=setup.progress)
    image_folder_to_records(root, path, progress=setup.progress)
    with open(stamp, "w") as f:
        json.dump(desc, f)
    log(f"generated {setup.images:,} JPEGs of {px} in {setup.classes} classes "
        f"under {root}/ and packed them into {path} ({time.perf_counter() - t0:.1f} s)")
    return path


# ---- the object store (store="s3") ----

#: The bucket on the S3 server; the images are under ``images/``.
S3_BUCKET = "opt4-e2e"


def s3_client(setup: Setup) -> Any:
    import boto3

    return boto3.client("s3", endpoint_url=setup.s3_endpoint)


def s3_stats(setup: Setup, what: str = "stats") -> dict[str, Any]:
    """The server's counters (bench/s3server.py's ``/_opt4/`` paths)."""
    import urllib.request

    req = urllib.request.Request(f"{setup.s3_endpoint}/_opt4/{what}", method="GET" if what == "stats" else "POST")
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def proc_cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _image_key(i: int, label: int) -> str:
    # Classes sorted by name, files by name within: S3ImageFolder's order is
    # the record file's (which is ImageFolder's: labels never decrease).
    return f"images/c{label:04d}/{i:08d}.jpg"


def upload_s3(path: str, setup: Setup, prepared: dict[str, dict[str, Any]],
              log: Callable[[str], None] = print) -> None:
    """Put the record file's images, and the peers' converted shards, on the
    S3 server (not timed with training): ``prepared[peer]["s3_url"]`` is where
    a peer's shards went."""
    from concurrent.futures import ThreadPoolExecutor

    from ..sources.records import RecordFile

    t0 = time.perf_counter()
    client = s3_client(setup)
    client.create_bucket(Bucket=S3_BUCKET)
    rf = RecordFile(path)
    labels = rf.labels
    if np.any(np.diff(labels) < 0):
        raise ValueError(f"{path}: labels decrease along the records; the S3 layout would reorder the items")
    puts: list[tuple[str, Any]] = [(_image_key(i, int(labels[i])), i) for i in range(len(rf))]
    for name, p in prepared.items():
        if "dir" in p and name in _sharded():
            prefix = os.path.basename(p["dir"])
            for root, _, files in os.walk(p["dir"]):
                for f in files:
                    full = os.path.join(root, f)
                    puts.append((f"{prefix}/{os.path.relpath(full, p['dir'])}", full))
            p["s3_url"] = f"s3://{S3_BUCKET}/{prefix}"

    def put(job: tuple[str, Any]) -> int:
        key, what = job
        if isinstance(what, str):
            with open(what, "rb") as f:
                body = f.read()
        else:
            body = rf[int(what)][0]
        client.put_object(Bucket=S3_BUCKET, Key=key, Body=body)
        return len(body)

    with ThreadPoolExecutor(8) as ex:
        total = sum(ex.map(put, puts))
    rf.close()
    log(f"put {len(puts):,} objects ({total / 1e6:,.1f} MB) on the S3 server at {setup.s3_endpoint} "
        f"({time.perf_counter() - t0:.1f} s)")


def _sharded() -> tuple[str, ...]:
    from .peers import SHARDED

    return tuple(SHARDED)


class S3Images:
    """The harness's view of the images on the S3 server: an
    :class:`opt4torch.S3ImageFolder` (``.dataset``, what the loaders read),
    checked against the record file (the same items, sizes and labels)."""

    def __init__(self, path: str, setup: Setup) -> None:
        from ..sources.records import RecordFile
        from ..sources.s3 import S3ImageFolder

        self.dataset = S3ImageFolder(f"s3://{S3_BUCKET}/images/", endpoint_url=setup.s3_endpoint)
        self._by_client = {"auto": self.dataset}
        plain = RecordFile(path)
        sizes, self.labels = plain.item_sizes(), plain.labels
        plain.close()
        if not (np.array_equal(sizes, self.dataset.item_sizes())
                and np.array_equal(self.labels, np.asarray(self.dataset.targets))):
            raise RuntimeError(f"the objects under s3://{S3_BUCKET}/images/ are not {path}'s records "
                               "(sizes or labels differ): upload them again (upload_s3)")
        self.endpoint = setup.s3_endpoint

    def __len__(self) -> int:
        return len(self.dataset)

    def dataset_for(self, client: str) -> Any:
        """The images through another client (``client=`` of S3ImageFolder)."""
        if client not in self._by_client:
            from ..sources.s3 import S3ImageFolder

            self._by_client[client] = S3ImageFolder(f"s3://{S3_BUCKET}/images/", endpoint_url=self.endpoint,
                                                    client=client)
        return self._by_client[client]

    def __getitem__(self, i: int) -> Any:
        return self.dataset[i]

    def item_sizes(self) -> np.ndarray:
        return self.dataset.item_sizes()

    def info(self) -> dict[str, Any]:
        out = {**self.dataset.info(), "note": f"opt4torch.S3ImageFolder, one GET an image from {self.endpoint}"}
        for ds in self._by_client.values():  # reads through every client's dataset
            if ds is not self.dataset:
                more = ds.info()
                out.update(reads=out["reads"] + more["reads"], bytes_read=out["bytes_read"] + more["bytes_read"])
        return out

    def close(self) -> None:
        pass
