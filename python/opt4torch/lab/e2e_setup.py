"""The end-to-end comparison's configurations, samplers and one run's parameters (:class:`Setup`):
what bench/e2e.py's options set (docs/e2e.md).
May touch: nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["CONFIGS", "CACHETOOLS", "PEERS", "S3_ONLY", "ALL_CONFIGS", "OPT_CONFIGS", "SAMPLERS", "Setup"]


#: The configurations, in the order the tables list them.
CONFIGS = (
    "no cache",
    "LRU (cachetools)",
    "LFU (cachetools)",
    "FIFO (cachetools)",
    "RR (cachetools)",
    "shared LRU",
    "static",
    "OPT",
    "OPT + prefetch",
    "in memory",
)
CACHETOOLS = {"LRU (cachetools)": "LRUCache", "LFU (cachetools)": "LFUCache",
              "FIFO (cachetools)": "FIFOCache", "RR (cachetools)": "RRCache"}
#: The real alternatives (:mod:`.peers`: MosaicML Streaming, LitData,
#: OPT4TorchDataSet v1.1.0 and this package's compat layer for its API); not
#: in the default list: they need packages the demo does not install.
PEERS = ("Streaming", "Streaming (tuned)", "LitData", "OPT4TorchDataSet v1.1.0", "OPT4TorchDataSet API (compat)")
#: Over the object store only: OPT + prefetch with the GETs made by
#: s3torchconnector through the prefetcher's Python callback, beside the
#: default (the engine's own GETs in C), for what the client costs.
S3_ONLY = ("OPT + prefetch (s3torchconnector)",)
ALL_CONFIGS = CONFIGS + PEERS + S3_ONLY
#: The configurations that are opt4torch.DataLoader.
OPT_CONFIGS = ("OPT", "OPT + prefetch", "OPT + prefetch (s3torchconnector)")
#: Sampling: epoch shuffle, uniform with replacement, class-balanced weighted.
SAMPLERS = ("shuffle", "replacement", "balanced")


@dataclass
class Setup:
    """One run's parameters (bench/e2e.py's options)."""

    images: int = 1000
    classes: int = 10
    image_size: int = 80          # generated images are image_size x image_size JPEGs
    image_size_max: int = 0       # > image_size: each image's side is drawn from [image_size, image_size_max]
    crop: int = 64                # random crop the model sees
    epochs: int = 3
    batch: int = 64
    workers: int = 2
    capacity: float = 0.5         # cache size as a share of the images (items)
    latency: float = 0.005        # seconds per read, before bandwidth
    bandwidth: float = 100e6      # bytes/s of one read, folded into the latency
    direct: bool = True
    threads: int = 32             # prefetch threads
    lookahead: int = 4096
    repeats: int = 3
    seed: int = 0
    configs: list[str] = field(default_factory=lambda: list(CONFIGS))
    samplers: list[str] = field(default_factory=lambda: list(SAMPLERS))
    v11_src: str = ""             # a checkout of OPT4TorchDataSet v1.1.0 (the "OPT4TorchDataSet v1.1.0" peer)
    shard_bytes: int = 0          # Streaming's and LitData's shard size (0: theirs, smaller for a small budget)
    progress: bool = False        # a tqdm bar per configuration run (batches)
    store: str = "file"           # "file": the record file, costs emulated in C; "s3": the S3 server's objects
    s3_endpoint: str = ""         # with store="s3": the server's URL (bench/e2e.py starts it)
    s3_server_pid: int = 0        # ... and its process, for its CPU time
    link: float = 0.0             # with store="s3": bytes/s of the server's one shared link (0: none)
    train_cpus: str = ""          # the CPUs the training process (and all it starts) ran on ("": all)
    server_cpus: str = ""         # with store="s3": the CPUs the server ran on ("": all)
    moto_gets: bool = False       # with store="s3": every GET answered by moto (no object copies: s3server.py)
    format: str = "records"       # "parquet": the same JPEGs as Hub-style Parquet shards (.e2e_parquet)
    parquet_shards: int = 4       # with format="parquet": the shards datasets writes
    small_row_group: int = 8      # ... and the rows a row group of their rewrite by pyarrow

    @property
    def capacity_items(self) -> int:
        return max(1, int(round(self.capacity * self.images)))
