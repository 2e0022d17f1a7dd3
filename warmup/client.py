"""The HTTP client of the service, and `pull`: install a verified, prewarmed cache on a training pod.

Pod-side code: needs only the base install (httpx, pydantic), never fastapi or sqlalchemy.

`pull` computes (or takes) the pod's toolchain, asks the service for the manifest of (spec,
toolchain), downloads the blobs in parallel over kept-alive connections, checks every sha256, and
installs each file by writing a temp file and renaming it into place. Files already present with the
right hash are skipped (a small index remembers what was verified, so a second pull is a stat per
file). Paths that would land outside the destination are refused before anything is written.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import json
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol

import httpx

from warmup.errors import (
    AuthError,
    BlobIntegrityError,
    NotWarmedError,
    PartlyWarmedError,
    ServerError,
    ServerUnreachableError,
    SpecError,
    StoreError,
    ToolchainMismatchError,
    UnsafeArtifactError,
    WarmupError,
)
from warmup.errors import FieldProblem as _FieldProblem
from warmup.manifest import Manifest, ManifestFile, check_relative_path, parse_manifest

DEFAULT_TIMEOUT = httpx.Timeout(30.0, connect=10.0)
CHUNK = 1 << 20
INDEX_NAME = ".warmup-index.json"
TEMP_DIR_NAME = ".warmup-tmp"
RETRYABLE_STATUS = {429, 500, 502, 503, 504}


# --- the service's HTTP API ---------------------------------------------------------------------


class ServiceClient:
    """A small typed client of the trl-warmup API. Timeouts are on by default; the token comes from
    the argument or WARMUP_TOKEN."""

    def __init__(
        self,
        server: str,
        *,
        token: str | None = None,
        timeout: httpx.Timeout = DEFAULT_TIMEOUT,
        max_connections: int = 32,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.server = server.rstrip("/")
        token = token or os.environ.get("WARMUP_TOKEN")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(
            base_url=self.server,
            headers=headers,
            timeout=timeout,
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
            transport=transport,
        )

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> ServiceClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        """One API call with retries on connection errors and 5xx; API errors become WarmupErrors."""
        response = _with_retries(
            lambda: self.http.request(method, path, **kwargs), what=f"{self.server}{path}"
        )
        if response.status_code >= 400:
            raise api_error(response)
        return response.json() if response.content else None

    def plan(self, spec: dict[str, Any]) -> dict[str, Any]:
        return self.request("POST", "/v1/plans", json={"spec": spec})

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
        return self.request("POST", "/v1/warmups", json=body)

    def job(self, job_id: str) -> dict[str, Any]:
        return self.request("GET", f"/v1/warmups/{job_id}")

    def manifest(
        self, spec: dict[str, Any], toolchain: dict[str, Any], *, allow_partial: bool = False
    ) -> Manifest:
        body = {"spec": spec, "toolchain": toolchain, "allow_partial": allow_partial}
        return parse_manifest(self.request("POST", "/v1/manifests", json=body))

    def post_coverage(self, report: dict[str, Any]) -> dict[str, Any]:
        return self.request("POST", "/v1/coverage", json=report)


def api_error(response: httpx.Response) -> WarmupError:
    """Turn an API error answer into the matching WarmupError (the server's `error` code decides)."""
    try:
        body = response.json()
    except ValueError:
        body = {}
    detail = body.get("detail") if isinstance(body, dict) else None
    if not isinstance(detail, dict):
        detail = {"message": detail if isinstance(detail, str) else response.text[:500]}
    code = detail.get("error")
    message = detail.get("message") or f"HTTP {response.status_code}"
    if code == "invalid_spec" or response.status_code == 422:
        problems = [_FieldProblem(p.get("loc", ""), p.get("msg", "")) for p in detail.get("problems", [])]
        return SpecError(problems or message)
    if code == "not_warmed":
        return NotWarmedError(message)
    if code == "partly_warmed":
        return PartlyWarmedError(detail.get("missing", []), message)
    if code == "toolchain_mismatch":
        differences = {k: (v[0], v[1]) for k, v in detail.get("differences", {}).items()}
        return ToolchainMismatchError(differences)
    if response.status_code in (401, 403):
        return AuthError(message, status=response.status_code)
    return ServerError(f"{message} (HTTP {response.status_code})", status=response.status_code)


def _with_retries(
    call: Callable[[], httpx.Response], *, what: str, attempts: int = 4, first_delay: float = 0.5
) -> httpx.Response:
    """Retry transient failures (connection errors, 429 and 5xx) with exponential backoff."""
    delay = first_delay
    for attempt in range(1, attempts + 1):
        try:
            response = call()
        except httpx.TransportError as error:
            if attempt == attempts:
                raise ServerUnreachableError(
                    f"cannot reach {what} ({type(error).__name__}: {error}); is the server running and the URL right?"
                ) from None
        else:
            if response.status_code not in RETRYABLE_STATUS or attempt == attempts:
                return response
        time.sleep(delay)
        delay *= 2
    raise AssertionError("unreachable")


# --- pull ---------------------------------------------------------------------------------------


class BlobSource(Protocol):
    """Where blob bytes come from: presigned/API URLs, or the bucket itself."""

    def open(self, file: ManifestFile) -> contextlib.AbstractContextManager[Iterator[bytes]]: ...


@dataclass
class HttpBlobSource:
    """Presigned URLs from the manifest, else the API's own blob route."""

    http: httpx.Client
    server: str | None

    @contextlib.contextmanager
    def open(self, file: ManifestFile) -> Iterator[Iterator[bytes]]:
        url = file.url or f"{self.server}/v1/blobs/{file.sha256}"
        with self.http.stream("GET", url) as response:
            if response.status_code >= 400:
                response.read()
                raise (
                    api_error(response)
                    if file.url is None
                    else StoreError(
                        f"download of blob {file.sha256[:12]} failed: HTTP {response.status_code}"
                    )
                )
            yield response.iter_bytes(CHUNK)


@dataclass
class PullResult:
    manifest: Manifest
    dest: Path
    downloaded: int = 0
    skipped: int = 0
    bytes_downloaded: int = 0
    seconds: float = 0.0
    failures: list[tuple[str, BaseException]] = field(default_factory=list)

    @property
    def env(self) -> dict[str, str]:
        return self.manifest.environment(str(self.dest))


ProgressCallback = Callable[[int, int, int], None]  # files done, files total, bytes done


def pull(
    spec: Any,
    dest: str | Path,
    *,
    server: str | None = None,
    toolchain: Any = None,
    allow_partial: bool = False,
    wait: bool = False,
    timeout: float = 3600.0,
    poll_interval: float = 5.0,
    parallel: int = 16,
    token: str | None = None,
    on_progress: ProgressCallback | None = None,
    client: ServiceClient | None = None,
) -> PullResult:
    """Install the prewarmed cache of `spec` for this pod's toolchain into `dest`.

    `spec` is a Spec, a mapping or a spec file path; `toolchain` defaults to this process's own
    (computed as a worker computes it). With `wait`, waits (up to `timeout` s) for a warm-up that
    is not finished. Raises NotWarmedError / PartlyWarmedError / ToolchainMismatchError /
    ServerUnreachableError with what to do.
    """
    from warmup.spec import Spec, load_spec

    spec = spec if isinstance(spec, Spec) else load_spec(spec)
    if toolchain is None:
        from warmup.toolchain import current_toolchain

        toolchain = current_toolchain(spec.target.backend, spec.target.device)
    toolchain_json = toolchain if isinstance(toolchain, dict) else toolchain.model_dump(mode="json")
    if client is None and server is None:
        raise WarmupError("pull needs a server URL (--server) or a bucket (--from s3://...)")
    own_client = client is None
    client = client or ServiceClient(server or "", token=token, max_connections=parallel)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                manifest = client.manifest(
                    spec.model_dump(mode="json"), toolchain_json, allow_partial=allow_partial
                )
                break
            except (NotWarmedError, PartlyWarmedError):
                if not wait or time.monotonic() + poll_interval > deadline:
                    raise
                time.sleep(poll_interval)
        return install(
            manifest,
            dest,
            HttpBlobSource(client.http, client.server),
            parallel=parallel,
            on_progress=on_progress,
        )
    finally:
        if own_client:
            client.close()


def install(
    manifest: Manifest,
    dest: str | Path,
    source: BlobSource,
    *,
    parallel: int = 16,
    on_progress: ProgressCallback | None = None,
) -> PullResult:
    """Download and verify every file of `manifest` into `dest`; skip files already there and verified.

    All paths are checked before anything is written; a failed file leaves no partial file behind.
    """
    started = time.monotonic()
    dest = Path(dest).resolve()
    for file in manifest.files:  # refuse a hostile manifest before writing anything
        check_relative_path(file.path)
        _refuse_symlinks(dest, file.path)
    dest.mkdir(parents=True, exist_ok=True)
    index = _Index.load(dest)
    result = PullResult(manifest=manifest, dest=dest)
    todo = [file for file in _unique_paths(manifest.files) if not index.verified(dest, file)]
    result.skipped = len(manifest.files) - len(todo)
    lock = threading.Lock()
    done = result.skipped

    def fetch(file: ManifestFile) -> None:
        nonlocal done
        written = _download_one(dest, file, source)
        with lock:
            index.record(dest, file)
            result.downloaded += 1
            result.bytes_downloaded += written
            done += 1
            if on_progress:
                on_progress(done, len(manifest.files), result.bytes_downloaded)

    temp_dir = dest / TEMP_DIR_NAME
    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
            futures = {pool.submit(fetch, file): file for file in todo}
            for future in concurrent.futures.as_completed(futures):
                error = future.exception()
                if error is not None:
                    result.failures.append((futures[future].path, error))
    finally:
        index.save(dest)
        with contextlib.suppress(OSError):
            temp_dir.rmdir()
    result.seconds = time.monotonic() - started
    if result.failures:
        path, error = result.failures[0]
        kind = (
            type(error) if isinstance(error, StoreError | ServerError | UnsafeArtifactError) else StoreError
        )
        raise kind(
            f"{len(result.failures)} of {len(todo)} file(s) failed, nothing partial was installed; "
            f"first: {path}: {error}"
        )
    return result


def _unique_paths(files: list[ManifestFile]) -> list[ManifestFile]:
    by_path: dict[str, ManifestFile] = {}
    for file in files:
        other = by_path.setdefault(file.path, file)
        if other.sha256 != file.sha256:
            raise UnsafeArtifactError(f"manifest lists {file.path!r} twice with different contents")
    return list(by_path.values())


def _refuse_symlinks(dest: Path, relative: str) -> None:
    """Refuse a path whose existing parts inside dest include a symlink (it could point anywhere)."""
    current = dest
    for part in relative.split("/"):
        current = current / part
        if current.is_symlink():
            raise UnsafeArtifactError(
                f"{relative!r} goes through a symlink in {dest}; refusing to write there"
            )
        if not current.exists():
            return


def _download_one(dest: Path, file: ManifestFile, source: BlobSource) -> int:
    target = dest / file.path
    target.parent.mkdir(parents=True, exist_ok=True)
    temp_dir = dest / TEMP_DIR_NAME
    temp_dir.mkdir(exist_ok=True)
    digest = hashlib.sha256()
    size = 0
    handle, temp_name = tempfile.mkstemp(dir=temp_dir, prefix=file.sha256[:12])
    try:
        with os.fdopen(handle, "wb") as out:
            size = _copy_stream(file, source, out, digest)
        if size != file.size:
            raise BlobIntegrityError(f"size {size} != expected {file.size} for blob {file.sha256[:12]}")
        if digest.hexdigest() != file.sha256:
            raise BlobIntegrityError(f"sha256 mismatch for {file.path} (blob {file.sha256[:12]} is corrupt)")
        os.replace(temp_name, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp_name)
        raise
    return size


def _copy_stream(file: ManifestFile, source: BlobSource, out: IO[bytes], digest: Any) -> int:
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
    return size


@dataclass
class _Index:
    """What this directory already holds, verified: path -> (sha256, size, mtime_ns)."""

    files: dict[str, list[Any]]

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
            return True
        return False

    def record(self, dest: Path, file: ManifestFile) -> None:
        stat = (dest / file.path).lstat()
        self.files[file.path] = [file.sha256, stat.st_size, stat.st_mtime_ns]

    def save(self, dest: Path) -> None:
        temp = dest / f"{INDEX_NAME}.tmp"
        temp.write_text(json.dumps({"files": self.files}))
        os.replace(temp, dest / INDEX_NAME)


def _sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()
