"""The engine's S3 client against a store that answers wrongly (issue 38,
bugs 2, 4 and 5): the loopback server (bench/s3server.py) made to send a
206 for other bytes than asked, another ETag while ignoring If-Match, a
Content-Length longer than its body, a Content-Range total of a grown
object, a chunked body, and a body trickled at 2 bytes a second; and real
objects replaced after the listing, at the same size and larger. Each read
fails with ObjectStoreError naming the object, or, for the chunked body,
reads right; none returns other bytes, and none waits past its bounds."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import numpy as np
import pytest

pytest.importorskip("s3torchconnector", reason="the object-store tests need s3torchconnector (requirements-dev.txt)")
boto3 = pytest.importorskip("boto3", reason="the object-store tests upload with boto3 (requirements-dev.txt)")
pytest.importorskip("moto", reason="the object-store tests need moto[server] (requirements-dev.txt)")

from opt4torch import _engine  # noqa: E402
from opt4torch.objstore import ObjectStoreError, S3ImageFolder, S3TarShards  # noqa: E402
from s3store import Server, only_these_credentials  # noqa: E402

pytestmark = [pytest.mark.skipif(not _engine.HAVE_S3, reason="this build of the engine has no S3 reader"),
              pytest.mark.usefixtures("no_leaked_pools"), pytest.mark.timeout(120)]

KEY, SECRET, REGION, BUCKET = "opt4-test-key", "opt4-test-secret", "us-east-1", "hostile"


def _body(k: int) -> bytes:
    return bytes((k * 7 + j) % 251 for j in range(3000 + k))


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    s = Server(0.0, KEY, secret=SECRET)
    try:
        client = boto3.client("s3", endpoint_url=s.endpoint, region_name=REGION, aws_access_key_id=KEY,
                              aws_secret_access_key=SECRET)
        client.create_bucket(Bucket=BUCKET)
        for k in range(3):
            client.put_object(Bucket=BUCKET, Key=f"img/c/{k}.jpg", Body=_body(k))
        yield s
    finally:
        s.stop()


@pytest.fixture(autouse=True)
def aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    only_these_credentials(monkeypatch, KEY, SECRET, REGION)


@pytest.fixture
def fault(server: Server) -> Iterator[None]:
    """Whatever a test sets, the server answers rightly again after it."""
    yield
    server.call("set", fault="", trickle=0)


def _reader(server: Server, keys: list[str], rows: list[tuple[int, int, int]], **kw) -> _engine.S3Ranges:
    client = boto3.client("s3", endpoint_url=server.endpoint, region_name=REGION, aws_access_key_id=KEY,
                          aws_secret_access_key=SECRET)
    heads = [client.head_object(Bucket=BUCKET, Key=k) for k in keys]
    return _engine.S3Ranges(server.endpoint, BUCKET, keys, np.asarray(rows, dtype=np.int64), region=REGION,
                            access_key=KEY, secret_key=SECRET, etags=[h["ETag"] for h in heads],
                            sizes=[h["ContentLength"] for h in heads], **kw)


def test_a_206_for_other_bytes_is_refused(server: Server, fault: None) -> None:
    """Bytes 100-299 asked, bytes 0-199 sent (a 206 whose Content-Range says
    so): was served as the sample."""
    r = _reader(server, ["img/c/1.jpg"], [(0, 100, 200)])
    assert r.read(0) == _body(1)[100:300]
    server.call("set", fault="range-from-0")
    with pytest.raises(OSError, match=r"GET s3://hostile/img/c/1.jpg bytes 100-299 .* answered bytes 0-199 came "
                                      r"back where 100-299 were asked for \(Content-Range\)"):
        r.read(0)


def test_another_etag_is_refused_when_the_store_ignores_if_match(server: Server, fault: None) -> None:
    r = _reader(server, ["img/c/0.jpg"], [(0, 0, 3000)])
    server.call("set", fault="etag")
    with pytest.raises(OSError, match=r"img/c/0.jpg .* the object's ETag is now \"0123456789abcdef0123456789abcdef\", "
                                      r"not the \"[0-9a-f]+\" listed: it changed since the dataset was made"):
        r.read(0)


def test_a_grown_object_is_refused_by_its_content_range_total(server: Server, fault: None) -> None:
    r = _reader(server, ["img/c/2.jpg"], [(0, 10, 20)])
    server.call("set", fault="grown-total")
    with pytest.raises(OSError, match=r"img/c/2.jpg .* the object is now 3102 bytes, not the 3002 listed"):
        r.read(0)


def test_a_content_length_over_the_body_is_named_not_called_silence(server: Server, fault: None) -> None:
    """Was reported as 'the store did not answer'."""
    r = _reader(server, ["img/c/1.jpg"], [(0, 0, 3001)], max_attempts=2)
    server.call("set", fault="long-length")
    with pytest.raises(OSError, match=r"img/c/1.jpg .* failed after 2 tries: the answer was cut short .*: the store "
                                      r"announced more bytes than it sent"):
        r.read(0)


def test_a_chunked_body_reads_right(server: Server, fault: None) -> None:
    r = _reader(server, ["img/c/1.jpg", "img/c/2.jpg"], [(0, 0, 3001), (1, 5, 1000)])
    server.call("set", fault="chunked")
    assert r.read(0) == _body(1) and r.read(1) == _body(2)[5:1005]


def test_a_trickling_store_ends_at_the_minimum_rate_and_at_the_deadline(server: Server, fault: None) -> None:
    """2 bytes a second never tripped "60 s without a byte", and a GET had
    no deadline. Now a try slower than min_rate over timeout fails (and is
    tried again), and the GET ends at its deadline, tries included."""
    server.call("set", trickle=2)
    slow = _reader(server, ["img/c/0.jpg"], [(0, 0, 3000)], timeout=1.0, min_rate=100, max_attempts=2,
                   deadline=60.0)
    t0 = time.monotonic()
    with pytest.raises(OSError, match=r"img/c/0.jpg .* failed after 2 tries: Operation too slow.* slower than 100 "
                                      r"bytes a second over 1 s"):
        slow.read(0)
    took = time.monotonic() - t0
    assert 2.0 <= took < 15.0, took  # two 1 s tries; the rest is a loaded 2-core machine's slack
    short = _reader(server, ["img/c/0.jpg"], [(0, 0, 3000)], timeout=30.0, min_rate=1, max_attempts=5,
                    deadline=2.5)
    t0 = time.monotonic()
    with pytest.raises(OSError, match=r"img/c/0.jpg .* did not finish within its deadline of 2.5 s"):
        short.read(0)
    took = time.monotonic() - t0
    assert 2.4 <= took < 10.0, took
    info = short.info()
    assert info["failures"] == 1 and info["reads"] == 0, info


def test_the_dataset_takes_the_waits_and_refuses_nonsense(server: Server, fault: None) -> None:
    ds = S3ImageFolder(f"s3://{BUCKET}/img/", endpoint_url=server.endpoint, client="c", deadline=2.0,
                       timeout=30.0, min_rate=1)
    assert ds[0][0] == _body(0)
    server.call("set", trickle=2)
    ds = S3ImageFolder(f"s3://{BUCKET}/img/", endpoint_url=server.endpoint, client="c", deadline=2.0,
                       timeout=30.0, min_rate=1)
    with pytest.raises(ObjectStoreError, match=r"img/c/0.jpg .* did not finish within its deadline of 2 s"):
        ds[0]
    for bad in ({"deadline": 0}, {"timeout": -1.0}, {"min_rate": 2.5}, {"min_rate": 0}, {"deadline": "5"}):
        with pytest.raises(ValueError, match=f"{next(iter(bad))} must be"):
            S3ImageFolder(f"s3://{BUCKET}/img/", endpoint_url=server.endpoint, **bad)


@pytest.mark.parametrize("size", ["same", "larger"])
def test_an_object_replaced_after_listing_fails_naming_it(server: Server, size: str) -> None:
    """A real replacement (a PUT after the listing): at the same size (was:
    the new bytes served), and larger (was: its old-length prefix). The GET
    sends the listed ETag as If-Match, and the store refuses it."""
    client = boto3.client("s3", endpoint_url=server.endpoint, region_name=REGION, aws_access_key_id=KEY,
                          aws_secret_access_key=SECRET)
    key = f"swap-{size}/c/0.jpg"
    client.put_object(Bucket=BUCKET, Key=key, Body=b"a" * 500)
    ds = S3ImageFolder(f"s3://{BUCKET}/swap-{size}/", endpoint_url=server.endpoint, client="c")
    client.put_object(Bucket=BUCKET, Key=key, Body=b"b" * (500 if size == "same" else 800))
    with pytest.raises(ObjectStoreError, match=rf"GET s3://hostile/{key} bytes 0-499 .* HTTP 412 PreconditionFailed"
                                               r": its ETag is no longer the one listed"):
        ds[0]


def _tar(fill: int) -> bytes:
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for i in range(3):
            ti = tarfile.TarInfo(f"s{i}.bin")
            ti.size = 700
            tf.addfile(ti, io.BytesIO(bytes([fill + i]) * 700))
    return buf.getvalue()


def test_a_shard_replaced_after_listing_fails_naming_it(server: Server, tmp_path) -> None:
    """S3TarShards: a shard replaced at the same size after its listing and
    indexing; the samples' GETs carry its ETag (was: new bytes at the old
    offsets)."""
    client = boto3.client("s3", endpoint_url=server.endpoint, region_name=REGION, aws_access_key_id=KEY,
                          aws_secret_access_key=SECRET)
    client.put_object(Bucket=BUCKET, Key="shards/a.tar", Body=_tar(1))
    ds = S3TarShards(f"s3://{BUCKET}/shards/a.tar", endpoint_url=server.endpoint, client="c", cache_dir=tmp_path)
    assert ds[1]["bin"] == b"\x02" * 700
    client.put_object(Bucket=BUCKET, Key="shards/a.tar", Body=_tar(50))
    with pytest.raises(ObjectStoreError, match=r"GET s3://hostile/shards/a.tar bytes \d+-\d+ .* HTTP 412"):
        ds[1]


def test_an_object_listed_as_1_tib_is_refused_at_construction(server: Server, fault: None) -> None:
    """Was a bare MemoryError at the first read."""
    server.call("set", fault="huge-listing")
    with pytest.raises(ValueError, match=r"s3://hostile/img/c/\d.jpg is listed as 1,099,511,627,776 bytes, more "
                                         r"than this machine's memory"):
        S3ImageFolder(f"s3://{BUCKET}/img/", endpoint_url=server.endpoint, client="c")


def _make_ca_and_server_cert(folder) -> tuple[str, str, str, str]:
    """A CA made for the test, a certificate it signs for 127.0.0.1, and a
    second CA that signs nothing here: (ca.pem, other-ca.pem, cert.pem, key.pem)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)

    def ca(name: str):
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
                .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
                .not_valid_after(now + datetime.timedelta(days=2))
                .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                .sign(key, hashes.SHA256()))
        return key, cert

    ca_key, ca_cert = ca("opt4 test CA")
    _, other_cert = ca("opt4 other CA")
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
            .issuer_name(ca_cert.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    paths = [os.path.join(folder, n) for n in ("ca.pem", "other-ca.pem", "cert.pem", "key.pem")]
    for path, data in zip(paths, (ca_cert.public_bytes(serialization.Encoding.PEM),
                                  other_cert.public_bytes(serialization.Encoding.PEM),
                                  cert.public_bytes(serialization.Encoding.PEM),
                                  key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                    serialization.NoEncryption()))):
        with open(path, "wb") as f:
            f.write(data)
    return paths[0], paths[1], paths[2], paths[3]


def test_https_is_verified_against_the_ca_bundle_given(tmp_path) -> None:
    """The loopback server behind TLS with a certificate from a CA made for
    the test: read with ca_bundle=that CA; refused, naming why and not tried
    again, against the system's CAs, another CA, or a bundle that is not PEM."""
    ca, other, cert, key = _make_ca_and_server_cert(os.fspath(tmp_path))
    with Server(0.0, KEY, secret=SECRET, tls=(cert, key)) as tls:
        assert tls.endpoint.startswith("https://127.0.0.1:")
        client = boto3.client("s3", endpoint_url=tls.endpoint, region_name=REGION, aws_access_key_id=KEY,
                              aws_secret_access_key=SECRET, verify=ca)
        client.create_bucket(Bucket=BUCKET)
        client.put_object(Bucket=BUCKET, Key="t/c/0.jpg", Body=_body(0))
        rows = np.asarray([(0, 10, 500)], dtype=np.int64)

        def reader(bundle: str | None) -> _engine.S3Ranges:
            return _engine.S3Ranges(tls.endpoint, BUCKET, ["t/c/0.jpg"], rows, region=REGION, access_key=KEY,
                                    secret_key=SECRET, ca_bundle=bundle)

        assert reader(ca).read(0) == _body(0)[10:510]
        for bundle, why in ((None, "not one the system's CAs vouch for; give the CA that signed it"),
                            (other, "not one the CA bundle given \\(ca_bundle\\) vouches for"),
                            (key, "the CA bundle given \\(ca_bundle\\) cannot be read as PEM certificates")):
            r = reader(bundle)
            with pytest.raises(OSError, match=rf"GET s3://hostile/t/c/0.jpg bytes 10-509 at {tls.endpoint}: .*{why}"):
                r.read(0)
            assert r.info()["requests"] == 1, "a certificate that fails is not tried again"
    with pytest.raises(FileNotFoundError, match="ca_bundle '/nonexistent.pem' is not a file"):
        S3ImageFolder(f"s3://{BUCKET}/t/", endpoint_url="https://127.0.0.1:9", ca_bundle="/nonexistent.pem")


def test_a_307_is_followed_and_signed_again_for_its_host(server: Server, fault: None) -> None:
    """AIStore balances its S3 API with 307s, which s3torchconnector does not
    follow. The server sends each GET on to itself under another host name
    (localhost) with a query; it checks every signature again (botocore), so
    the read works only if the client signed the new host, path and query."""
    r = _reader(server, ["img/c/1.jpg"], [(0, 7, 100)])
    server.call("set", fault="redirect")
    before = server.stats()
    assert r.read(0) == _body(1)[7:107]
    after = server.stats()
    assert after["requests"] - before["requests"] == 2 and after["bad_signatures"] == before["bad_signatures"]
    assert r.info()["retries"] == 0
    server.call("set", fault="redirect-loop")
    with pytest.raises(OSError, match=r"img/c/1.jpg bytes 7-106 .* HTTP 307: redirected more than 3 times"):
        r.read(0)
    assert r.info()["requests"] == 2 + 4  # the first try and three redirects, then refused
    server.call("set", fault="redirect-relative")
    assert r.read(0) == _body(1)[7:107]  # a path: libcurl resolves it against the URL asked


def test_virtual_hosted_addressing_against_the_server(server: Server) -> None:
    """path_style=False: the bucket in the host name (bucket.localhost:port,
    which libcurl resolves to the loopback without DNS), signed for that
    host; the server serves the bucket from the Host header and checks the
    signature again."""
    port = server.endpoint.rsplit(":", 1)[1]
    r = _engine.S3Ranges(f"http://localhost:{port}", BUCKET, ["img/c/2.jpg"], np.asarray([(0, 3, 50)], dtype=np.int64),
                         region=REGION, access_key=KEY, secret_key=SECRET, path_style=False)
    assert f"http://{BUCKET}.localhost:{port}" in r.info()["note"] and "virtual-hosted" in r.info()["note"]
    before = server.stats()
    assert r.read(0) == _body(2)[3:53]
    after = server.stats()
    assert after["gets"] - before["gets"] == 1 and after["bad_signatures"] == before["bad_signatures"]


def test_checksum_catches_a_replacement_no_header_shows(server: Server, fault: None, tmp_path) -> None:
    """S3TarShards(checksum=True): a shard replaced at the same size, served
    by a store that ignores If-Match and sends no ETag, so every header
    check passes. Without checksums the engine's GET returns the new bytes
    (the wrong sample); with them it fails naming the sample and the object.
    s3torchconnector's GETs, which can send no If-Match at all, are checked
    the same way, in Python (no fault needed)."""
    client = boto3.client("s3", endpoint_url=server.endpoint, region_name=REGION, aws_access_key_id=KEY,
                          aws_secret_access_key=SECRET)
    client.put_object(Bucket=BUCKET, Key="sums/a.tar", Body=_tar(1))
    url = f"s3://{BUCKET}/sums/a.tar"
    plain = S3TarShards(url, endpoint_url=server.endpoint, client="c", cache_dir=tmp_path)
    checked = S3TarShards(url, endpoint_url=server.endpoint, client="c", cache_dir=tmp_path, checksum=True)
    viaconn = S3TarShards(url, endpoint_url=server.endpoint, client="s3torchconnector", cache_dir=tmp_path,
                          checksum=True)
    assert checked[1]["bin"] == viaconn[1]["bin"] == b"\x02" * 700
    client.put_object(Bucket=BUCKET, Key="sums/a.tar", Body=_tar(50))
    with pytest.raises(ObjectStoreError, match=r"sample 1 \('s1', 700 bytes at \d+ of s3://hostile/sums/a.tar\) .*"
                                               r"does not match the checksum recorded when it was indexed"):
        viaconn[1]
    server.call("set", fault="no-etag")
    assert plain[1]["bin"] == b"\x33" * 700  # what the headers cannot tell: the new bytes, served
    with pytest.raises(ObjectStoreError, match=r"item 1 \(700 bytes of s3://hostile/sums/a.tar\) does not match "
                                               r"the checksum recorded when it was indexed"):
        checked[1]


def test_image_folder_checksums_catch_a_replacement(server: Server, fault: None) -> None:
    """S3ImageFolder(checksum=True): each object fetched once at construction
    (index_bytes, not counted as reads), then checked at every read. An
    object replaced at the same size is refused on s3torchconnector's GETs
    (which send no If-Match) and, with a store that ignores If-Match and
    sends no ETag, on the engine's; without checksums the engine's GET then
    returns the new bytes."""
    client = boto3.client("s3", endpoint_url=server.endpoint, region_name=REGION, aws_access_key_id=KEY,
                          aws_secret_access_key=SECRET)
    for i in range(3):
        client.put_object(Bucket=BUCKET, Key=f"isums/c/{i}.jpg", Body=bytes([i]) * 500)
    url = f"s3://{BUCKET}/isums/"
    plain = S3ImageFolder(url, endpoint_url=server.endpoint, client="c")
    checked = S3ImageFolder(url, endpoint_url=server.endpoint, client="c", checksum=True)
    viaconn = S3ImageFolder(url, endpoint_url=server.endpoint, client="s3torchconnector", checksum=True)
    for ds in (checked, viaconn):
        assert ds.info()["index_bytes"] == 1500 and ds.info()["reads"] == 0
    assert checked[1] == viaconn[1] == (b"\x01" * 500, 0)
    client.put_object(Bucket=BUCKET, Key="isums/c/1.jpg", Body=b"\x07" * 500)
    with pytest.raises(ObjectStoreError, match=r"item 1 \(s3://hostile/isums/c/1.jpg, 500 bytes\) .*does not match "
                                               r"the checksum recorded when it was indexed"):
        viaconn[1]
    server.call("set", fault="no-etag")
    assert plain[1] == (b"\x07" * 500, 0)  # what the headers cannot tell: the new bytes, served
    with pytest.raises(ObjectStoreError, match=r"item 1 \(500 bytes of s3://hostile/isums/c/1.jpg\) does not match "
                                               r"the checksum recorded when it was indexed"):
        checked[1]
    assert checked[2] == (b"\x02" * 500, 0)  # the others still read
