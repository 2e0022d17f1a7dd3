"""The blob store on a local directory. The tests that take a `store` run on a real S3 server (SeaweedFS)
too, in tests/integration/test_store_s3.py, with what only S3 has."""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from warmup.errors import (
    BlobIntegrityError,
    BlobNotFoundError,
    StoreError,
    StoreUnreachableError,
    UnsafeArtifactError,
)
from warmup.store import (
    READ_ATTEMPTS,
    BlobStore,
    LocalBlobStore,
    S3BlobStore,
    _ResumingReader,
    blob_key,
    sha256_file,
)

pytestmark = pytest.mark.timeout(120)

MiB = 1024 * 1024


@pytest.fixture(params=["local"])
def store(tmp_path: Path) -> BlobStore:
    return LocalBlobStore(tmp_path / "blobs")


def write(path: Path, size: int) -> tuple[Path, str]:
    path.write_bytes(os.urandom(size))
    return path, hashlib.sha256(path.read_bytes()).hexdigest()


class RequestCounter:
    """Counts the S3 API calls a boto3 client makes (boto3's own event hooks, not a mock)."""

    def __init__(self, client) -> None:
        self.calls: Counter[str] = Counter()
        client.meta.events.register("before-call.s3", self._count)

    def _count(self, model, **_kwargs) -> None:
        self.calls[model.name] += 1

    def uploads(self) -> int:
        return self.calls["PutObject"] + self.calls["CreateMultipartUpload"] + self.calls["UploadPart"]


# --- every store (tests/integration/test_store_s3.py runs these on S3) --------------------------


def test_round_trip(store: BlobStore, tmp_path: Path) -> None:
    store.check()
    path, sha = write(tmp_path / "graph.neff", 300_000)
    assert not store.has(sha)
    assert store.put_file(path, sha) is True
    assert store.has(sha)

    with store.open(sha) as stream:
        assert stream.read() == path.read_bytes()
    store.download(sha, tmp_path / "out" / "copy.neff")
    assert (tmp_path / "out" / "copy.neff").read_bytes() == path.read_bytes()
    assert [(b.sha256, b.size) for b in store.iter_blobs()] == [(sha, 300_000)]

    store.delete(sha)
    assert not store.has(sha)
    with pytest.raises(BlobNotFoundError):
        store.open(sha)
    store.delete(sha)  # deleting an absent blob is fine


def test_second_put_of_the_same_blob_does_not_write(store: BlobStore, tmp_path: Path) -> None:
    path, sha = write(tmp_path / "kernel.so", 50_000)
    copy = tmp_path / "same-bytes-elsewhere.so"
    copy.write_bytes(path.read_bytes())
    assert store.put_file(path, sha) is True

    if isinstance(store, S3BlobStore):
        counter = RequestCounter(store.client)
        assert store.put_file(copy, sha) is False
        assert store.put_file(copy) is False  # without a sha given, it is computed
        assert counter.uploads() == 0 and counter.calls["HeadObject"] == 2
    else:
        blob = store.root / blob_key(sha)
        before = blob.stat()
        assert store.put_file(copy, sha) is False
        assert store.put_file(copy) is False
        after = blob.stat()
        assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert [b.sha256 for b in store.iter_blobs()] == [sha]


def test_a_file_that_does_not_match_its_sha256_is_not_stored(store: BlobStore, tmp_path: Path) -> None:
    path, sha = write(tmp_path / "graph.bin", 10_000)
    with pytest.raises(BlobIntegrityError, match=sha):
        store.put_file(path, "0" * 64)
    assert not store.has(sha) and not store.has("0" * 64)
    assert list(store.iter_blobs()) == []
    if isinstance(store, LocalBlobStore):
        assert [p.name for p in store.root.rglob("*") if p.is_file()] == []  # no temp file left


def overwrite(store: BlobStore, sha256: str, data: bytes) -> None:
    """Replace a stored copy's bytes behind the store's back (bit rot, a stray write, a bad restore)."""
    if isinstance(store, S3BlobStore):
        store.client.put_object(Bucket=store.bucket, Key=store.prefix + blob_key(sha256), Body=data)
    else:
        assert isinstance(store, LocalBlobStore)
        (store.root / blob_key(sha256)).write_bytes(data)


def test_verify_reads_the_copy_back(store: BlobStore, tmp_path: Path) -> None:
    path, sha = write(tmp_path / "graph.neff", 70_000)
    store.put_file(path, sha)
    assert store.verify(sha, 70_000) is None
    flipped = bytearray(path.read_bytes())
    flipped[1234] ^= 0x01
    overwrite(store, sha, bytes(flipped))
    assert store.verify(sha, 70_000) == f"its bytes have sha256 {hashlib.sha256(flipped).hexdigest()}"
    overwrite(store, sha, bytes(flipped[:-10]))
    assert store.verify(sha, 70_000) == "69990 bytes stored, 70000 recorded"
    store.delete(sha)
    assert store.verify(sha) == "missing from the store"


def test_a_copy_of_another_size_is_replaced(store: BlobStore, tmp_path: Path) -> None:
    path, sha = write(tmp_path / "kernel.so", 40_000)
    store.put_file(path, sha)
    overwrite(store, sha, path.read_bytes()[:1000])  # cut short
    assert store.stored_size(sha) == 1000
    assert store.put_file(path, sha) is True
    assert store.verify(sha, 40_000) is None and store.stored_size(sha) == 40_000


def test_documents_are_deleted(store: BlobStore) -> None:
    store.put_object("manifests/spec/toolchain.json", b"{}")
    store.delete_object("manifests/spec/toolchain.json")
    store.delete_object("manifests/spec/never-there.json")
    assert store.list_documents("manifests/") == []


def test_start_up_removes_the_uploads_of_killed_writers_only(tmp_path: Path) -> None:
    from warmup.leftovers import locked_temp_file

    store = LocalBlobStore(tmp_path / "store")
    store.check()
    killed = store.root / "blobs" / ".tmp-killed"  # a writer that died holds no lock
    killed.write_bytes(b"half a blob")
    fd, live = locked_temp_file(store.root / "blobs", ".tmp-")  # what put_file holds while it writes
    try:
        removed = store.remove_stale_uploads()
        assert removed.paths == [killed] and removed.bytes == len(b"half a blob")
        assert live.exists() and not killed.exists()
        assert (
            removed.describe("uploads")
            == "removed 1 uploads left by killed processes (11 bytes): .tmp-killed"
        )
    finally:
        os.close(fd)
    assert store.remove_stale_uploads().paths == [live]  # its writer is gone now


def test_a_writer_whose_temp_file_a_cleaner_took_makes_another(tmp_path: Path) -> None:
    from warmup.leftovers import hold, remove_abandoned

    path = tmp_path / ".tmp-x"
    path.write_bytes(b"")
    fd = os.open(path, os.O_RDWR)  # created, not yet locked: the cleaner's moment
    try:
        assert remove_abandoned([path]).paths == [path]
        assert hold(fd) is False  # the writer finds it unlinked and starts over
    finally:
        os.close(fd)


def test_download_checks_the_sha256(tmp_path: Path) -> None:
    store = LocalBlobStore(tmp_path / "blobs")
    path, sha = write(tmp_path / "graph.bin", 1000)
    store.put_file(path, sha)
    (store.root / blob_key(sha)).write_bytes(b"bit rot")  # corrupt it behind the store's back
    with pytest.raises(BlobIntegrityError):
        store.download(sha, tmp_path / "out.bin")
    assert not (tmp_path / "out.bin").exists()


def test_documents(store: BlobStore) -> None:
    store.put_object("manifests/abc.json", b'{"files": []}')
    assert store.get_object("manifests/abc.json") == b'{"files": []}'
    store.put_object("manifests/abc.json", b'{"files": [1]}')
    assert store.get_object("manifests/abc.json") == b'{"files": [1]}'
    with pytest.raises(BlobNotFoundError):
        store.get_object("manifests/missing.json")
    for bad in ("../escape.json", "/abs.json", "blobs/ab/cd", "a//b.json", ""):
        with pytest.raises(StoreError, match="invalid document key"):
            store.put_object(bad, b"{}")
    assert list(store.iter_blobs()) == []  # documents are not blobs
    # A hostile bucket's oversized "manifest" is refused, not read into memory whole.
    store.put_object("manifests/huge.json", b"x" * (3 * MiB))
    assert len(store.get_object("manifests/huge.json", max_bytes=3 * MiB)) == 3 * MiB
    with pytest.raises(UnsafeArtifactError, match="larger than"):
        store.get_object("manifests/huge.json", max_bytes=3 * MiB - 1)


def test_large_file(store: BlobStore, tmp_path: Path) -> None:
    path, sha = write(tmp_path / "big.neff", 12 * MiB)
    if isinstance(store, S3BlobStore):
        store = S3BlobStore(
            store.bucket, store.prefix, multipart_threshold=5 * MiB, multipart_chunksize=5 * MiB
        )
        counter = RequestCounter(store.client)
        assert store.put_file(path, sha)
        assert counter.calls["CreateMultipartUpload"] == 1 and counter.calls["UploadPart"] == 3
        assert counter.calls["PutObject"] == 0
        head = store.client.head_object(Bucket=store.bucket, Key=store.prefix + blob_key(sha))
        assert head["ContentLength"] == 12 * MiB and head["ETag"].strip('"').endswith("-3")
    else:
        assert store.put_file(path, sha)
    store.download(sha, tmp_path / "back.neff")
    assert sha256_file(tmp_path / "back.neff") == (sha, 12 * MiB)


# --- local only --------------------------------------------------------------------------------


def test_local_check_reports_an_unusable_directory(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("not a directory")
    with pytest.raises(StoreUnreachableError, match="a-file"):
        LocalBlobStore(tmp_path / "a-file" / "blobs").check()
    LocalBlobStore(tmp_path / "new" / "dir").check()  # created on demand
    assert (tmp_path / "new" / "dir" / "blobs").is_dir()


def test_keys_must_be_sha256(tmp_path: Path) -> None:
    with pytest.raises(BlobIntegrityError):
        LocalBlobStore(tmp_path).has("../../etc/passwd")


@pytest.fixture
def many_blobs(tmp_path: Path) -> Iterator[tuple[LocalBlobStore, set[str]]]:
    store = LocalBlobStore(tmp_path / "blobs")
    shas = set()
    for i in range(20):
        path, sha = write(tmp_path / f"f{i}", 100 + i)
        store.put_file(path, sha)
        shas.add(sha)
    yield store, shas


def test_iter_blobs_lists_every_shard(many_blobs: tuple[LocalBlobStore, set[str]]) -> None:
    store, shas = many_blobs
    (store.root / "blobs" / ".tmp-stray").write_bytes(b"half an upload")
    assert {b.sha256 for b in store.iter_blobs()} == shas


# --- an S3 read that breaks, with the S3 client played by a stand-in -----------------------------


class BreakingS3:
    """An S3 client and store whose every GET body breaks after `bytes_per_get` bytes."""

    def __init__(self, data: bytes, bytes_per_get: int) -> None:
        self.data, self.bytes_per_get = data, bytes_per_get
        self.ranges: list[str | None] = []
        self.client, self.bucket, self.location = self, "bucket", "s3://bucket"

    def _errors(self, _what: str) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def get_object(self, Bucket: str, Key: str, Range: str | None = None) -> dict[str, object]:
        self.ranges.append(Range)
        start = int(Range.removeprefix("bytes=").rstrip("-")) if Range else 0
        return {"Body": BreakingBody(self.data[start:], self.bytes_per_get), "ContentLength": len(self.data)}


class BreakingBody:
    def __init__(self, rest: bytes, until: int) -> None:
        self.rest, self.until = rest, until

    def read(self, size: int) -> bytes:
        if self.until == 0:
            raise OSError("connection reset by peer")
        chunk = self.rest[: min(size, self.until)]
        self.rest, self.until = self.rest[len(chunk) :], self.until - len(chunk)
        return chunk

    def close(self) -> None:
        pass


def test_a_broken_s3_read_resumes_where_it_stopped_then_gives_up_after_its_attempts() -> None:
    data = os.urandom(1000)
    s3 = BreakingS3(data, bytes_per_get=300)
    reader = _ResumingReader(s3, "key", "download of key")  # type: ignore[arg-type]
    assert b"".join(iter(lambda: reader.read(256), b"")) == data
    assert s3.ranges == [None, "bytes=300-", "bytes=600-", "bytes=900-"]

    dead = BreakingS3(data, bytes_per_get=0)
    reader = _ResumingReader(dead, "key", "download of key")  # type: ignore[arg-type]
    with pytest.raises(StoreError, match=f"broke off {READ_ATTEMPTS} times, last at byte 0 of 1000"):
        reader.read(256)
    assert len(dead.ranges) == READ_ATTEMPTS
