"""The HTTP client of the service, and `pull`: install a verified, prewarmed cache on a training pod.

Pod-side code: needs only the base install (pydantic), never fastapi, sqlalchemy, httpx or boto3 at
import (pulling straight from S3 with `source="s3://..."` imports boto3 when it runs). HTTP is the
standard library's: `urllib.request` for the few API calls (proxies from the environment, no
redirects followed), `http.client` with one kept-alive connection per download thread for blobs. A
pull is a short process on a pod's critical path, and httpx's import and client set-up alone cost
about 0.1 s of a 0.5 s pull (benchmarks/bench_pull.py).

`pull` computes (or takes) the pod's toolchain and gets the manifest of (spec, toolchain), from the
service or from the bucket the workers publish complete manifests into. `install` then downloads the
blobs in parallel over kept-alive connections, checks every size and sha256, retries transient
failures with backoff, and installs all files or none: each file is downloaded to a temp file in the
destination, and only when every file is verified are they renamed into place. Files already present
with the right hash are skipped (a small index remembers what was verified, so a second pull is a stat
per file). Paths that would land outside the destination are refused before anything is written.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import http.client
import json
import os
import shutil
import ssl
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from email.message import Message
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Protocol

from warmup.errors import (
    AuthError,
    BlobIntegrityError,
    BlobNotFoundError,
    NotWarmedError,
    PartlyWarmedError,
    ServerError,
    ServerUnreachableError,
    SpecError,
    StoreError,
    ToolchainMismatchError,
    UnsafeArtifactError,
    WarmupError,
    WarmupFailedError,
)
from warmup.errors import FieldProblem as _FieldProblem
from warmup.manifest import (
    MANIFESTS_PREFIX,
    Manifest,
    ManifestFile,
    check_relative_path,
    manifest_object_key,
    parse_manifest,
)

if TYPE_CHECKING:
    from warmup.spec import Spec
    from warmup.store import BlobStore
    from warmup.toolchain import Toolchain

DEFAULT_TIMEOUT_S = 30.0  # per connect and per read, for API calls and blob downloads
CHUNK = 1 << 20
INDEX_NAME = ".warmup-index.json"
TEMP_DIR_NAME = ".warmup-tmp"
# What each pull installed, by spec key: the training process (the callback, `warmup exec`) reads it.
LOCAL_MANIFESTS_DIR = ".warmup-manifests"
RETRYABLE_STATUS = {429, 500, 502, 503, 504}
DOWNLOAD_ATTEMPTS = 4
PRESIGN_S = 6 * 3600  # URLs signed by a pod pulling from the bucket: long enough for the largest pull
# A manifest of the largest plan (2048 signatures, tens of files each, presigned URLs) is tens of MiB;
# a larger answer (from the API or the bucket) is refused as it streams in, not read into memory.
MAX_MANIFEST_BYTES = 64 << 20
ERROR_BODY_BYTES = 1 << 16  # of an error answer from a blob URL: enough for any message


# --- the service's HTTP API ---------------------------------------------------------------------


class ServiceClient:
    """A small typed client of the trl-warmup API. Timeouts are on by default; the token comes from
    the argument or WARMUP_TOKEN and is sent to the service only (never to presigned blob URLs, and
    never along a redirect: none is followed)."""

    def __init__(
        self,
        server: str,
        *,
        token: str | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        attempts: int = 4,
    ) -> None:
        self.server = server.rstrip("/")
        token = token or os.environ.get("WARMUP_TOKEN")
        self.auth_headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.timeout = timeout
        self.attempts = attempts

    def close(self) -> None:
        """Nothing is kept open between API calls; kept for `with ServiceClient(...)`."""

    def __enter__(self) -> ServiceClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: dict[str, str] | None = None,
        max_bytes: int = MAX_MANIFEST_BYTES,
    ) -> Any:
        """One API call with retries on connection errors, 429 and 5xx; API errors become WarmupErrors.
        `body` is sent as JSON; an answer larger than `max_bytes` is refused (UnsafeArtifactError)
        before it is all read."""
        url = f"{self.server}{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
        headers = {**self.auth_headers, "Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"

        def call() -> Answer:
            request = urllib.request.Request(url, data=data, headers=headers, method=method)
            return fetch_answer(request, self.timeout, max_bytes)

        answer = _with_retries(call, what=url, attempts=self.attempts)
        if 300 <= answer.status < 400:
            raise ServerError(
                f"{url} answered HTTP {answer.status}, a redirect to {answer.headers.get('Location')}, which is "
                "not followed (it could carry the token elsewhere): give the service's own URL",
                status=answer.status,
            )
        if answer.status >= 400:
            raise api_error(answer)
        return answer.json() if answer.body else None

    def plan(self, spec: dict[str, Any]) -> dict[str, Any]:
        answer: dict[str, Any] = self.request("POST", "/v1/plans", body={"spec": spec})
        return answer

    def submit(
        self,
        spec: dict[str, Any],
        *,
        toolchain: dict[str, Any] | None = None,
        pool: str | None = None,
        retry_failed: bool = False,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"spec": spec, "retry_failed": retry_failed}
        if toolchain is not None:
            body["toolchain"] = toolchain
        if pool is not None:
            body["pool"] = pool
        job: dict[str, Any] = self.request("POST", "/v1/warmups", body=body)
        return job

    def job(self, job_id: str) -> dict[str, Any]:
        answer: dict[str, Any] = self.request("GET", f"/v1/warmups/{job_id}")
        return answer

    def jobs(self, *, spec_key: str | None = None, toolchain_key: str | None = None) -> list[dict[str, Any]]:
        params = {k: v for k, v in (("spec_key", spec_key), ("toolchain_key", toolchain_key)) if v}
        jobs: list[dict[str, Any]] = self.request("GET", "/v1/warmups", params=params)
        return jobs

    def manifest(
        self, spec: dict[str, Any], toolchain: dict[str, Any], *, allow_partial: bool = False
    ) -> Manifest:
        body = {"spec": spec, "toolchain": toolchain, "allow_partial": allow_partial}
        try:
            data = self.request("POST", "/v1/manifests", body=body)
        except (ValueError, RecursionError) as error:  # the answer is not JSON (or nested past any parser)
            raise UnsafeArtifactError(f"refusing manifest from {self.server}: not JSON ({error})") from None
        return parse_manifest(data)

    def post_coverage(self, report: dict[str, Any]) -> dict[str, Any]:
        answer: dict[str, Any] = self.request("POST", "/v1/coverage", body=report)
        return answer

    def coverage(self, job_id: str) -> list[dict[str, Any]]:
        answer: list[dict[str, Any]] = self.request("GET", f"/v1/warmups/{job_id}/coverage")
        return answer


@dataclass(frozen=True)
class Answer:
    """An HTTP answer read whole: its status, headers (case-insensitive) and body."""

    status: int
    headers: Message
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")


class TransportError(OSError):
    """The request did not get an answer: refused, reset, timed out, cut short."""


def fetch_answer(request: urllib.request.Request, timeout: float, max_bytes: int) -> Answer:
    """Send `request` and read its answer (an error status is an answer too), at most `max_bytes`."""
    try:
        try:
            response = _opener().open(request, timeout=timeout)
        except urllib.error.HTTPError as error:  # 4xx and 5xx: the answer is read all the same
            response = error
        with response:
            body = bytearray()
            while chunk := response.read(CHUNK):
                body += chunk
                if len(body) > max_bytes:
                    raise UnsafeArtifactError(
                        f"refusing the answer of {request.full_url}: larger than {max_bytes} bytes"
                    )
            return Answer(response.status, response.headers, bytes(body))
    except (OSError, http.client.HTTPException) as error:  # URLError is an OSError
        reason = getattr(error, "reason", error)
        raise TransportError(f"{type(reason).__name__}: {reason}") from error


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A redirect is answered as the error it is for this API: following it could carry the token
    to another host."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


class _VerifiedHTTPS(urllib.request.HTTPSHandler):
    """HTTPS verified with the client's CA bundle, loaded on the first HTTPS request only."""

    def https_open(self, req: urllib.request.Request) -> Any:
        return self.do_open(http.client.HTTPSConnection, req, context=_tls_context())


def _opener() -> urllib.request.OpenerDirector:
    """urllib's opener: the environment's proxies (HTTP(S)_PROXY, NO_PROXY), no redirects."""
    return urllib.request.build_opener(urllib.request.ProxyHandler(_proxies()), _NoRedirects, _VerifiedHTTPS)


def api_error(answer: Answer) -> WarmupError:
    """Turn an API error answer into the matching WarmupError (the server's `error` code decides)."""
    try:
        body = answer.json()
    except (ValueError, RecursionError):
        body = {}
    detail = body.get("detail") if isinstance(body, dict) else None
    if not isinstance(detail, dict):
        detail = {"message": detail if isinstance(detail, str) else answer.text[:500]}
    code = detail.get("error")
    message = detail.get("message") or f"HTTP {answer.status}"
    if code == "invalid_spec" or answer.status == 422:
        problems = [_FieldProblem(p.get("loc", ""), p.get("msg", "")) for p in detail.get("problems", [])]
        return SpecError(problems or message)
    if code == "not_warmed":
        return NotWarmedError(message)
    if code == "partly_warmed":
        return PartlyWarmedError(detail.get("missing", []), message)
    if code == "toolchain_mismatch":
        differences = {k: (v[0], v[1]) for k, v in detail.get("differences", {}).items()}
        return ToolchainMismatchError(differences)
    if answer.status in (401, 403):
        return AuthError(message, status=answer.status)
    return ServerError(f"{message} (HTTP {answer.status})", status=answer.status)


def _with_retries(
    call: Callable[[], Answer], *, what: str, attempts: int = 4, first_delay: float = 0.5
) -> Answer:
    """Retry transient failures (connection errors, 429 and 5xx) with exponential backoff."""
    delay = first_delay
    for attempt in range(1, attempts + 1):
        try:
            answer = call()
        except TransportError as error:
            if attempt == attempts:
                raise ServerUnreachableError(
                    f"cannot reach {what} ({error}); is the server running and "
                    "the URL right? (--server / WARMUP_SERVER)"
                ) from None
        else:
            if answer.status not in RETRYABLE_STATUS or attempt == attempts:
                return answer
            # A service that says when to come back (503 during a database restart) is believed.
            delay = max(delay, _retry_after_s(answer))
        time.sleep(delay)
        delay *= 2
    raise AssertionError("unreachable")


def _retry_after_s(answer: Answer, cap_s: float = 30.0) -> float:
    """Retry-After in seconds (the delta form; an HTTP date counts as absent), at most `cap_s`."""
    try:
        return min(cap_s, max(0.0, float(answer.headers.get("retry-after", 0))))
    except ValueError:
        return 0.0


# --- where blob bytes come from -----------------------------------------------------------------


class TransientDownloadError(StoreError):
    """A download failed in a way that may pass (connection dropped, 429, 5xx): it is retried."""


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
        if _proxied(url):
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

    def _through_proxy(self, url: str, headers: dict[str, str], what: str, *, api: bool) -> Any:
        try:
            return _opener().open(urllib.request.Request(url, headers=headers), timeout=self.timeout)
        except urllib.error.HTTPError as error:
            with error:
                answer = Answer(error.status or 0, error.headers, error.read(ERROR_BODY_BYTES))
            raise _http_error(answer, what, api=api) from None
        except (OSError, http.client.HTTPException) as error:
            raise TransientDownloadError(f"{what}: {type(error).__name__}: {error}") from error

    def _get(self, url: str, headers: dict[str, str], what: str) -> tuple[Any, http.client.HTTPResponse]:
        parts = urllib.parse.urlsplit(url)
        key = (parts.scheme, parts.hostname, parts.port)
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        connections = self._local.__dict__.setdefault("connections", {})
        for attempt in (1, 2):
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
                if reused and attempt == 1:  # the server closed a kept-alive connection: reconnect now
                    continue
                raise TransientDownloadError(f"{what}: {type(error).__name__}: {error}") from error
        raise AssertionError("unreachable")

    def _connect(self, parts: urllib.parse.SplitResult) -> http.client.HTTPConnection:
        if parts.scheme == "https":
            return http.client.HTTPSConnection(
                parts.hostname or "", parts.port, timeout=self.timeout, context=_tls_context()
            )
        if parts.scheme != "http":
            raise StoreError(f"cannot download from {parts.scheme!r} URLs: http or https only")
        return http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=self.timeout)

    def _drop(self, key: Any) -> None:
        connection = self._local.__dict__.get("connections", {}).pop(key, None)
        if connection is not None:
            connection.close()


def _http_chunks(response: http.client.HTTPResponse, what: str) -> Iterator[bytes]:
    yield from _read_chunks(response)
    if response.length:  # http.client ends a body cut short quietly (Content-Length not reached)
        raise TransientDownloadError(f"{what}: the connection closed {response.length} bytes before the end")


def _http_error(answer: Answer, what: str, *, api: bool) -> WarmupError:
    if answer.status in RETRYABLE_STATUS:
        return TransientDownloadError(f"{what}: HTTP {answer.status}")
    return api_error(answer) if api else StoreError(f"{what}: HTTP {answer.status}")


def _proxied(url: str) -> bool:
    parts = urllib.parse.urlsplit(url)
    return parts.scheme in _proxies() and not urllib.request.proxy_bypass(parts.hostname or "")


@functools.cache
def _proxies() -> dict[str, str]:
    return urllib.request.getproxies()


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """Verified TLS with certifi's CA bundle (SSL_CERT_FILE overrides): slim training
    images often have no system CA bundle."""
    import certifi

    return ssl.create_default_context(cafile=os.environ.get("SSL_CERT_FILE") or certifi.where())


@dataclass
class StoreBlobSource:
    """Blobs read straight from the blob store (S3 or a directory), streamed."""

    store: BlobStore

    @contextlib.contextmanager
    def open(self, file: ManifestFile) -> Iterator[Iterator[bytes]]:
        with contextlib.closing(self.store.open(file.sha256)) as handle:
            yield _read_chunks(handle)


def _read_chunks(handle: IO[bytes]) -> Iterator[bytes]:
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


def _retryable(error: BaseException) -> bool:
    return isinstance(error, TransientDownloadError)


# --- pull ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PullProgress:
    """Where an install stands: files done (skipped ones count as done) and bytes downloaded so far."""

    files_done: int
    files_total: int
    bytes_done: int
    bytes_total: int  # of the files that need downloading
    elapsed_s: float


ProgressCallback = Callable[[PullProgress], None]


@dataclass
class PullResult:
    manifest: Manifest
    dest: Path
    source: str = ""
    downloaded: int = 0
    skipped: int = 0
    bytes_downloaded: int = 0
    seconds: float = 0.0
    failures: list[tuple[str, BaseException]] = field(default_factory=list)

    @property
    def env(self) -> dict[str, str]:
        return self.manifest.environment(str(self.dest))


def pull(
    spec: Any,
    dest: str | Path,
    *,
    server: str | None = None,
    source: str | None = None,
    toolchain: Any = None,
    allow_partial: bool = False,
    wait: bool = False,
    timeout: float = 3600.0,
    poll_interval: float = 5.0,
    parallel: int = 16,
    token: str | None = None,
    on_progress: ProgressCallback | None = None,
    on_waiting: Callable[[WarmupError], None] | None = None,
    client: ServiceClient | None = None,
) -> PullResult:
    """Install the prewarmed cache of `spec` for this pod's toolchain into `dest`.

    From the service (`server`, or `client`), or without it from the bucket workers publish complete
    manifests into (`source="s3://bucket/prefix"`, or a local store directory). `spec` is a Spec, a
    mapping or a spec file path; `toolchain` defaults to this process's own (computed as a worker
    computes it). With `wait`, waits (up to `timeout` s) for a warm-up that is not finished, calling
    `on_waiting` with the reason each time. Raises NotWarmedError / PartlyWarmedError /
    WarmupFailedError / ToolchainMismatchError / ServerUnreachableError with what to do.
    """
    from warmup.spec import Spec, load_spec
    from warmup.toolchain import Toolchain, remember_toolchain, remembered_toolchain

    spec = spec if isinstance(spec, Spec) else load_spec(spec)
    target = spec.target
    computed = toolchain is None
    if computed:
        toolchain = remembered_toolchain(  # written into dest only once the pull has succeeded
            target.backend, target.device, world_size=target.world_size, directory=dest, remember=False
        )
    toolchain = toolchain if isinstance(toolchain, Toolchain) else Toolchain.model_validate(toolchain)
    if source is not None:
        result = _pull_from_store(
            spec,
            dest,
            toolchain,
            source,
            wait=wait,
            timeout=timeout,
            poll_interval=poll_interval,
            parallel=parallel,
            on_progress=on_progress,
            on_waiting=on_waiting,
        )
    elif client is None and server is None:
        raise WarmupError(
            "pull needs the service URL (--server / WARMUP_SERVER) or a bucket (--from s3://...)"
        )
    else:
        own_client = client is None
        client = client or ServiceClient(server or "", token=token)
        try:
            result = _pull_from_service(
                spec,
                dest,
                toolchain,
                client,
                allow_partial=allow_partial,
                wait=wait,
                timeout=timeout,
                poll_interval=poll_interval,
                parallel=parallel,
                on_progress=on_progress,
                on_waiting=on_waiting,
            )
        finally:
            if own_client:
                client.close()
    if computed:  # the next pull (or `warmup exec`) into this directory skips computing it
        remember_toolchain(result.dest, toolchain, world_size=target.world_size)
    return result


def _pull_from_service(
    spec: Spec,
    dest: str | Path,
    toolchain: Toolchain,
    client: ServiceClient,
    *,
    allow_partial: bool,
    wait: bool,
    timeout: float,
    poll_interval: float,
    parallel: int,
    on_progress: ProgressCallback | None,
    on_waiting: Callable[[WarmupError], None] | None,
) -> PullResult:
    spec_json, toolchain_json = spec.model_dump(mode="json"), toolchain.model_dump(mode="json")

    def fetch() -> Manifest:
        try:
            return client.manifest(spec_json, toolchain_json, allow_partial=allow_partial)
        except (NotWarmedError, PartlyWarmedError):
            _raise_if_failed(client, spec.key(), toolchain.key())
            raise

    manifest = _wait_for(fetch, wait, timeout, poll_interval, on_waiting)
    if (manifest.spec_key, manifest.toolchain_key) != (spec.key(), toolchain.key()):
        raise UnsafeArtifactError(
            f"refusing the manifest of {client.server}: it is for another spec or toolchain "
            f"({manifest.spec_key[:12]}/{manifest.toolchain_key[:12]}, not {spec.key()[:12]}/{toolchain.key()[:12]})"
        )
    result = install(
        manifest,
        dest,
        HttpBlobSource(client.server, client.auth_headers, client.timeout),
        parallel=parallel,
        on_progress=on_progress,
    )
    result.source = client.server
    return result


def _pull_from_store(
    spec: Spec,
    dest: str | Path,
    toolchain: Toolchain,
    source: str,
    *,
    wait: bool,
    timeout: float,
    poll_interval: float,
    parallel: int,
    on_progress: ProgressCallback | None,
    on_waiting: Callable[[WarmupError], None] | None,
) -> PullResult:
    from warmup.store import open_store

    store = open_store(source)
    manifest = _wait_for(
        lambda: bucket_manifest(store, spec.key(), toolchain), wait, timeout, poll_interval, on_waiting
    )
    if manifest.files and store.presigned_url(manifest.files[0].sha256, 60) is not None:
        # S3: sign each GET here (no request) and download as through the API, over kept-alive HTTP
        files = [
            f.model_copy(update={"url": store.presigned_url(f.sha256, PRESIGN_S)}) for f in manifest.files
        ]
        result = install(
            manifest.model_copy(update={"files": files}),
            dest,
            HttpBlobSource(None),
            parallel=parallel,
            on_progress=on_progress,
        )
    else:
        result = install(manifest, dest, StoreBlobSource(store), parallel=parallel, on_progress=on_progress)
    result.source = str(source)
    return result


def _wait_for(
    fetch: Callable[[], Manifest],
    wait: bool,
    timeout: float,
    poll_interval: float,
    on_waiting: Callable[[WarmupError], None] | None,
) -> Manifest:
    started = time.monotonic()
    while True:
        try:
            return fetch()
        except (NotWarmedError, PartlyWarmedError) as error:
            waited = time.monotonic() - started
            if not wait:
                raise
            if waited + poll_interval > timeout:
                error.args = (f"{error} (waited {waited:.0f}s; a longer --timeout waits longer)",)
                raise
            if on_waiting is not None:
                on_waiting(error)
            time.sleep(poll_interval)


def _raise_if_failed(client: ServiceClient, spec_key: str, toolchain_key: str) -> None:
    """A job that gave up on signatures will not become warm by waiting: say which, and what to do."""
    for summary in client.jobs(spec_key=spec_key, toolchain_key=toolchain_key):
        if summary.get("state") != "failed":
            continue
        job = client.job(summary["id"])
        failed = [s for s in job.get("signatures", []) if s.get("state") == "failed"]
        lines = "; ".join(
            f"{signature_label(s.get('signature') or {})}: {s.get('error') or 'failed'} "
            f"(log: GET /v1/tasks/{s.get('task_id')}/log)"
            for s in failed[:5]
        )
        raise WarmupFailedError(
            f"the warm-up of {len(failed)} signature(s) of this spec failed (job {summary['id']}): {lines}; "
            "fix the cause and resubmit with `warmup submit SPEC --retry-failed`, or install what is "
            "warm with --allow-partial"
        )


def signature_label(doc: dict[str, Any]) -> str:
    """`train 4x256`, from a signature's document as the API returns it."""
    label = f"{doc.get('phase')} {doc.get('batch')}x{doc.get('seq_len')}"
    return f"{label} cache {doc['cache_len']}" if doc.get("cache_len") else label


def bucket_manifest(store: BlobStore, spec_key: str, toolchain: Toolchain) -> Manifest:
    """The complete manifest a worker published for (spec, toolchain), read from the store.

    None for this toolchain but some for others: ToolchainMismatchError naming the fields that differ
    from the closest one. None at all: NotWarmedError (workers publish a manifest once every
    signature of the job is warm).
    """
    from warmup.toolchain import Toolchain

    key = manifest_object_key(spec_key, toolchain.key())
    try:
        raw = store.get_object(key, max_bytes=MAX_MANIFEST_BYTES)
    except BlobNotFoundError:
        differences: list[dict[str, tuple[Any, Any]]] = []
        for other in store.list_documents(f"{MANIFESTS_PREFIX}/{spec_key}/")[:20]:
            with contextlib.suppress(WarmupError, ValueError, KeyError):
                theirs = Toolchain.model_validate(json.loads(store.get_object(other))["toolchain"])
                differences.append(toolchain.diff(theirs))
        if differences:
            raise ToolchainMismatchError(min(differences, key=len)) from None
        raise NotWarmedError(
            f"no complete cache of this spec in {store.location} yet (workers publish it there once every "
            "signature is warm): submit the spec (`warmup submit SPEC`), wait for it (--wait), or pull "
            "through the service (--server) to see its progress or install part of it (--allow-partial)"
        ) from None
    try:
        data = json.loads(raw)
    except ValueError:
        raise UnsafeArtifactError(f"refusing manifest {key} in {store.location}: not JSON") from None
    manifest = parse_manifest(data)
    if (manifest.spec_key, manifest.toolchain_key) != (spec_key, toolchain.key()):
        raise UnsafeArtifactError(
            f"refusing manifest {key} in {store.location}: it names another spec or toolchain"
        )
    return manifest


def read_local_manifest(cache_dir: str | Path, spec_key: str) -> Manifest | None:
    """The manifest the last pull of `spec_key` installed into `cache_dir`, or None."""
    path = Path(cache_dir) / LOCAL_MANIFESTS_DIR / f"{spec_key}.json"
    try:
        return parse_manifest(json.loads(path.read_text()))
    except (OSError, ValueError, WarmupError):
        return None


def install(
    manifest: Manifest,
    dest: str | Path,
    source: BlobSource,
    *,
    parallel: int = 16,
    on_progress: ProgressCallback | None = None,
    attempts: int = DOWNLOAD_ATTEMPTS,
) -> PullResult:
    """Download and verify every file of `manifest` into `dest`; skip files already there and verified.

    All paths are checked before anything is written. Files are downloaded to temp files and renamed
    into place only once every one of them is verified: a failed install leaves `dest` as it was.
    """
    started = time.monotonic()
    dest = Path(dest).resolve()
    created = not dest.exists()  # a failed install removes it again: nothing is left behind
    for file in manifest.files:  # refuse a hostile manifest before writing anything
        check_relative_path(file.path)
        if not created:  # a new directory holds nothing a path could run into
            _refuse_symlinks(dest, file.path)
    files = _unique_paths(manifest.files)
    _refuse_own_state_links(dest)
    dest.mkdir(parents=True, exist_ok=True)
    index = _Index.load(dest)
    result = PullResult(manifest=manifest, dest=dest)
    todo = files if created else [file for file in files if not index.verified(dest, file)]
    result.skipped = len(files) - len(todo)
    try:
        _refuse_more_than_fits(dest, todo)
    except UnsafeArtifactError:
        if created:
            dest.rmdir()
        raise
    lock = threading.Lock()
    streamed = 0
    done = result.skipped
    bytes_total = sum(f.size for f in todo)
    staged: dict[str, Path] = {}
    made: list[Path] = []  # folders this install created: removed again if it fails
    installed = False
    temp_dir = dest / TEMP_DIR_NAME

    def report() -> None:
        if on_progress:
            on_progress(PullProgress(done, len(files), streamed, bytes_total, time.monotonic() - started))

    def count(size: int) -> None:
        nonlocal streamed
        with lock:
            streamed += size

    queue = iter(todo)
    stop = threading.Event()  # set when a file has failed, or the install was interrupted

    def download() -> None:
        """One download thread: takes the next file until none is left or the install stops."""
        nonlocal done
        while not stop.is_set():
            with lock:
                file = next(queue, None)
            if file is None:
                return
            try:
                staged_path = _download_one(temp_dir, file, source, count, attempts)
            except BaseException as error:
                with lock:  # one failure fails the install: the others stop after their current file
                    result.failures.append((file.path, error))
                stop.set()
                return
            with lock:
                staged[file.path] = staged_path
                result.downloaded += 1
                result.bytes_downloaded += file.size
                done += 1
                report()

    try:
        if todo:
            temp_dir.mkdir(exist_ok=True)
        # Before the downloads start: with them running, each mkdir would wait for the GIL.
        _make_folders(dest, todo, made)
        # Plain threads taking files from one queue: a future per file would wake this thread for
        # each, and with hundreds of small files every wake-up competes for the GIL.
        threads = [
            threading.Thread(target=download, name=f"warmup-pull-{n}", daemon=True)
            for n in range(min(max(1, parallel), len(todo)))
        ]
        try:
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        except BaseException:  # interrupted: let the threads finish their current file, then clean up
            stop.set()
            for thread in threads:
                if thread.is_alive():
                    thread.join()
            raise
        if not result.failures:
            for file in todo:  # every file verified: now, and only now, install them
                os.replace(staged.pop(file.path), dest / file.path)
                index.record(dest, file)
            _save_local_manifest(dest, manifest)
            installed = True
    finally:
        for leftover in staged.values():
            leftover.unlink(missing_ok=True)
        if index.changed and installed:  # a failed install leaves dest as it was
            index.save(dest)
        with contextlib.suppress(OSError):
            temp_dir.rmdir()
        if not installed:
            for folder in reversed(made):
                with contextlib.suppress(OSError):
                    folder.rmdir()
            if created:
                with contextlib.suppress(OSError):
                    dest.rmdir()
    result.seconds = time.monotonic() - started
    if result.failures:
        path, error = result.failures[0]
        kind = type(error) if isinstance(error, WarmupError) else StoreError
        remedy = ""
        if kind is TransientDownloadError or _retryable(error):
            kind = StoreError
            remedy = (
                f" (tried {attempts} times: check that the blob store is up and reachable from here, "
                "then pull again)"
            )
        raise kind(
            f"{len(result.failures)} of {len(todo)} file(s) failed, nothing was installed; first: {path}: "
            f"{error}{remedy}"
        )
    report()
    return result


def _unique_paths(files: list[ManifestFile]) -> list[ManifestFile]:
    """The files by path; refuses a path listed twice with different contents, or as a file and a folder."""
    by_path: dict[str, ManifestFile] = {}
    for file in files:
        other = by_path.setdefault(file.path, file)
        if other.sha256 != file.sha256 or other.size != file.size:
            raise UnsafeArtifactError(f"manifest lists {file.path!r} twice with different contents")
    folders = {parent for path in by_path for parent in _parents(path)}
    clash = sorted(folders & set(by_path))
    if clash:
        raise UnsafeArtifactError(
            f"manifest lists {clash[0]!r} both as a file and as a folder of other files"
        )
    return list(by_path.values())


def _make_folders(dest: Path, files: list[ManifestFile], made: list[Path]) -> None:
    """Create the folders `files` go into, parents first, recording in `made` those that were new."""
    folders = {folder for file in files for folder in _parents(file.path)}
    for folder in sorted(folders, key=lambda relative: relative.count("/")):
        try:
            os.mkdir(dest / folder)
        except FileExistsError:
            continue
        made.append(dest / folder)


def _parents(path: str) -> list[str]:
    parts = path.split("/")
    return ["/".join(parts[:end]) for end in range(1, len(parts))]


def _refuse_symlinks(dest: Path, relative: str) -> None:
    """Refuse a path whose existing parts inside dest include a symlink (it could point anywhere), or a
    file where a folder must be, or a folder where the file goes: installing would fail half-way."""
    current = dest
    parts = relative.split("/")
    for depth, part in enumerate(parts, start=1):
        current = current / part
        if current.is_symlink():
            raise UnsafeArtifactError(
                f"{relative!r} goes through a symlink in {dest}; refusing to write there"
            )
        if not current.exists():
            return
        if depth < len(parts) and not current.is_dir():
            raise UnsafeArtifactError(
                f"{relative!r}: {current} is a file, not a folder; refusing to replace it"
            )
        if depth == len(parts) and not current.is_file():
            raise UnsafeArtifactError(
                f"{relative!r}: {current} is not a regular file; refusing to replace it"
            )


def _refuse_own_state_links(dest: Path) -> None:
    """The client's own files and folders in dest are never symlinks: they would send its writes elsewhere."""
    for name in (TEMP_DIR_NAME, LOCAL_MANIFESTS_DIR, INDEX_NAME):
        if (dest / name).is_symlink():
            raise UnsafeArtifactError(f"{dest / name} is a symlink; refusing to write through it")


def _refuse_more_than_fits(dest: Path, todo: list[ManifestFile]) -> None:
    """A manifest whose files do not fit on the disk is refused before the disk is filled."""
    needed = sum(file.size for file in todo)
    free = shutil.disk_usage(dest).free
    if needed > free:
        raise UnsafeArtifactError(
            f"the manifest's files need {needed} bytes and {dest} has {free} free; refusing to fill the disk"
        )


def _download_one(
    temp_dir: Path, file: ManifestFile, source: BlobSource, count: Callable[[int], None], attempts: int
) -> Path:
    """Download one blob into a verified temp file in `temp_dir`; transient failures are retried."""
    delay = 0.5
    for attempt in range(1, attempts + 1):
        handle, name = tempfile.mkstemp(dir=temp_dir, prefix=file.sha256[:12])
        try:
            with os.fdopen(handle, "wb") as out:
                os.fchmod(out.fileno(), 0o644)  # the training container may run as another user
                digest = hashlib.sha256()
                size = _copy_stream(file, source, out, digest, count)
            if size != file.size:
                raise BlobIntegrityError(f"size {size} != expected {file.size} for blob {file.sha256[:12]}")
            if digest.hexdigest() != file.sha256:
                raise BlobIntegrityError(
                    f"sha256 mismatch for {file.path} (blob {file.sha256[:12]} is corrupt in the store)"
                )
            return Path(name)
        except BaseException as error:
            with contextlib.suppress(OSError):
                os.unlink(name)
            if attempt == attempts or not _retryable(error):
                raise
        time.sleep(delay)
        delay *= 2
    raise AssertionError("unreachable")


def _copy_stream(
    file: ManifestFile, source: BlobSource, out: IO[bytes], digest: Any, count: Callable[[int], None]
) -> int:
    size = 0
    with source.open(file) as chunks:
        for chunk in chunks:
            size += len(chunk)
            if size > file.size:
                raise BlobIntegrityError(
                    f"blob {file.sha256[:12]} is larger than the {file.size} bytes expected"
                )
            digest.update(chunk)
            out.write(chunk)
            count(len(chunk))
    return size


def _save_local_manifest(dest: Path, manifest: Manifest) -> None:
    folder = dest / LOCAL_MANIFESTS_DIR
    folder.mkdir(exist_ok=True)
    _write_replacing(
        folder / f"{manifest.spec_key}.json", json.dumps(manifest.without_urls().model_dump(mode="json"))
    )


def _write_replacing(path: Path, text: str) -> None:
    """Write `path` atomically through a new temp file: never through a symlink planted at a fixed name."""
    handle, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(handle, "w") as out:
            os.fchmod(out.fileno(), 0o644)
            out.write(text)
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise


@dataclass
class _Index:
    """What this directory already holds, verified: path -> (sha256, size, mtime_ns)."""

    files: dict[str, list[Any]]
    changed: bool = False

    @classmethod
    def load(cls, dest: Path) -> _Index:
        try:
            data = json.loads((dest / INDEX_NAME).read_text())
            return cls(files=dict(data.get("files", {})))
        except (OSError, ValueError, AttributeError):
            return cls(files={})

    def verified(self, dest: Path, file: ManifestFile) -> bool:
        target = dest / file.path
        try:
            stat = target.lstat()
        except OSError:
            return False
        if not target.is_file() or target.is_symlink() or stat.st_size != file.size:
            return False
        known = self.files.get(file.path)
        if known == [file.sha256, stat.st_size, stat.st_mtime_ns]:
            return True
        if _sha256_of(target) == file.sha256:  # present but unknown to the index: verify once
            self.files[file.path] = [file.sha256, stat.st_size, stat.st_mtime_ns]
            self.changed = True
            return True
        return False

    def record(self, dest: Path, file: ManifestFile) -> None:
        stat = (dest / file.path).lstat()
        self.files[file.path] = [file.sha256, stat.st_size, stat.st_mtime_ns]
        self.changed = True

    def save(self, dest: Path) -> None:
        _write_replacing(dest / INDEX_NAME, json.dumps({"files": self.files}))


def _sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()
