"""The S3 blob store against a real S3 server (SeaweedFS): the tests of tests/unit/test_store.py that take a
`store` (the unit tier runs them on a local directory), and what only S3 has: presigned URLs, prefixes,
refused or missing credentials, an unreachable endpoint."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import httpx
import pytest

from tests.fixtures.services import S3Server, free_port
from tests.unit.test_store import (  # noqa: F401 (pytest collects what is imported)
    pytestmark,
    test_a_copy_of_another_size_is_replaced,
    test_a_file_that_does_not_match_its_sha256_is_not_stored,
    test_documents,
    test_documents_are_deleted,
    test_large_file,
    test_round_trip,
    test_second_put_of_the_same_blob_does_not_write,
    test_verify_reads_the_copy_back,
    write,
)
from warmup.errors import StoreError, StoreUnreachableError
from warmup.store import BlobStore, LocalBlobStore, S3BlobStore, open_store


@pytest.fixture(params=["s3"])
def store(s3_bucket: str) -> BlobStore:
    return S3BlobStore(s3_bucket, "cache/v1")  # endpoint and credentials from the AWS environment


# --- S3 only -----------------------------------------------------------------------------------


def test_presigned_url_downloads_without_credentials(s3_bucket: str, tmp_path: Path) -> None:
    store = S3BlobStore(s3_bucket)
    path, sha = write(tmp_path / "graph.neff", 200_000)
    store.put_file(path, sha)
    url = store.presigned_url(sha, expires_s=600)
    assert "X-Amz-Expires=600" in url
    response = httpx.get(url, timeout=30)
    assert response.status_code == 200
    assert hashlib.sha256(response.content).hexdigest() == sha
    # Tampering with the signed request is refused.
    assert httpx.get(url.replace("X-Amz-Expires=600", "X-Amz-Expires=6000"), timeout=30).status_code == 403
    assert LocalBlobStore(tmp_path / "local").presigned_url(sha) is None


def test_presigned_url_expires(s3_bucket: str, tmp_path: Path) -> None:
    store = S3BlobStore(s3_bucket)
    path, sha = write(tmp_path / "graph.neff", 1000)
    store.put_file(path, sha)
    url = store.presigned_url(sha, expires_s=1)
    time.sleep(2.5)
    assert httpx.get(url, timeout=30).status_code == 403


def test_prefix_keeps_stores_apart(s3_bucket: str, s3_env: S3Server, tmp_path: Path) -> None:
    path, sha = write(tmp_path / "a.bin", 100)
    one, two = S3BlobStore(s3_bucket, "one"), open_store(f"s3://{s3_bucket}/two/")
    one.put_file(path, sha)
    assert one.has(sha) and not two.has(sha)
    keys = [o["Key"] for o in s3_env.client().list_objects_v2(Bucket=s3_bucket)["Contents"]]
    assert keys == [f"one/blobs/{sha[:2]}/{sha}"]


def test_check_reports_a_missing_bucket(s3_env: S3Server) -> None:
    store = S3BlobStore("warmup-no-such-bucket")
    with pytest.raises(StoreUnreachableError) as caught:
        store.check()
    message = str(caught.value)
    assert (
        "warmup-no-such-bucket" in message and s3_env.endpoint_url in message and "does not exist" in message
    )


@pytest.mark.parametrize(
    ("variable", "value"),
    [("AWS_SECRET_ACCESS_KEY", "wrong-secret"), ("AWS_ACCESS_KEY_ID", "unknown-key")],
)
def test_check_reports_refused_credentials(
    s3_bucket: str, monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(
        StoreUnreachableError, match=rf"refused access to bucket '{s3_bucket}'.*AWS_ACCESS_KEY_ID"
    ):
        S3BlobStore(s3_bucket).check()


def test_check_reports_missing_credentials(s3_bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with pytest.raises(StoreUnreachableError, match="no usable AWS credentials"):
        S3BlobStore(s3_bucket).check()


def test_check_reports_an_unreachable_endpoint(s3_env: S3Server, monkeypatch: pytest.MonkeyPatch) -> None:
    endpoint = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    with pytest.raises(StoreUnreachableError, match=f"cannot reach the S3 endpoint {endpoint}"):
        S3BlobStore("any-bucket").check()


def test_open_store_parses_urls(tmp_path: Path, s3_env: S3Server) -> None:
    s3 = open_store("s3://my-bucket/warm/cache")
    assert isinstance(s3, S3BlobStore) and (s3.bucket, s3.prefix) == ("my-bucket", "warm/cache/")
    assert s3.endpoint == s3_env.endpoint_url  # AWS_ENDPOINT_URL is honoured
    assert isinstance(open_store("s3://my-bucket"), S3BlobStore)
    local = open_store(f"file://{tmp_path}/blobs")
    assert isinstance(local, LocalBlobStore) and local.root == tmp_path / "blobs"
    assert open_store(tmp_path / "plain").root == tmp_path / "plain"
    for bad in ("http://example.com/x", "s3:///no-bucket", "file://host/path"):
        with pytest.raises(StoreError):
            open_store(bad)
