"""Store faults: S3 unreachable, slow, or failing one request in five, during worker uploads and pod pulls.

Everything talks to the real SeaweedFS S3 server through tests/support/fault_proxy.py (AWS_ENDPOINT_URL
points at the proxy, so presigned URLs do too). What must hold: retries absorb the faults, or the
operation fails with a reason that names the store, and nothing is half-published (no entry or
manifest that lists a blob the store lacks) or half-installed (a failed pull leaves the cache
directory as it was).

The worker is the real `Worker` (claim, heartbeat, reserve, upload, complete, publish the manifest);
only its rehearsal is replaced by one that lays out three artifact files per signature as Inductor
does, because compiling is not what these tests are about and takes 20-50 s per signature.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from tests.reliability.audit import audit_store
from tests.reliability.ledger import Row, record
from tests.support.fault_proxy import FaultProxy
from tests.support.live_server import serve
from tests.support.pods import play_worker, publish
from tests.support.tiny_model import write_tiny_model
from warmup.api.services import Services
from warmup.artifacts import ArtifactFile
from warmup.client.pulling import pull
from warmup.db import models as m
from warmup.db.engine import make_engine
from warmup.db.queue import TaskQueue
from warmup.db.records import Keyed
from warmup.db.repository import Repository
from warmup.errors import StoreError, StoreUnreachableError
from warmup.job.spec import Spec, load_spec
from warmup.manifest import MANIFESTS_PREFIX, manifest_object_key
from warmup.planner.planning import plan_spec
from warmup.rehearsal.runner import SignatureResult
from warmup.retry import RETRY_VARIABLE
from warmup.settings import Settings
from warmup.store import MiB, S3BlobStore, blob_key
from warmup.toolchain.memo import remember_toolchain
from warmup.toolchain.model import Toolchain
from warmup.toolchain.probes import current_toolchain
from warmup.worker.loop import Worker, WorkerOptions

PREFIX = "warmup"
ONE_IN = 5  # the flaky store fails every 5th request


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("model"))


@pytest.fixture(scope="module")
def toolchain() -> Toolchain:
    return current_toolchain("inductor", "cpu")


def make_spec(model_dir: Path, max_length: int) -> Spec:
    """An SFT spec of the tiny model: 2 signatures at max_length 64, 8 at 256."""
    return load_spec(spec_doc(model_dir, max_length))


def spec_doc(model_dir: Path, max_length: int) -> dict[str, Any]:
    return {
        "trainer": "sft",
        "model": str(model_dir),
        "args": {
            "per_device_train_batch_size": 2,
            "max_length": max_length,
            "pad_to_multiple_of": 32,
            "torch_compile": True,
        },
        "data": {"num_train_examples": 64, "min_tokens": 10, "max_tokens": max_length - 6},
        "target": {"backend": "inductor", "device": "cpu"},
    }


@pytest.fixture
def proxy(s3_env: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[FaultProxy]:
    """The fault proxy in front of the test's S3 server; the AWS environment points at it."""
    proxy = FaultProxy(s3_env.endpoint_url)
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    yield proxy
    proxy.close()


@pytest.fixture
def direct_store(s3_env: Any, s3_bucket: str) -> S3BlobStore:
    """The same bucket without the proxy: what the audit reads."""
    return S3BlobStore(s3_bucket, PREFIX, endpoint_url=s3_env.endpoint_url)


# --- the worker ---------------------------------------------------------------------------------


class FakeRehearsal:
    """Stands in for `warmup.rehearsal.runner.rehearse`: three artifact files per signature, laid out as an
    Inductor cache lays them out, with contents unique to the signature. `on_call` runs first (a test
    takes the store down there: S3 goes away while the worker compiles)."""

    def __init__(self, size: int = 6000) -> None:
        self.size = size
        self.calls = 0
        self.on_call: Any = None

    def __call__(
        self, spec: Spec, signatures: list[Any], cache_root: Path, **_: Any
    ) -> list[SignatureResult]:
        self.calls += 1
        if self.on_call is not None:
            self.on_call()
        results = []
        for signature in signatures:
            key = signature.key()
            root = Path(cache_root) / key[:12]
            files = []
            for relative in (
                f"fxgraph/{key[:2]}/f{key[:20]}/entry",
                f"aotautograd/a{key[:20]}/entry",
                f"{key[:2]}/c{key[:20]}.so",
            ):
                path = root / relative
                path.parent.mkdir(parents=True, exist_ok=True)
                line = f"{relative} {key}\n".encode()
                path.write_bytes(line * (self.size // len(line) + 1))
                data = path.read_bytes()
                files.append(ArtifactFile(relative, hashlib.sha256(data).hexdigest(), len(data)))
            results.append(
                SignatureResult(
                    key=key,
                    signature=signature,
                    status="ok",
                    files=files,
                    cache_dir=root,
                    compile_seconds=0.01,
                )
            )
        return results


@pytest.fixture
def rehearsal(monkeypatch: pytest.MonkeyPatch) -> FakeRehearsal:
    fake = FakeRehearsal()
    monkeypatch.setattr("warmup.rehearsal.runner.rehearse", fake)  # the worker imports it when it runs a task
    return fake


def submit(engine: Any, spec: Spec, toolchain: Toolchain, *, retry_failed: bool = False) -> Any:
    signatures = [Keyed.of(s) for s in plan_spec(spec).signatures]
    return TaskQueue(engine).submit_job(
        Keyed.of(spec), Keyed.of(toolchain), signatures, retry_failed=retry_failed
    )


def run_worker(db_url: str, bucket: str, toolchain: Toolchain, tmp_path: Path, **options: Any) -> Worker:
    settings = {"exit_when_idle": True, "retry_delay_s": 0.1, "poll_s": 0.1, "lease_s": 60.0} | options
    worker = Worker(
        WorkerOptions(
            database_url=db_url, store_url=f"s3://{bucket}/{PREFIX}", work_dir=tmp_path, **settings
        ),
        toolchain=toolchain,
    )
    try:
        worker.run()
    finally:
        worker.engine.dispose()
    return worker


def task_rows(engine: Any) -> list[Any]:
    with engine.connect() as connection:
        return connection.execute(select(m.Task.state, m.Task.attempts, m.Task.error)).all()


def entry_count(engine: Any) -> int:
    with engine.connect() as connection:
        return len(connection.execute(select(m.Entry.id)).all())


def published_manifest(store: S3BlobStore, spec: Spec, toolchain: Toolchain) -> dict[str, Any]:
    return json.loads(store.get_object(manifest_object_key(spec.key(), toolchain.key())))


def assert_manifest_blobs_present(store: S3BlobStore, manifest: dict[str, Any]) -> None:
    absent = [f["sha256"] for f in manifest["files"] if not store.has(f["sha256"])]
    assert absent == [], f"the published manifest lists blobs the store lacks: {absent}"


def test_worker_uploads_through_a_store_failing_one_request_in_five(
    pg_url, s3_bucket, proxy, direct_store, rehearsal, model_dir, toolchain, tmp_path
):
    engine = make_engine(pg_url)
    spec = make_spec(model_dir, 256)
    job = submit(engine, spec, toolchain)
    proxy.fail_every = ONE_IN

    worker = run_worker(pg_url, s3_bucket, toolchain, tmp_path)

    tasks = task_rows(engine)
    assert len(tasks) == 8 and {t.state for t in tasks} == {m.TaskState.done}, tasks
    assert [o.status for o in worker.outcomes] == ["done"] * 8  # botocore's retries absorbed every fault
    assert Repository(engine).job_status(job.job_id).state == "ready"
    manifest = published_manifest(direct_store, spec, toolchain)
    assert len(manifest["signatures"]) == 8 and manifest["missing"] == [] and len(manifest["files"]) == 24
    assert_manifest_blobs_present(direct_store, manifest)
    audit = audit_store(engine, direct_store)
    assert audit.entries == 8 and audit.files == 24 and audit.lost == 0
    assert proxy.requests >= 24 * 2 and proxy.faults == proxy.requests // ONE_IN
    assert all(proxy.faults_by_kind.values())  # each kind of fault was injected

    # Read every blob back through the flaky proxy too: a GET whose body breaks halfway is resumed.
    faults_before, proxied = len(proxy.fault_log), S3BlobStore(s3_bucket, PREFIX)
    for file in manifest["files"]:
        with proxied.open(file["sha256"]) as blob:
            assert hashlib.sha256(blob.read()).hexdigest() == file["sha256"]
    assert ("reset", "GET") in proxy.fault_log[faults_before:]  # a blob's body did break halfway
    engine.dispose()
    record(
        Row(
            scenario="store: worker uploads and read-back, S3 fails 1 request in 5",
            faults_injected=proxy.faults,
            jobs_completed=1,
            data_lost=audit.lost,
            requests=proxy.requests,
            p99_ms=proxy.p99_ms(),
        )
    )


def test_multipart_uploads_through_a_store_failing_one_request_in_five(
    s3_bucket, s3_env, proxy, direct_store, tmp_path
):
    """Large blobs (Neuron's NEFFs run to hundreds of MB) go up in parts: create, parts, complete,
    each a request the proxy may fail. An upload that fails as a whole is tried again, as a worker
    retries its task; every blob ends up whole, and no upload is left open in the bucket."""
    store = S3BlobStore(s3_bucket, PREFIX, multipart_threshold=5 * MiB, multipart_chunksize=5 * MiB)
    blobs = []
    for index in range(4):
        data = os.urandom(12 * MiB + index)  # three parts each
        path = tmp_path / f"graph-{index}.neff"
        path.write_bytes(data)
        blobs.append((path, hashlib.sha256(data).hexdigest()))
    proxy.fail_every = ONE_IN

    for path, sha in blobs:
        for _attempt in range(3):
            try:
                store.put_file(path, sha)
                break
            except StoreError as error:  # the whole upload failed: say so, and try again
                assert s3_bucket in str(error), error
        else:
            pytest.fail(f"{path.name} was not uploaded in 3 attempts")

    lost = 0
    for _path, sha in blobs:
        head = s3_env.client().head_object(Bucket=s3_bucket, Key=f"{PREFIX}/{blob_key(sha)}")
        assert head["ETag"].strip('"').endswith("-3")  # it went up in three parts
        with direct_store.open(sha) as blob:
            lost += hashlib.sha256(blob.read()).hexdigest() != sha
    record(
        Row(
            scenario="store: multipart uploads (12 MiB in 5 MiB parts), S3 fails 1 request in 5",
            faults_injected=proxy.faults,
            jobs_completed=0,
            data_lost=lost,
            requests=proxy.requests,
            p99_ms=proxy.p99_ms(),
        )
    )
    assert lost == 0 and proxy.faults >= 3 and all(proxy.faults_by_kind.values())
    open_uploads = s3_env.client().list_multipart_uploads(Bucket=s3_bucket).get("Uploads", [])
    assert open_uploads == [], open_uploads


def test_a_multipart_upload_whose_completion_answer_is_lost_is_found_in_place(
    s3_bucket, s3_env, proxy, direct_store, tmp_path
):
    """S3 assembled the object, but the answer to CompleteMultipartUpload never came back: botocore asks
    again, and S3 answers the repeated completion as it did the first. The blob is there, whole."""
    store = S3BlobStore(s3_bucket, PREFIX, multipart_threshold=5 * MiB, multipart_chunksize=5 * MiB)
    data = os.urandom(12 * MiB)
    path, sha = tmp_path / "graph.neff", hashlib.sha256(data).hexdigest()
    path.write_bytes(data)
    proxy.cut_first = lambda method, target: method == "POST" and "uploadId=" in target

    assert store.put_file(path, sha)

    assert proxy.fault_log == [("cut", "POST")]
    with direct_store.open(sha) as blob:
        assert hashlib.sha256(blob.read()).hexdigest() == sha
    assert s3_env.client().list_multipart_uploads(Bucket=s3_bucket).get("Uploads", []) == []


def test_worker_with_the_store_unreachable_mid_task_retries_records_why_then_completes_when_it_returns(
    pg_url, s3_bucket, proxy, direct_store, rehearsal, model_dir, toolchain, tmp_path
):
    engine = make_engine(pg_url)
    spec = make_spec(model_dir, 64)
    job = submit(engine, spec, toolchain)
    rehearsal.on_call = proxy.go_down  # S3 goes away while the worker compiles the first task

    # Two tasks, two attempts each: every upload meets a closed port.
    down = run_worker(
        pg_url, s3_bucket, toolchain, tmp_path, max_attempts=2, max_tasks=4, exit_when_idle=False
    )

    assert [o.status for o in down.outcomes] == ["retry", "retry", "failed", "failed"], down.outcomes
    tasks = task_rows(engine)
    assert len(tasks) == 2 and all(t.state == m.TaskState.failed and t.attempts == 2 for t in tasks)
    for task in tasks:  # the reason names the endpoint and the bucket, and says what to check
        assert proxy.url in task.error and s3_bucket in task.error and "check" in task.error, task.error
    assert entry_count(engine) == 0  # nothing half-published: no entry, no manifest
    assert direct_store.list_documents(f"{MANIFESTS_PREFIX}/") == []
    assert audit_store(engine, direct_store).lost == 0

    proxy.come_up()
    rehearsal.on_call = None
    assert len(submit(engine, spec, toolchain, retry_failed=True).enqueued) == 2
    back = run_worker(pg_url, s3_bucket, toolchain, tmp_path)

    assert [o.status for o in back.outcomes] == ["done", "done"]
    assert {t.state for t in task_rows(engine)} == {m.TaskState.done}
    assert Repository(engine).job_status(job.job_id).state == "ready"
    manifest = published_manifest(direct_store, spec, toolchain)
    assert manifest["missing"] == [] and len(manifest["files"]) == 6
    assert_manifest_blobs_present(direct_store, manifest)
    audit = audit_store(engine, direct_store)
    assert audit.entries == 2 and audit.lost == 0
    engine.dispose()
    record(
        Row(
            scenario="store: S3 unreachable during worker uploads, then back",
            faults_injected=4,  # four upload attempts met a refused connection
            jobs_completed=1,
            jobs_failed_with_reason=2,
            data_lost=audit.lost,
            requests=proxy.requests,
            p99_ms=proxy.p99_ms(),
        )
    )


def test_a_worker_refuses_to_start_when_the_store_is_unreachable(
    pg_url, s3_bucket, proxy, toolchain, tmp_path
):
    proxy.go_down()
    with pytest.raises(StoreUnreachableError) as refused:
        run_worker(pg_url, s3_bucket, toolchain, tmp_path)
    message = str(refused.value)
    assert proxy.url in message and s3_bucket in message and "check" in message, message
    engine = make_engine(pg_url)
    assert Repository(engine).list_workers() == []  # it never registered
    engine.dispose()
    record(
        Row(
            scenario="store: worker started with S3 unreachable", faults_injected=1, jobs_failed_with_reason=1
        )
    )


def test_worker_uploads_through_a_slow_store(
    pg_url, s3_bucket, proxy, direct_store, rehearsal, model_dir, toolchain, tmp_path
):
    engine = make_engine(pg_url)
    spec = make_spec(model_dir, 64)
    submit(engine, spec, toolchain)
    proxy.latency_s = 0.3

    started = time.monotonic()
    worker = run_worker(pg_url, s3_bucket, toolchain, tmp_path)
    elapsed = time.monotonic() - started

    assert [o.status for o in worker.outcomes] == ["done", "done"]
    assert_manifest_blobs_present(direct_store, published_manifest(direct_store, spec, toolchain))
    audit = audit_store(engine, direct_store)
    assert audit.entries == 2 and audit.lost == 0
    assert (
        elapsed >= proxy.requests * proxy.latency_s
    )  # every request did wait (the proxy is serial per connection)
    engine.dispose()
    record(
        Row(
            scenario="store: worker uploads, S3 answers 300 ms late",
            faults_injected=proxy.requests,
            jobs_completed=1,
            data_lost=audit.lost,
            requests=proxy.requests,
            p99_ms=proxy.p99_ms(),
        )
    )


# --- pods ---------------------------------------------------------------------------------------


@pytest.fixture
def services(pg_url, s3_bucket, proxy, tmp_path) -> Iterator[Services]:
    """The API's services, with the store behind the proxy (presigned URLs name the proxy)."""
    settings = Settings(
        data_dir=tmp_path / "service", database_url=pg_url, store_url=f"s3://{s3_bucket}/{PREFIX}", auth="off"
    )
    started = Services.start(settings)
    yield started
    started.close()


@pytest.fixture
def warmed(services, proxy, model_dir, toolchain, tmp_path) -> Spec:
    """A spec of 8 signatures (24 files) warmed, its manifest published in the bucket; counts reset."""
    spec = make_spec(model_dir, 256)
    services.queue.submit_job(
        Keyed.of(spec), Keyed.of(toolchain), [Keyed.of(s) for s in plan_spec(spec).signatures]
    )
    assert play_worker(services, toolchain.key(), tmp_path / "scratch") == 8
    publish(services, spec, toolchain)
    proxy.reset_counts()
    return spec


def snapshot(directory: Path) -> dict[str, tuple[str, int]] | None:
    """Every file under `directory` (hidden bookkeeping included) with its sha256 and mtime; None if absent."""
    if not directory.exists():
        return None
    return {
        p.relative_to(directory).as_posix(): (
            hashlib.sha256(p.read_bytes()).hexdigest(),
            p.stat().st_mtime_ns,
        )
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def assert_installed(result: Any, dest: Path) -> None:
    assert result.downloaded == 24
    for file in result.manifest.files:
        assert hashlib.sha256((dest / file.path).read_bytes()).hexdigest() == file.sha256


def a_used_cache_dir(path: Path) -> Path:
    """A pod's cache directory with something already in it, which a failed pull must not touch."""
    (path / "fxgraph" / "ab").mkdir(parents=True)
    (path / "fxgraph" / "ab" / "earlier-entry").write_bytes(b"from an earlier training run\n")
    return path


@pytest.mark.parametrize("via", ["api", "bucket"])
def test_pod_pulls_through_a_store_failing_one_request_in_five(
    via, services, warmed, proxy, toolchain, tmp_path
):
    proxy.fail_every = ONE_IN
    dest = tmp_path / "cache"
    with serve(services) as api_url:
        where = {"server": api_url} if via == "api" else {"source": f"s3://{services.store.bucket}/{PREFIX}"}
        result = pull(warmed, dest, toolchain=toolchain, **where)
    assert_installed(result, dest)
    assert proxy.requests >= 24 and proxy.faults == proxy.requests // ONE_IN
    assert all(proxy.faults_by_kind.values())  # each kind of fault was injected
    record(
        Row(
            scenario=f"store: pod pull ({'presigned URLs from the API' if via == 'api' else '--from the bucket'}), S3 fails 1 request in 5",
            faults_injected=proxy.faults,
            jobs_completed=1,
            requests=proxy.requests,
            p99_ms=proxy.p99_ms(),
        )
    )


@pytest.mark.parametrize("via", ["api", "bucket"])
@pytest.mark.parametrize("cache_dir", ["new", "used"])
def test_pod_pull_with_the_store_unreachable_fails_cleanly_and_installs_nothing(
    via, cache_dir, services, warmed, proxy, toolchain, tmp_path, monkeypatch
):
    # the downloads' retries give up after 5 s rather than the default minute (a CI job's setting)
    monkeypatch.setenv(RETRY_VARIABLE, "5")
    dest = a_used_cache_dir(tmp_path / "cache") if cache_dir == "used" else tmp_path / "cache"
    before = snapshot(dest)
    proxy.go_down()
    with serve(services) as api_url:
        where = {"server": api_url} if via == "api" else {"source": f"s3://{services.store.bucket}/{PREFIX}"}
        with pytest.raises(StoreError) as failed:
            pull(warmed, dest, toolchain=toolchain, **where)
    message = str(failed.value)
    assert f"127.0.0.1:{proxy.port}" in message and "check" in message, message
    if via == "bucket":
        assert isinstance(failed.value, StoreUnreachableError) and services.store.bucket in message
    else:
        assert "nothing was installed" in message
    assert snapshot(dest) == before  # all or nothing: the directory is exactly as it was
    record(
        Row(
            scenario=f"store: pod pull ({via}) with S3 unreachable, {cache_dir} cache dir",
            faults_injected=1,
            jobs_failed_with_reason=1,
        )
    )


def test_cli_pull_from_an_unreachable_bucket_says_which_and_leaves_the_cache_dir_alone(
    warmed, services, proxy, model_dir, toolchain, tmp_path
):
    spec_file = tmp_path / "job.json"
    spec_file.write_text(json.dumps(spec_doc(model_dir, 256)))
    dest = a_used_cache_dir(tmp_path / "cache")
    remember_toolchain(dest, toolchain)  # an earlier pull remembered it: this one skips computing it
    before = snapshot(dest)
    proxy.go_down()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "warmup",
            "pull",
            str(spec_file),
            "--from",
            f"s3://{services.store.bucket}/{PREFIX}",
            "--dest",
            str(dest),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ},
    )
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
    assert proxy.url in done.stderr and services.store.bucket in done.stderr and "check" in done.stderr, (
        done.stderr
    )
    assert snapshot(dest) == before
    record(
        Row(
            scenario="store: `warmup pull --from` with S3 unreachable",
            faults_injected=1,
            jobs_failed_with_reason=1,
        )
    )
