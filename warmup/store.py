"""Blob stores: artifact files addressed by their sha256, written once.

Two stores behind one interface: `LocalBlobStore` (a directory; the embedded default) and
`S3BlobStore` (any S3-compatible service through boto3 and the standard AWS environment, including
AWS_ENDPOINT_URL). Blobs live under `blobs/<first two hex digits>/<sha256>`; small JSON documents
(manifests) live next to them under their own keys and are written after the blobs they list.

A blob is verified against its sha256 before it is stored and uploaded again only when the stored copy's
size is wrong (a truncated copy); `verify()` reads a stored copy back against its sha256, which is
what `warmup store check` does (warmup/db/integrity.py). `check()` runs at
start-up so that a missing bucket or refused credentials stop the server or worker right away, with
a message that names the bucket and endpoint, instead of failing the first upload an hour later.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import IO, Any, NamedTuple
from urllib.parse import unquote, urlparse

from warmup.errors import (
    BlobIntegrityError,
    BlobNotFoundError,
    StoreError,
    StoreUnreachableError,
    UnsafeArtifactError,
)
from warmup.leftovers import Removed, locked_temp_file, remove_abandoned
from warmup.retry import at_once, retrying

SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
CHUNK_BYTES = 1024 * 1024
BLOBS = "blobs"
MiB = 1024 * 1024
# A blob read whose connection breaks is resumed from where it stopped this many times.
READ_ATTEMPTS = 4
# S3 error codes that mean "these credentials may not do this".
DENIED_CODES = frozenset({"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "403"})


class BlobInfo(NamedTuple):
    sha256: str
    size: int
    modified: datetime


def sha256_file(path: str | os.PathLike[str]) -> tuple[str, int]:
    """sha256 hex digest and size of a file, read in chunks (artifacts reach hundreds of MB)."""
    with open(path, "rb") as f:
        digest = hashlib.file_digest(f, "sha256")
        return digest.hexdigest(), f.tell()


def blob_key(sha256: str) -> str:
    """Where a blob lives, relative to the store's root: sharded so that no directory grows huge."""
    if not SHA256_RE.match(sha256):
        raise BlobIntegrityError(f"{sha256!r} is not a sha256 hex digest")
    return f"{BLOBS}/{sha256[:2]}/{sha256}"


def _document_key(key: str) -> str:
    pure = PurePosixPath(key)
    if (
        not key
        or pure.is_absolute()
        or ".." in pure.parts
        or str(pure) != key
        or pure.parts[0] in (BLOBS, ".tmp")
    ):
        raise StoreError(f"invalid document key {key!r}: use a relative path such as 'manifests/<key>.json'")
    return key


class BlobStore(ABC):
    """Content-addressed blobs plus a few small documents."""

    location: str  # for messages: a directory, or s3://bucket/prefix at an endpoint

    @abstractmethod
    def check(self) -> None:
        """Fail now, with StoreUnreachableError saying what to do, if the store cannot be used."""

    @abstractmethod
    def put_file(self, path: str | os.PathLike[str], sha256: str | None = None) -> bool:
        """Store a file as a blob. The file's sha256 is computed and must equal `sha256` when given
        (BlobIntegrityError otherwise, and nothing is stored). Returns False, without uploading, if
        the blob is already there with the file's size; a copy of another size (cut short, or damaged)
        is replaced."""

    @abstractmethod
    def open(self, sha256: str) -> IO[bytes]:
        """A binary stream of the blob's bytes (BlobNotFoundError if absent). Close it."""

    @abstractmethod
    def delete(self, sha256: str) -> None:
        """Remove a blob; absent blobs are fine."""

    def remove_stale_uploads(self, older_than: datetime | None = None) -> Removed:
        """Remove what uploads cut off by a killed writer left behind (only those last written before
        `older_than`, when given). Nothing by default: S3 never shows a half-written object (a bucket
        lifecycle rule aborts stale multipart uploads)."""
        return Removed()

    @abstractmethod
    def stored_size(self, sha256: str) -> int | None:
        """The size of the stored copy of a blob, None if there is none."""

    def has(self, sha256: str) -> bool:
        return self.stored_size(sha256) is not None

    def verify(self, sha256: str, size: int | None = None) -> str | None:
        """Read the stored copy back: None if it has this sha256 (and `size`), else what is wrong."""
        try:
            with self.open(sha256) as source:
                digest, read = hashlib.sha256(), 0
                while chunk := source.read(CHUNK_BYTES):
                    digest.update(chunk)
                    read += len(chunk)
        except BlobNotFoundError:
            return "missing from the store"
        if size is not None and read != size:
            return f"{read} bytes stored, {size} recorded"
        if digest.hexdigest() != sha256:
            return f"its bytes have sha256 {digest.hexdigest()}"
        return None

    @abstractmethod
    def iter_blobs(self) -> Iterator[BlobInfo]:
        """Every blob in the store (for retention), in no particular order."""

    @abstractmethod
    def put_object(self, key: str, data: bytes) -> None:
        """Write a small document (a manifest) under `key`, replacing any previous one."""

    @abstractmethod
    def get_object(self, key: str, max_bytes: int | None = None) -> bytes:
        """Read a small document (BlobNotFoundError if absent); one larger than `max_bytes` is refused
        (UnsafeArtifactError) without being read whole."""

    @abstractmethod
    def delete_object(self, key: str) -> None:
        """Remove a document; absent ones are fine."""

    @abstractmethod
    def list_documents(self, prefix: str) -> list[str]:
        """Keys of the documents under `prefix` (a folder such as 'manifests/<spec key>/'), sorted."""

    def presigned_url(self, sha256: str, expires_s: int = 3600) -> str | None:
        """A URL that fetches the blob without credentials until it expires; None if the store has
        no such URLs (a local directory: the API serves those blobs itself)."""
        return None

    def download(self, sha256: str, dest: str | os.PathLike[str]) -> None:
        """Copy a blob to `dest` atomically, checking its sha256 on the way."""
        dest = Path(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        with self.open(sha256) as source, _atomic_file(dest) as (_tmp, out):
            digest = hashlib.sha256()
            while chunk := source.read(CHUNK_BYTES):
                digest.update(chunk)
                out.write(chunk)
            if digest.hexdigest() != sha256:
                raise BlobIntegrityError(f"blob {sha256} in {self.location} has sha256 {digest.hexdigest()}")


def _read_at_most(source: IO[bytes] | io.RawIOBase, max_bytes: int | None, what: str) -> bytes:
    if max_bytes is None:
        return source.read()
    data = bytearray()
    while chunk := source.read(CHUNK_BYTES):  # a raw reader may return less than asked: loop
        data += chunk
        if len(data) > max_bytes:
            raise UnsafeArtifactError(f"refusing {what}: larger than {max_bytes} bytes")
    return bytes(data)


@contextmanager
def _atomic_file(dest: Path) -> Iterator[tuple[Path, IO[bytes]]]:
    """A temp file next to `dest` that replaces `dest` only if the block finishes without error."""
    fd, name = tempfile.mkstemp(dir=dest.parent, prefix=".tmp-")
    tmp = Path(name)
    try:
        with os.fdopen(fd, "wb") as out:
            yield tmp, out
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


class LocalBlobStore(BlobStore):
    """Blobs in a directory. Writes go to a temp file in the same directory, then a rename: a reader
    never sees half a blob, and a crash leaves at most a stray `.tmp-*` file."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.root = Path(directory).expanduser().absolute()
        self.location = str(self.root)

    def _blob_path(self, sha256: str) -> Path:
        return self.root / blob_key(sha256)

    def check(self) -> None:
        try:
            (self.root / BLOBS).mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryFile(dir=self.root / BLOBS):
                pass
        except OSError as error:
            raise StoreUnreachableError(
                f"blob directory {self.root} is not usable ({error.strerror or error}): "
                "create it, make it writable, or choose another directory for the store"
            ) from error

    def stored_size(self, sha256: str) -> int | None:
        try:
            return self._blob_path(sha256).stat().st_size
        except FileNotFoundError:
            return None

    def put_file(self, path: str | os.PathLike[str], sha256: str | None = None) -> bool:
        size = os.stat(path).st_size
        if sha256 is not None and self.stored_size(sha256) == size:
            return False
        # Hash while copying: one read of the source, and what is published is what was hashed. The
        # temp file is locked while it is written, so that a start-up tells it from a killed writer's.
        tmp_dir = self.root / BLOBS
        tmp_dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = locked_temp_file(tmp_dir, ".tmp-")
        # The lock lasts until `out` is closed, after the rename: a cleaner never takes a file mid-way.
        with open(path, "rb") as source, os.fdopen(fd, "wb") as out:
            try:
                digest = hashlib.sha256()
                while chunk := source.read(CHUNK_BYTES):
                    digest.update(chunk)
                    out.write(chunk)
                out.flush()
                os.fsync(out.fileno())
                actual = digest.hexdigest()
                if sha256 is not None and actual != sha256:
                    raise BlobIntegrityError(
                        f"{path} has sha256 {actual}, not {sha256}; it changed or is not that blob"
                    )
                if self.stored_size(actual) == out.tell():
                    return False
                final = self._blob_path(actual)
                final.parent.mkdir(parents=True, exist_ok=True)
                os.chmod(tmp, 0o644)
                os.replace(tmp, final)
                return True
            finally:
                tmp.unlink(missing_ok=True)

    def open(self, sha256: str) -> IO[bytes]:
        try:
            return open(self._blob_path(sha256), "rb")
        except FileNotFoundError:
            raise BlobNotFoundError(f"blob {sha256} is not in {self.location}") from None

    def delete(self, sha256: str) -> None:
        self._blob_path(sha256).unlink(missing_ok=True)

    def iter_blobs(self) -> Iterator[BlobInfo]:
        blobs = self.root / BLOBS
        if not blobs.is_dir():
            return
        for shard in sorted(blobs.iterdir()):
            if not shard.is_dir():
                continue
            for path in shard.iterdir():
                if SHA256_RE.match(path.name):
                    with suppress(FileNotFoundError):  # deleted while we looked
                        stat = path.stat()
                        yield BlobInfo(path.name, stat.st_size, datetime.fromtimestamp(stat.st_mtime, UTC))

    def remove_stale_uploads(self, older_than: datetime | None = None) -> Removed:
        """The `.tmp-*` files of writers killed mid-upload: a live writer holds its file's lock."""

        def last_written_before(tmp: Path) -> bool:
            try:
                return older_than is None or datetime.fromtimestamp(tmp.stat().st_mtime, UTC) < older_than
            except FileNotFoundError:
                return False

        return remove_abandoned(t for t in (self.root / BLOBS).glob(".tmp-*") if last_written_before(t))

    def put_object(self, key: str, data: bytes) -> None:
        dest = self.root / _document_key(key)
        dest.parent.mkdir(parents=True, exist_ok=True)
        with _atomic_file(dest) as (_tmp, out):
            out.write(data)

    def get_object(self, key: str, max_bytes: int | None = None) -> bytes:
        try:
            with (self.root / _document_key(key)).open("rb") as document:
                return _read_at_most(document, max_bytes, f"document {key!r} in {self.location}")
        except FileNotFoundError:
            raise BlobNotFoundError(f"no document {key!r} in {self.location}") from None

    def delete_object(self, key: str) -> None:
        (self.root / _document_key(key)).unlink(missing_ok=True)

    def list_documents(self, prefix: str) -> list[str]:
        folder = self.root / _document_key(prefix.rstrip("/"))
        if not folder.is_dir():
            return []
        return sorted(path.relative_to(self.root).as_posix() for path in folder.rglob("*") if path.is_file())


class S3BlobStore(BlobStore):
    """Blobs in an S3 bucket (AWS or any S3-compatible service).

    Credentials, region and endpoint come from the standard AWS environment (AWS_ACCESS_KEY_ID,
    AWS_PROFILE, AWS_REGION, AWS_ENDPOINT_URL, instance and pod roles ...) unless given here. Files
    above `multipart_threshold` are uploaded in parts, streamed from disk.
    """

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        presign_endpoint_url: str | None = None,
        client: Any = None,
        multipart_threshold: int = 64 * MiB,
        multipart_chunksize: int = 16 * MiB,
        max_concurrency: int = 8,
        max_pool_connections: int = 10,
    ) -> None:
        import boto3
        from boto3.s3.transfer import TransferConfig
        from botocore.config import Config

        self.bucket = bucket
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        config = Config(
            signature_version="s3v4",
            # Measured through tests/support/fault_proxy.py failing every 5th request (503, resets),
            # 100 uploads + 100 reads on 8 threads: standard/3 and legacy/5 both lose nothing,
            # standard/2 fails 3 ops. The losses once blamed on the retry mode were blob bodies
            # breaking mid-read, which no botocore mode retries: _ResumingReader resumes those.
            retries={"mode": "standard", "max_attempts": 3},
            connect_timeout=10,
            read_timeout=120,
            # one kept-alive connection per parallel download (botocore's default pool is 10)
            max_pool_connections=max_pool_connections,
        )
        self.client = client or boto3.session.Session().client("s3", endpoint_url=endpoint_url, config=config)
        # Presigned URLs are for pods, which may reach the store at another address than this process
        # does (an in-cluster endpoint here, a public one there). Signing needs no connection.
        self.presigner = (
            boto3.session.Session().client("s3", endpoint_url=presign_endpoint_url, config=config)
            if presign_endpoint_url
            else self.client
        )
        self.transfer = TransferConfig(
            multipart_threshold=multipart_threshold,
            multipart_chunksize=multipart_chunksize,
            max_concurrency=max_concurrency,
        )
        self.endpoint = self.client.meta.endpoint_url
        self.location = f"s3://{bucket}/{self.prefix} at {self.endpoint}"

    def _key(self, relative: str) -> str:
        return self.prefix + relative

    @contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        """botocore's exceptions, translated to ours with the bucket, endpoint and a remedy."""
        from boto3.exceptions import S3UploadFailedError
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            yield
        except S3UploadFailedError as error:  # boto3's transfers wrap the S3 error that stopped them
            cause = error.__cause__ or error.__context__
            raise self._translate(cause if isinstance(cause, ClientError) else error, what) from error
        except (ClientError, BotoCoreError) as error:
            raise self._translate(error, what) from error

    def _translate(self, error: Exception, what: str) -> StoreError:
        from botocore.exceptions import (
            ClientError,
            ConnectionError,
            NoCredentialsError,
            PartialCredentialsError,
        )

        if isinstance(error, ClientError):
            info = error.response.get("Error", {})
            code = str(info.get("Code", ""))
            status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code in ("NoSuchBucket",) or (what == "check" and status == 404):
                return StoreUnreachableError(
                    f"S3 bucket {self.bucket!r} does not exist at {self.endpoint}: create it "
                    f"(aws s3 mb s3://{self.bucket}) or point the store at an existing bucket"
                )
            if code in ("NoSuchKey", "404", "NotFound"):
                return BlobNotFoundError(f"{what}: not found in {self.location}")
            if status == 403 or code in DENIED_CODES:
                return StoreUnreachableError(
                    f"{self.endpoint} refused access to bucket {self.bucket!r} ({code or status}) during "
                    f"{what}: check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (or AWS_PROFILE, or the pod's "
                    "role) and the bucket policy"
                )
            return StoreError(
                f"S3 {what} failed in {self.location} after retries: {code or status} "
                f"{info.get('Message', '')}; if it persists, check the S3 service's health"
            )
        if isinstance(error, NoCredentialsError | PartialCredentialsError):
            return StoreUnreachableError(
                f"no usable AWS credentials for s3://{self.bucket} ({error}): set AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or run with an instance or pod role"
            )
        if isinstance(error, ConnectionError):
            return StoreUnreachableError(
                f"cannot reach the S3 endpoint {self.endpoint} for bucket {self.bucket!r} during {what} "
                f"({error}): check that the S3 service is up, AWS_ENDPOINT_URL (or AWS_REGION) and the network"
            )
        return StoreError(f"S3 {what} failed in {self.location}: {error}")

    def check(self) -> None:
        with self._errors("check"):
            self.client.head_bucket(Bucket=self.bucket)

    def stored_size(self, sha256: str) -> int | None:
        try:
            with self._errors(f"head {sha256}"):
                head = self.client.head_object(Bucket=self.bucket, Key=self._key(blob_key(sha256)))
        except BlobNotFoundError:
            return None
        return int(head["ContentLength"])

    def put_file(self, path: str | os.PathLike[str], sha256: str | None = None) -> bool:
        size = os.stat(path).st_size
        if sha256 is not None and self.stored_size(sha256) == size:
            return False
        actual, _size = sha256_file(path)
        if sha256 is not None and actual != sha256:
            raise BlobIntegrityError(
                f"{path} has sha256 {actual}, not {sha256}; it changed or is not that blob"
            )
        if sha256 is None and self.stored_size(actual) == size:  # a given sha256 was looked up above
            return False
        with self._errors(f"upload of {actual}"):
            self.client.upload_file(
                os.fspath(path),
                self.bucket,
                self._key(blob_key(actual)),
                ExtraArgs={"ContentType": "application/octet-stream"},
                Config=self.transfer,
            )
        return True

    def open(self, sha256: str) -> IO[bytes]:
        return _ResumingReader(self, self._key(blob_key(sha256)), f"download of {sha256}")  # type: ignore[return-value]

    def delete(self, sha256: str) -> None:
        with self._errors(f"delete of {sha256}"):
            self.client.delete_object(Bucket=self.bucket, Key=self._key(blob_key(sha256)))

    def iter_blobs(self) -> Iterator[BlobInfo]:
        paginator = self.client.get_paginator("list_objects_v2")
        with self._errors("listing"):
            for page in paginator.paginate(Bucket=self.bucket, Prefix=self._key(BLOBS + "/")):
                for item in page.get("Contents", []):
                    name = item["Key"].rsplit("/", 1)[-1]
                    if SHA256_RE.match(name):
                        yield BlobInfo(name, item["Size"], item["LastModified"])

    def presigned_url(self, sha256: str, expires_s: int = 3600) -> str:
        with self._errors(f"presigning {sha256}"):
            url: str = self.presigner.generate_presigned_url(
                "get_object",
                Params={"Bucket": self.bucket, "Key": self._key(blob_key(sha256))},
                ExpiresIn=expires_s,
            )
            return url

    def put_object(self, key: str, data: bytes) -> None:
        content_type = "application/json" if key.endswith(".json") else "application/octet-stream"
        with self._errors(f"write of {key}"):
            self.client.put_object(
                Bucket=self.bucket, Key=self._key(_document_key(key)), Body=data, ContentType=content_type
            )

    def get_object(self, key: str, max_bytes: int | None = None) -> bytes:
        with _ResumingReader(self, self._key(_document_key(key)), f"read of {key}") as body:
            return _read_at_most(body, max_bytes, f"document {key!r} in {self.location}")

    def delete_object(self, key: str) -> None:
        with self._errors(f"delete of {key}"):
            self.client.delete_object(Bucket=self.bucket, Key=self._key(_document_key(key)))

    def list_documents(self, prefix: str) -> list[str]:
        folder = _document_key(prefix.rstrip("/")) + "/"
        keys: list[str] = []
        with self._errors(f"listing of {folder}"):
            paginator = self.client.get_paginator("list_objects_v2")
            for page in paginator.paginate(Bucket=self.bucket, Prefix=self._key(folder)):
                keys += [item["Key"][len(self.prefix) :] for item in page.get("Contents", [])]
        return sorted(keys)


class _ResumingReader(io.RawIOBase):
    """An S3 object's bytes, read as a stream. botocore retries requests, but not a body that breaks
    while the caller reads it (a connection reset or cut short halfway through a GET): that read is
    resumed here with a ranged GET from the first byte not yet read, up to READ_ATTEMPTS times."""

    def __init__(self, store: S3BlobStore, key: str, what: str) -> None:
        super().__init__()
        self.store, self.key, self.what = store, key, what
        self.offset = 0
        response = self._get()
        self.body, self.length = response["Body"], int(response["ContentLength"])

    def _get(self) -> Any:
        extra = {"Range": f"bytes={self.offset}-"} if self.offset else {}
        with self.store._errors(self.what):
            return self.store.client.get_object(Bucket=self.store.bucket, Key=self.key, **extra)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        from botocore.exceptions import BotoCoreError
        from urllib3.exceptions import HTTPError

        broken = (BotoCoreError, HTTPError, OSError)

        def read() -> int:
            if self.body is None:  # the last read broke: resume from the first byte not yet read
                self.body = self._get()["Body"]
            try:
                chunk = self.body.read(len(buffer)) if self.offset < self.length else b""
            except broken:
                self.body.close()
                self.body = None
                raise
            buffer[: len(chunk)] = chunk
            self.offset += len(chunk)
            return len(chunk)

        try:
            return retrying(
                read, transient=lambda error: isinstance(error, broken), backoff=at_once(READ_ATTEMPTS)
            )
        except broken as error:
            raise StoreError(
                f"S3 {self.what} from {self.store.location} broke off {READ_ATTEMPTS} times, last at byte "
                f"{self.offset} of {self.length} ({type(error).__name__}: {error}): check the network "
                "between here and the endpoint"
            ) from error

    def close(self) -> None:
        if not self.closed and self.body is not None:
            self.body.close()
        super().close()


def open_store(url: str | os.PathLike[str], **s3_options: Any) -> BlobStore:
    """`s3://bucket/prefix`, `file:///path` or a plain directory path; `s3_options` are S3BlobStore's
    (other stores have none to take)."""
    text = os.fspath(url)
    parsed = urlparse(text)
    if parsed.scheme == "s3":
        if not parsed.netloc:
            raise StoreError(f"blob store URL {text!r} names no bucket: use s3://bucket/prefix")
        return S3BlobStore(parsed.netloc, parsed.path.lstrip("/"), **s3_options)
    if parsed.scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise StoreError(f"blob store URL {text!r} names a host; use file:///absolute/path")
        return LocalBlobStore(unquote(parsed.path))
    if parsed.scheme == "":
        return LocalBlobStore(text)
    raise StoreError(
        f"unsupported blob store URL {text!r}: use s3://bucket/prefix, file:///path or a directory"
    )


__all__ = [
    "BlobInfo",
    "BlobStore",
    "LocalBlobStore",
    "S3BlobStore",
    "blob_key",
    "open_store",
    "sha256_file",
]
