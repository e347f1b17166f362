"""Datasets kept in an S3-compatible object store, read in place by
byte-range GETs: an image folder (:class:`S3ImageFolder`) and WebDataset
tar shards (:class:`S3TarShards`).

:class:`S3ImageFolder` is :class:`opt4torch.ImageFolder` for objects: the
objects under ``s3://bucket/prefix/`` laid out as an image folder
(``prefix/<class>/**/<file>``), classes, labels and order as torchvision
numbers a folder, ``ds[i] == (bytes, label)``. The objects are listed once,
at construction (one LIST, paged, never a HEAD per object), which gives
every item's size, so the cache plans in bytes. Each read is one ranged GET
of the whole object.

Two clients, one protocol. The listing (and a tar shard's one-time fetch
for its index) is ``s3torchconnector``'s (AWS's connector for PyTorch, on the
AWS Common Runtime), an optional dependency (``pip install
opt4torchdataset[s3]``). The items' GETs are the engine's own where it can
(``client="auto"``, the default): ranged GETs made in C with libcurl, signed
there (``_engine.S3Ranges``, src/source/s3.c), so the C prefetch threads load
misses with no Python and no GIL on the path, at a fraction of the CPU a GET
costs through a Python client (docs/dependencies.md has the measurements).
It signs with static credentials, found as boto3 finds them: the
environment (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_SESSION_TOKEN``), then the profile's in the shared credentials file,
or none (``unsigned=True``). Where those are not there (an instance role,
SSO), or the engine was built without libcurl, or ``latency`` is set, the
GETs are s3torchconnector's too, through the prefetcher's Python callback;
``client="s3torchconnector"`` asks for that, ``client="c"`` refuses to fall
back. ``info()["client"]`` says which one reads.

:class:`S3TarShards` is :class:`opt4torch.TarShards` for shards kept as
objects: each shard is indexed once by the same C indexer (one GET of the
whole shard into a temporary file), the index cached in the same JSON format
(checked against the object's size and ETag), and each sample is then one
ranged GET.

docs/sources.md, "The object store", has the details.

The code is in four modules: ``s3access`` (the client, credentials, URLs,
counters), ``s3objects`` (what the datasets share), ``s3images`` and
``s3tars``; this one is the name users and the rest of the package import.

May touch: nothing itself (see the four modules).
"""


from __future__ import annotations

from .s3access import ObjectStoreError, folder_of, one_bucket, split_object_url
from .s3images import S3ImageFolder
from .s3objects import ObjectDataset
from .s3tars import S3TarShards

__all__ = ["S3ImageFolder", "S3TarShards", "ObjectStoreError", "ObjectDataset", "folder_of", "one_bucket",
           "split_object_url"]
