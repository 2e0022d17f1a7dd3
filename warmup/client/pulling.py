"""`pull`: the manifest of (spec, toolchain), from the service or the bucket, then `install`.

`pull` is `prepare_pull` (the pod's toolchain, computed or taken, and the manifest of (spec,
toolchain) from the service or from the bucket the workers publish complete manifests into, waiting
for a warm-up that is not finished when asked to) and then its `PendingInstall.run()`: `install`
(warmup/client/installing.py) and remembering the toolchain. `warmup exec` runs the second half
beside the training command's start (warmup/client/background.py).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from warmup.client.installing import ProgressCallback, PullResult, install
from warmup.client.service import MAX_MANIFEST_BYTES, ServiceClient, signature_label
from warmup.client.sources import BlobSource, HttpBlobSource, StoreBlobSource
from warmup.errors import (
    BlobNotFoundError,
    NotWarmedError,
    PartlyWarmedError,
    ToolchainMismatchError,
    UnsafeArtifactError,
    WarmupError,
    WarmupFailedError,
)
from warmup.formatting import short_id
from warmup.manifest import MANIFESTS_PREFIX, Manifest, manifest_object_key, parse_manifest

if TYPE_CHECKING:
    from warmup.job.spec import Spec
    from warmup.store import BlobStore
    from warmup.toolchain.model import Toolchain

PRESIGN_S = 6 * 3600  # URLs signed by a pod pulling from the bucket: long enough for the largest pull


@dataclass(frozen=True)
class PullOptions:
    """How a pull waits for a warm-up that is not finished, and how it downloads."""

    wait: bool = False
    timeout: float = 3600.0
    poll_interval: float = 5.0
    parallel: int = 16
    on_progress: ProgressCallback | None = None
    on_waiting: Callable[[WarmupError], None] | None = None


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
    options = PullOptions(
        wait=wait,
        timeout=timeout,
        poll_interval=poll_interval,
        parallel=parallel,
        on_progress=on_progress,
        on_waiting=on_waiting,
    )
    pending = prepare_pull(
        spec,
        dest,
        server=server,
        source=source,
        toolchain=toolchain,
        allow_partial=allow_partial,
        token=token,
        client=client,
        options=options,
    )
    return pending.run()


@dataclass
class PendingInstall:
    """A pull whose manifest is known and whose files are not installed yet: `run()` installs them.

    `pull` runs it at once; `warmup exec` runs it beside the training command's start
    (warmup/client/background.py), since the manifest alone sets that command's environment."""

    manifest: Manifest
    spec: Spec
    dest: Path
    blobs: BlobSource
    source: str  # where the manifest came from, for the summary
    toolchain: Toolchain
    toolchain_source: str  # how the toolchain was found: given, remembered, exact, predicted, computed
    world_size: int
    options: PullOptions

    def run(self) -> PullResult:
        """Download and verify the files (all or none), then remember the toolchain a pod had to find."""
        from warmup.toolchain.memo import remember_toolchain

        result = install(
            self.manifest,
            self.dest,
            self.blobs,
            parallel=self.options.parallel,
            on_progress=self.options.on_progress,
            spec=self.spec,
        )
        result.source = self.source
        result.toolchain_source = self.toolchain_source
        if self.toolchain_source != "given":  # the next pull (or `warmup exec`) here skips finding it
            remember_toolchain(result.dest, self.toolchain, world_size=self.world_size)
        return result


def prepare_pull(
    spec: Any,
    dest: str | Path,
    *,
    server: str | None = None,
    source: str | None = None,
    toolchain: Any = None,
    allow_partial: bool = False,
    token: str | None = None,
    client: ServiceClient | None = None,
    options: PullOptions | None = None,
) -> PendingInstall:
    """The first half of `pull` (same arguments): this pod's toolchain and the manifest of (spec,
    toolchain), checked; nothing is written into `dest` until the returned install runs."""
    from warmup.job.spec import Spec, load_spec
    from warmup.toolchain.memo import resolve_toolchain
    from warmup.toolchain.model import Toolchain

    options = options or PullOptions()
    spec = spec if isinstance(spec, Spec) else load_spec(spec)
    target = spec.target
    how = "given"
    if toolchain is None:
        toolchain, how = resolve_toolchain(  # written into dest only once the install has succeeded
            target.backend, target.device, world_size=target.world_size, directory=dest, remember=False
        )
    toolchain = toolchain if isinstance(toolchain, Toolchain) else Toolchain.model_validate(toolchain)
    if source is not None:
        manifest, blobs, where = store_manifest(spec, toolchain, source, options)
    elif client is None and server is None:
        raise WarmupError(
            "pull needs the service URL (--server / WARMUP_SERVER) or a bucket (--from s3://...)"
        )
    else:
        own_client = client is None
        client = client or ServiceClient(server or "", token=token)
        try:
            manifest = service_manifest(spec, toolchain, client, options, allow_partial=allow_partial)
        finally:
            if own_client:
                client.close()
        blobs, where = HttpBlobSource(client.server, client.auth_headers, client.timeout), client.server
    return PendingInstall(
        manifest=manifest,
        spec=spec,
        dest=Path(dest).resolve(),
        blobs=blobs,
        source=where,
        toolchain=toolchain,
        toolchain_source=how,
        world_size=target.world_size,
        options=options,
    )


def service_manifest(
    spec: Spec,
    toolchain: Toolchain,
    client: ServiceClient,
    options: PullOptions,
    *,
    allow_partial: bool = False,
) -> Manifest:
    """The manifest from the service's API (its files' URLs presigned, or the API's blob route)."""
    spec_json, toolchain_json = spec.model_dump(mode="json"), toolchain.model_dump(mode="json")

    def fetch() -> Manifest:
        try:
            return client.manifest(spec_json, toolchain_json, allow_partial=allow_partial)
        except (NotWarmedError, PartlyWarmedError):
            _raise_if_failed(client, spec.key(), toolchain.key())
            raise

    manifest = wait_for(fetch, options)
    if (manifest.spec_key, manifest.toolchain_key) != (spec.key(), toolchain.key()):
        raise UnsafeArtifactError(
            f"refusing the manifest of {client.server}: it is for another spec or toolchain "
            f"({manifest.spec_key[:12]}/{manifest.toolchain_key[:12]}, not {spec.key()[:12]}/{toolchain.key()[:12]})"
        )
    return manifest


def store_manifest(
    spec: Spec, toolchain: Toolchain, source: str, options: PullOptions
) -> tuple[Manifest, BlobSource, str]:
    """The complete manifest a worker published in the bucket, and the bucket as the blobs' source."""
    from warmup.store import open_store

    store = open_store(source)
    manifest = wait_for(lambda: bucket_manifest(store, spec.key(), toolchain), options)
    if manifest.files and store.presigned_url(manifest.files[0].sha256, 60) is not None:
        # S3: sign each GET here (no request) and download as through the API, over kept-alive HTTP
        files = [
            f.model_copy(update={"url": store.presigned_url(f.sha256, PRESIGN_S)}) for f in manifest.files
        ]
        return manifest.model_copy(update={"files": files}), HttpBlobSource(None), str(source)
    return manifest, StoreBlobSource(store), str(source)


def wait_for(fetch: Callable[[], Manifest], options: PullOptions) -> Manifest:
    """`fetch()`, again every `poll_interval` s while the warm-up is not finished (with `wait`)."""
    started = time.monotonic()
    while True:
        try:
            return fetch()
        except (NotWarmedError, PartlyWarmedError) as error:
            waited = time.monotonic() - started
            if not options.wait:
                raise
            if waited + options.poll_interval > options.timeout:
                error.args = (f"{error} (waited {waited:.0f}s; a longer --timeout waits longer)",)
                raise
            if options.on_waiting is not None:
                options.on_waiting(error)
            time.sleep(options.poll_interval)


def _raise_if_failed(client: ServiceClient, spec_key: str, toolchain_key: str) -> None:
    """A job that gave up on planned signatures will not become warm by waiting: say which, and what to do.
    (What training runs reported never fails a job: those signatures are evidence, not the job.)"""
    for summary in client.jobs(spec_key=spec_key, toolchain_key=toolchain_key):
        if summary.get("state") != "failed":
            continue
        job = client.job(summary["id"])
        failed = [
            s
            for s in job.get("signatures", [])
            if s.get("state") == "failed" and s.get("source", "plan") == "plan"
        ]
        lines = "; ".join(
            f"{signature_label(s.get('signature') or {})}: {s.get('error') or 'failed'} "
            f"(log: GET /v1/tasks/{s.get('task_id')}/log)"
            for s in failed[:5]
        )
        raise WarmupFailedError(
            f"the warm-up of {len(failed)} planned signature(s) of this spec failed (job {short_id(summary['id'])}): "
            f"{lines}; {failed_advice(failed)}"
        )


def failed_advice(failed: list[dict[str, Any]]) -> str:
    """What can make failed signatures warm. A worker that gave up after several attempts met something that
    may pass (a crash, a time limit, the store away): queuing them again can succeed. One it refused at the
    first attempt refuses again until the cause it named is fixed on the workers (a cause in the spec is a
    new spec, so a new job). `--allow-partial` installs the rest; training compiles a missing shape when it
    meets one, and under --strict stops there instead."""
    retried = all(int(s.get("attempts") or 0) > 1 for s in failed)
    again = (
        "if the cause has passed, `warmup submit SPEC --retry-failed` queues them again"
        if retried
        else "the workers refused them: fix the cause named above on the workers, then `warmup submit SPEC "
        "--retry-failed` (a cause in the spec needs a changed spec, which is another job)"
    )
    return (
        f"{again}; or install what is warm with --allow-partial (a run that meets one of these shapes "
        "compiles it; under --strict it stops there)"
    )


def bucket_manifest(store: BlobStore, spec_key: str, toolchain: Toolchain) -> Manifest:
    """The complete manifest a worker published for (spec, toolchain), read from the store.

    None for this toolchain but some for others: ToolchainMismatchError naming the fields that differ
    from the closest one. None at all: NotWarmedError (workers publish a manifest once every
    signature of the job is warm).
    """
    from warmup.toolchain.model import Toolchain

    key = manifest_object_key(spec_key, toolchain.key())
    try:
        raw = store.get_object(key, max_bytes=MAX_MANIFEST_BYTES)
    except BlobNotFoundError:
        differences: list[dict[str, tuple[Any, Any]]] = []
        for other in store.list_documents(f"{MANIFESTS_PREFIX}/{spec_key}/")[:20]:
            with contextlib.suppress(WarmupError, ValueError, KeyError):
                theirs = Toolchain.model_validate(json.loads(store.get_object(other))["toolchain"])
                differences.append(toolchain.diff(theirs))
        # An empty difference is our own manifest, published since the read above missed it.
        differences = [found for found in differences if found]
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
