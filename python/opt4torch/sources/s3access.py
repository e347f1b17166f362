"""The object store's access, shared by its datasets: the client
(s3torchconnector, imported once, with its fork hook), where the store is
and who asks (endpoint, region, static credentials as boto3 finds them),
``s3://`` URLs, the read counters every process of a loader shares, and
:class:`ObjectStoreError`.

May touch: the environment and the shared credentials file (read), the
client module (imported); nothing of the store itself.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.context
import os
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["CREDENTIAL_ENV", "INSTALL_HINT", "ObjectStoreError", "client_module", "counts_add", "counts_get",
           "endpoint_of", "folder_of", "new_counts", "one_bucket", "profile_credentials", "refuse_items_past_memory",
           "region_of", "split_object_url", "split_url", "static_credentials"]

#: What to install when the client is missing.
INSTALL_HINT = "pip install 's3torchconnector>=1.5,<1.6'  (or: pip install 'opt4torchdataset[s3]')"


class ObjectStoreError(OSError):
    """A request to the object store failed: the message names the request,
    the object, the endpoint and what the store or the client said."""


_fork_hook_lock = threading.Lock()
_fork_hook_installed = False


def client_module() -> Any:
    """s3torchconnector's client, imported on first use, with the fork order
    fixed (see below)."""
    global _fork_hook_installed
    try:
        from s3torchconnector._s3client import S3Client, S3ClientConfig
        from s3torchconnectorclient import S3Exception
    except ImportError as exc:
        raise ImportError(f"opt4torch.S3ImageFolder needs the S3 client s3torchconnector: {INSTALL_HINT}") from exc
    with _fork_hook_lock:
        if not _fork_hook_installed:
            # s3torchconnector, before every fork, drops its native clients
            # and joins the runtime's threads. Its hook was registered at its
            # import, after opt4torch's (io/forksafe.py), and before-fork hooks
            # run newest first: so it would run while our C prefetch threads
            # may still be inside a GET. This hook, registered after it, runs
            # before it and parks those threads first (each finishes the call
            # it is in); opt4torch's own hook then finds them parked.
            from .. import _engine

            os.register_at_fork(before=_engine.prefetchers_park, after_in_parent=_engine.prefetchers_resume)
            _fork_hook_installed = True
    return S3Client, S3ClientConfig, S3Exception


#: The environment the client's credential chain reads, in the process that
#: makes the client. A worker process gets these as the process that pickled
#: the dataset had them (see ObjectDataset.__getstate__).
CREDENTIAL_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                   "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE", "AWS_EC2_METADATA_DISABLED",
                   "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN", "AWS_ROLE_SESSION_NAME",
                   "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI",
                   "AWS_CONTAINER_AUTHORIZATION_TOKEN")


def endpoint_of(explicit: str | None) -> str | None:
    """As boto3 finds it: the argument, else AWS_ENDPOINT_URL_S3, else
    AWS_ENDPOINT_URL, else AWS's own."""
    for value in (explicit, os.environ.get("AWS_ENDPOINT_URL_S3"), os.environ.get("AWS_ENDPOINT_URL")):
        if value:
            return value.rstrip("/")
    return None


def region_of(explicit: str | None) -> str:
    for value in (explicit, os.environ.get("AWS_REGION"), os.environ.get("AWS_DEFAULT_REGION")):
        if value:
            return value
    return "us-east-1"


def profile_credentials(profile: str | None) -> tuple[str, str, str | None] | None:
    """The profile's static keys in the shared credentials file (and the
    config file, where boto3 also looks), or None."""
    import configparser

    name = profile or os.environ.get("AWS_PROFILE") or "default"
    places = [(os.environ.get("AWS_SHARED_CREDENTIALS_FILE") or os.path.join("~", ".aws", "credentials"), name),
              (os.environ.get("AWS_CONFIG_FILE") or os.path.join("~", ".aws", "config"),
               name if name == "default" else f"profile {name}")]
    for path, section in places:
        parser = configparser.RawConfigParser()
        try:
            if not parser.read(os.path.expanduser(path)):
                continue
        except configparser.Error:
            continue
        if parser.has_section(section):
            def get(key: str, p: configparser.RawConfigParser = parser, s: str = section) -> str | None:
                return p.get(s, key, fallback=None) or None

            key, secret = get("aws_access_key_id"), get("aws_secret_access_key")
            if key and secret:
                return key, secret, get("aws_session_token")
    return None


def static_credentials(profile: str | None) -> tuple[str, str, str | None] | None:
    """Static credentials as boto3 finds them first: the environment (unless
    a profile is named), then the profile's in the shared files. None where
    only a provider the C reader lacks would find them (instance role, SSO,
    a process or web-identity provider)."""
    if profile is None:
        key, secret = os.environ.get("AWS_ACCESS_KEY_ID"), os.environ.get("AWS_SECRET_ACCESS_KEY")
        if key and secret:
            return key, secret, os.environ.get("AWS_SESSION_TOKEN") or None
    return profile_credentials(profile)


def split_url(url: str) -> tuple[str, str]:
    if not isinstance(url, str) or not url.startswith("s3://"):
        raise ValueError(f"S3ImageFolder takes an s3://bucket/prefix URL, got {url!r}")
    bucket, _, prefix = url[len("s3://"):].partition("/")
    if not bucket:
        raise ValueError(f"{url!r} names no bucket (expected s3://bucket/prefix)")
    prefix = prefix.strip("/")
    return bucket, prefix + "/" if prefix else ""




def one_bucket(urls: str | Sequence[str], who: str, what: str) -> str:
    """The one bucket of ``urls``, checked before anything is listed: the
    parts as written (a pattern's bucket is not expanded)."""
    buckets = {split_url(u)[0] for u in (urls.split("::") if isinstance(urls, str) else urls)}
    if len(buckets) != 1:
        raise ValueError(f"{who} reads {what} of one bucket, got {', '.join(sorted(buckets))}")
    return buckets.pop()


def folder_of(key: str) -> str:
    """The folder part of a key, with its slash ("" at the top): what is listed."""
    return key.rsplit("/", 1)[0] + "/" if "/" in key else ""


def split_object_url(url: str) -> tuple[str, str]:
    bucket, prefix = split_url(url)
    key = url[len("s3://") + len(bucket) + 1:]
    if not key or key.endswith("/"):
        raise ValueError(f"{url!r} names no object (expected s3://bucket/path/shard-000.tar)")
    return bucket, key


# ---- counters shared by the processes (fork: inherited; spawn: sent) ----



def new_counts() -> Any:
    # Made in the spawn context: a lock made in the fork context refuses to
    # be sent to spawned or forkserver workers; this one is sent to those
    # and inherited by forked ones.
    return multiprocessing.get_context("spawn").Array("q", 3)


def counts_add(counts: Any, reads: int, nbytes: int, requests: int) -> None:
    with counts.get_lock():
        counts[0] += reads
        counts[1] += nbytes
        counts[2] += requests


def counts_get(counts: Any) -> tuple[int, int, int]:
    with counts.get_lock():
        return int(counts[0]), int(counts[1]), int(counts[2])


def refuse_items_past_memory(sizes: np.ndarray, keys: Sequence[str], bucket: str) -> None:
    """Refuse, naming it, an object listed larger than this machine's memory:
    an item is read whole into memory, so the first read of it would end in
    a bare MemoryError (a listing that lies, or the wrong prefix)."""
    if not len(sizes):
        return
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    k = int(np.argmax(sizes))
    if int(sizes[k]) > memory:
        raise ValueError(f"s3://{bucket}/{keys[k]} is listed as {int(sizes[k]):,} bytes, more than this machine's "
                         f"memory ({memory:,} bytes): an item is read whole into memory, so it cannot be one; "
                         "check the prefix, or the store's listing")


# ---- the image-folder layout, from a listing ----

