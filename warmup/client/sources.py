"""Where blob bytes come from: presigned URLs or the API's blob route (`HttpBlobSource`), or the blob
store itself (`StoreBlobSource`). A source opens one manifest file as a stream of chunks; a failure
that may pass (a dropped connection, 429, 5xx) is a `TransientDownloadError`, which the install retries.
"""

from __future__ import annotations

import contextlib
import http.client
import ssl
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Protocol

from warmup.client.service import (
    CHUNK,
    DEFAULT_TIMEOUT_S,
    RETRYABLE_STATUS,
    Answer,
    api_error,
    opener,
    proxies,
    tls_context,
)
from warmup.errors import StoreError, WarmupError
from warmup.manifest import ManifestFile
from warmup.retry import at_once, retrying

if TYPE_CHECKING:
    from warmup.store import BlobStore

ERROR_BODY_BYTES = 1 << 16  # of an error answer from a blob URL: enough for any message

ConnectionKey = tuple[str, str | None, int | None]  # scheme, host, port


class TransientDownloadError(StoreError):
    """A download failed in a way that may pass (connection dropped, 429, 5xx): it is retried."""


class _ClosedKeptAlive(Exception):
    """A request on a kept-alive connection failed: the server may have closed it while it was idle."""


class BlobSource(Protocol):
    """Where blob bytes come from: presigned URLs or the API's blob route, or the bucket itself."""

    def open(self, file: ManifestFile) -> contextlib.AbstractContextManager[Iterator[bytes]]: ...


@dataclass
class HttpBlobSource:
    """Presigned URLs from the manifest, else the API's own blob route (with the API's token).

    Each download thread keeps one connection per host open, with the standard library's http.client:
    warmed caches are hundreds to thousands of small files, and a small blob costs about a third of
    what it costs through httpx. Requests that go through a proxy (HTTP(S)_PROXY) go through urllib,
    which knows proxies.
    """

    server: str | None
    headers: dict[str, str] = field(default_factory=dict)
    timeout: float = DEFAULT_TIMEOUT_S
    _local: threading.local = field(default_factory=threading.local, repr=False)

    @contextlib.contextmanager
    def open(self, file: ManifestFile) -> Iterator[Iterator[bytes]]:
        url = file.url or f"{self.server}/v1/blobs/{file.sha256}"
        headers = {} if file.url else self.headers
        what = f"download of blob {file.sha256[:12]} from {urllib.parse.urlsplit(url).netloc} failed"
        if proxied(url):
            with self._through_proxy(url, headers, what, api=file.url is None) as response:
                yield _http_chunks(response, what)
            return
        key, response = self._get(url, headers, what)
        try:
            if response.status >= 400:
                answer = Answer(response.status, response.msg, response.read(ERROR_BODY_BYTES))
                raise _http_error(answer, what, api=file.url is None)
            yield _http_chunks(response, what)
        finally:
            if not response.isclosed():  # not read to the end: the connection cannot serve another request
                self._drop(key)

    def _through_proxy(
        self, url: str, headers: dict[str, str], what: str, *, api: bool
    ) -> http.client.HTTPResponse:
        try:
            response: http.client.HTTPResponse = opener().open(
                urllib.request.Request(url, headers=headers), timeout=self.timeout
            )
            return response
        except urllib.error.HTTPError as error:
            with error:
                answer = Answer(error.status or 0, error.headers, error.read(ERROR_BODY_BYTES))
            raise _http_error(answer, what, api=api) from None
        except (OSError, http.client.HTTPException) as error:
            raise TransientDownloadError(f"{what}: {type(error).__name__}: {error}") from error

    def _connections(self) -> dict[ConnectionKey, http.client.HTTPConnection]:
        connections: dict[ConnectionKey, http.client.HTTPConnection] = self._local.__dict__.setdefault(
            "connections", {}
        )
        return connections

    def _get(
        self, url: str, headers: dict[str, str], what: str
    ) -> tuple[ConnectionKey, http.client.HTTPResponse]:
        parts = urllib.parse.urlsplit(url)
        key = (parts.scheme, parts.hostname, parts.port)
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        connections = self._connections()

        def request() -> tuple[ConnectionKey, http.client.HTTPResponse]:
            connection = connections.get(key)
            reused = connection is not None
            if connection is None:
                connection = connections[key] = self._connect(parts)
            try:
                connection.request("GET", target, headers=headers)
                return key, connection.getresponse()
            except ssl.SSLCertVerificationError as error:  # waiting will not fix a certificate
                self._drop(key)
                raise StoreError(
                    f"{what}: the TLS certificate of {parts.hostname} is not trusted ({error.verify_message}); "
                    "point SSL_CERT_FILE at the CA bundle that signed it"
                ) from error
            except (OSError, http.client.HTTPException) as error:
                self._drop(key)
                if reused:  # the server closed a kept-alive connection: a new one is opened at once
                    raise _ClosedKeptAlive from error
                raise TransientDownloadError(f"{what}: {type(error).__name__}: {error}") from error

        # The second try opens a new connection, so it never ends in _ClosedKeptAlive.
        return retrying(
            request, transient=lambda error: isinstance(error, _ClosedKeptAlive), backoff=at_once(2)
        )

    def _connect(self, parts: urllib.parse.SplitResult) -> http.client.HTTPConnection:
        if parts.scheme == "https":
            return http.client.HTTPSConnection(
                parts.hostname or "", parts.port, timeout=self.timeout, context=tls_context()
            )
        if parts.scheme != "http":
            raise StoreError(f"cannot download from {parts.scheme!r} URLs: http or https only")
        return http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=self.timeout)

    def _drop(self, key: ConnectionKey) -> None:
        connection = self._connections().pop(key, None)
        if connection is not None:
            connection.close()


def _http_chunks(response: http.client.HTTPResponse, what: str) -> Iterator[bytes]:
    yield from read_chunks(response)
    if response.length:  # http.client ends a body cut short quietly (Content-Length not reached)
        raise TransientDownloadError(f"{what}: the connection closed {response.length} bytes before the end")


def _http_error(answer: Answer, what: str, *, api: bool) -> WarmupError:
    if answer.status in RETRYABLE_STATUS:
        return TransientDownloadError(f"{what}: HTTP {answer.status}")
    return api_error(answer) if api else StoreError(f"{what}: HTTP {answer.status}")


def proxied(url: str) -> bool:
    """Whether the environment's proxies take `url` (then urllib, which knows proxies, fetches it)."""
    parts = urllib.parse.urlsplit(url)
    return parts.scheme in proxies() and not urllib.request.proxy_bypass(parts.hostname or "")


@dataclass
class StoreBlobSource:
    """Blobs read straight from the blob store (S3 or a directory), streamed."""

    store: BlobStore

    @contextlib.contextmanager
    def open(self, file: ManifestFile) -> Iterator[Iterator[bytes]]:
        with contextlib.closing(self.store.open(file.sha256)) as handle:
            yield read_chunks(handle)


def read_chunks(handle: IO[bytes]) -> Iterator[bytes]:
    """The chunks of `handle`; a read that fails in a way that may pass is a TransientDownloadError."""
    try:
        while chunk := handle.read(CHUNK):
            yield chunk
    except (OSError, http.client.HTTPException) as error:  # a dropped connection, a short body
        raise TransientDownloadError(f"reading the blob failed: {type(error).__name__}: {error}") from error
    except Exception as error:
        if type(error).__module__.split(".")[0] in ("botocore", "urllib3"):
            raise TransientDownloadError(
                f"reading the blob failed: {type(error).__name__}: {error}"
            ) from error
        raise


def retryable(error: BaseException) -> bool:
    return isinstance(error, TransientDownloadError)
