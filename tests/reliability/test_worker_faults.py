"""Worker faults: real `warmup worker` processes, real PostgreSQL, a local blob store.

Each scenario stops a worker at an exact point with a test-only sitecustomize (fault_hooks/, put
first on the worker's PYTHONPATH: the product has no test hooks), then kills, freezes or crashes it
for real, and checks that every job still completes or fails with a recorded reason, and that no
entry points at a missing blob (tests/reliability/audit.py).

Signatures the planner labels eager go through the whole worker path (claim, rehearse, upload,
complete, publish the manifest) without compiling; the hooks give their entries artifact files, so
that there is something to upload. The crash scenarios rehearse a compiling signature: the crash is
injected where Inductor starts, so nothing is compiled either.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import Engine, select, update

from tests.fixtures.factories import eager_signatures
from tests.reliability.audit import audit_store
from tests.reliability.ledger import Row, record
from warmup.db import models as m
from warmup.db.columns import db_now
from warmup.db.engine import make_engine
from warmup.db.manifests import manifest_object_key
from warmup.db.queue import TaskQueue
from warmup.db.records import Keyed
from warmup.db.repository import Repository
from warmup.db.retention import collect_garbage
from warmup.errors import BlobNotFoundError
from warmup.job.spec import Spec, load_spec
from warmup.planner.planning import plan_spec
from warmup.store import LocalBlobStore
from warmup.toolchain.probes import current_toolchain

HOOKS = Path(__file__).resolve().parent / "fault_hooks"
LEASE_S = 2.0  # short, so that a dead worker's lease runs out quickly
# Bounds a worker's start (it imports torch) and its run: generous, for a crowded CI machine; a
# passing run takes seconds per worker.
PATIENCE_S = 600


@dataclass
class Setup:
    engine: Engine
    store: LocalBlobStore
    db_url: str
    store_url: str
    faults: Path  # markers and "go" files shared with the hooks
    logs: Path
    # The workers' temporary directory, where their task folders go: this test's own, so that a worker another
    # test starts meanwhile (the suite runs in parallel) never takes a killed worker's abandoned folder first
    work: Path
    spec: Spec
    job_id: object
    toolchain: Keyed

    @property
    def toolchain_key(self) -> str:
        return self.toolchain.key

    def manifest_written(self, spec: Spec) -> bool:
        try:
            self.store.get_object(manifest_object_key(spec.key(), self.toolchain.key))
        except BlobNotFoundError:
            return False
        return True


@pytest.fixture
def setup(pg_url: str, tmp_path: Path, tiny_model_dir: Path) -> Iterator[Callable[..., Setup]]:
    engines: list[Engine] = []

    def make(*, compiling: bool = False, eager_count: int = 1) -> Setup:
        spec = spec_of(tiny_model_dir)
        if compiling:
            signatures = [s for s in plan_spec(spec).signatures if s.compile != "eager"][:1]
        else:
            signatures = eager_signatures(eager_count)
        toolchain = Keyed.of(current_toolchain("inductor", "cpu"))
        engine = make_engine(pg_url)
        engines.append(engine)
        job = TaskQueue(engine).submit_job(Keyed.of(spec), toolchain, [Keyed.of(s) for s in signatures])
        assert len(job.enqueued) == len(signatures)
        (tmp_path / "faults").mkdir()
        (tmp_path / "logs").mkdir()
        (tmp_path / "work").mkdir()
        return Setup(
            engine=engine,
            store=LocalBlobStore(tmp_path / "store"),
            db_url=pg_url,
            store_url=str(tmp_path / "store"),
            faults=tmp_path / "faults",
            logs=tmp_path / "logs",
            work=tmp_path / "work",
            spec=spec,
            job_id=job.job_id,
            toolchain=toolchain,
        )

    yield make
    for engine in engines:
        engine.dispose()


def spec_of(model_dir: Path, max_length: int = 32) -> Spec:
    return load_spec(
        {
            "trainer": "sft",
            "model": str(model_dir),
            "args": {
                "per_device_train_batch_size": 2,
                "max_length": max_length,
                "pad_to_multiple_of": 32,
                "torch_compile": True,
                "bf16": False,
            },
            "data": {"min_tokens": 10, "max_tokens": 32},
            "target": {"backend": "inductor", "device": "cpu"},
        }
    )


class WorkerProcess:
    """One `warmup worker` process, its output in a file (a stopped process must not block a pipe)."""

    def __init__(self, s: Setup, name: str, faults: dict[str, str], *extra: str) -> None:
        self.name = name
        self.log_path = s.logs / f"{name}.log"
        env = {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": os.pathsep.join([str(HOOKS), os.environ.get("PYTHONPATH", "")]),
            "WARMUP_FAULT_DIR": str(s.faults),
            "TMPDIR": str(s.work),
            **faults,
        }
        command = [sys.executable, "-m", "warmup", "worker", "--database-url", s.db_url]
        command += ["--store", s.store_url, "--lease", str(LEASE_S), "--poll-interval", "0.2", *extra]
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def signal(self, signum: int) -> None:
        self.process.send_signal(signum)

    def wait(self, timeout: float) -> int:
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"worker {self.name} did not exit in {timeout} s:\n{self.log}") from None

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)  # a stopped process dies on SIGKILL anyway
            self.process.kill()
            self.process.wait(timeout=30)


@pytest.fixture
def workers() -> Iterator[list[WorkerProcess]]:
    """Every worker a test starts; whatever is left is killed at the end."""
    started: list[WorkerProcess] = []
    yield started
    for worker in started:
        worker.kill()


def wait_for(predicate: Callable[[], object], timeout: float, what: str, *logs: WorkerProcess) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        for worker in logs:
            if worker.process.poll() is not None:
                raise AssertionError(f"worker {worker.name} exited while waiting for {what}:\n{worker.log}")
        if time.monotonic() > deadline:
            details = "\n".join(f"--- {w.name}:\n{w.log}" for w in logs)
            raise AssertionError(f"timed out waiting for {what}\n{details}")
        time.sleep(0.1)


def tasks(engine: Engine) -> list:
    with engine.connect() as connection:
        return connection.execute(
            select(
                m.Task.id,
                m.Task.state,
                m.Task.attempts,
                m.Task.lease_owner,
                m.Task.lease_expires_at,
                m.Task.heartbeat_at,
                m.Task.error,
                m.Task.log_tail,
            ).order_by(m.Task.id)
        ).all()


def entry_files(engine: Engine) -> list:
    with engine.connect() as connection:
        return connection.execute(
            select(m.Entry.signature_key, m.EntryFile.path, m.EntryFile.blob_sha256).join(
                m.EntryFile, m.EntryFile.entry_id == m.Entry.id
            )
        ).all()


def lease_expired(engine: Engine) -> bool:
    with engine.connect() as connection:
        return bool(connection.execute(select(m.Task.lease_expires_at < db_now())).scalar_one())


def assert_nothing_lost(s: Setup) -> int:
    """Every blob an entry references is in the store with its bytes; the job's manifest in the bucket
    names only such blobs. Returns the number lost (0), for the ledger."""
    audit = audit_store(s.engine, s.store)
    assert audit.lost == 0, (audit.missing, audit.corrupt)
    assert audit.entries >= 1 and audit.files >= 1
    manifest = json.loads(s.store.get_object(manifest_object_key(s.spec.key(), s.toolchain_key)))
    assert manifest["missing"] == []
    shas = {file["sha256"] for file in manifest["files"]}
    assert shas and all(s.store.has(sha) for sha in shas), manifest
    return audit.lost


def fake_artifacts() -> dict[str, str]:
    return {"WARMUP_FAULT_ARTIFACTS": "1"}


# --- SIGKILL mid-upload --------------------------------------------------------------------------


def test_sigkill_mid_upload_another_worker_finishes_and_nothing_points_at_a_missing_blob(setup, workers):
    s = setup()
    # The second blob's bytes are in the store's temp file, not yet synced nor renamed: mid-upload.
    first = WorkerProcess(s, "first", {**fake_artifacts(), "WARMUP_FAULT_HOLD_UPLOAD": "2"})
    workers.append(first)
    wait_for(lambda: (s.faults / "uploading").exists(), PATIENCE_S, "the first worker to upload", first)
    first.signal(signal.SIGKILL)
    assert first.wait(30) == -signal.SIGKILL

    [task] = tasks(s.engine)
    assert task.state == m.TaskState.running and task.attempts == 1
    assert entry_files(s.engine) == []  # nothing recorded: the entry never pointed at a half upload
    with s.engine.connect() as connection:  # reserved before the upload: GC leaves them alone
        reserved = connection.execute(select(m.Blob.sha256, m.Blob.reserved_until)).all()
    assert len(reserved) == 3 and all(r.reserved_until is not None for r in reserved)
    in_store = [r.sha256 for r in reserved if s.store.has(r.sha256)]
    assert len(in_store) == 1  # the first blob landed; the second was cut off before its rename

    # An --exit-when-idle worker exits at once when nothing is claimable: it starts once the lease is out.
    wait_for(lambda: lease_expired(s.engine), 30, "the dead worker's lease to run out")
    second = WorkerProcess(s, "second", fake_artifacts(), "--exit-when-idle")
    workers.append(second)
    assert second.wait(PATIENCE_S) == 0, second.log
    [task] = tasks(s.engine)
    assert task.state == m.TaskState.done and task.attempts == 2, task
    files = entry_files(s.engine)
    assert len(files) == 3 and all(s.store.has(f.blob_sha256) for f in files)
    assert Repository(s.engine).job_status(s.job_id).state == "ready"
    # What the dead worker left (its own build log's blob) is unreferenced: once its reservation
    # runs out (six hours; moved here), garbage collection takes it and nothing an entry needs.
    referenced = {f.blob_sha256 for f in files}
    leftovers = {r.sha256 for r in reserved} - referenced
    assert len(leftovers) == 1 and all(s.store.has(sha) for sha in leftovers)
    with s.engine.begin() as connection:
        connection.execute(update(m.Blob).values(reserved_until=db_now(-1.0)))
    report = collect_garbage(s.engine, s.store)
    assert report.blobs_deleted == 1 and not any(s.store.has(sha) for sha in leftovers)
    lost = assert_nothing_lost(s)
    record(Row(scenario="worker: SIGKILL mid-upload", faults_injected=1, jobs_completed=1, data_lost=lost))


# --- SIGKILL mid-heartbeat -----------------------------------------------------------------------


@pytest.mark.parametrize("moment", ["inside the heartbeat's UPDATE", "between heartbeats"])
def test_sigkill_around_a_heartbeat_the_task_is_claimed_again_and_completes(setup, workers, moment):
    s = setup()
    faults = {**fake_artifacts(), "WARMUP_FAULT_HOLD_REHEARSAL": "1"}
    if moment == "inside the heartbeat's UPDATE":
        faults["WARMUP_FAULT_HOLD_HEARTBEAT"] = "1"
    first = WorkerProcess(s, "first", faults)
    workers.append(first)
    wait_for(lambda: (s.faults / "rehearsing").exists(), PATIENCE_S, "the first worker to claim", first)
    [claimed] = tasks(s.engine)
    if moment == "inside the heartbeat's UPDATE":
        # The UPDATE ran in an open transaction: the task row is locked until the connection goes.
        wait_for(lambda: (s.faults / "heartbeat").exists(), 30, "a heartbeat", first)
    else:
        wait_for(lambda: tasks(s.engine)[0].heartbeat_at > claimed.heartbeat_at, 30, "a heartbeat", first)
    first.signal(signal.SIGKILL)
    assert first.wait(30) == -signal.SIGKILL
    [task] = tasks(s.engine)
    assert task.state == m.TaskState.running and task.lease_owner == claimed.lease_owner
    if moment == "inside the heartbeat's UPDATE":  # the killed transaction renewed nothing
        assert task.lease_expires_at == claimed.lease_expires_at

    wait_for(lambda: lease_expired(s.engine), 30, "the dead worker's lease to run out")
    second = WorkerProcess(s, "second", fake_artifacts(), "--exit-when-idle")
    workers.append(second)
    assert second.wait(PATIENCE_S) == 0, second.log
    [task] = tasks(s.engine)
    # Two claims, two attempts: the dead worker's one counts (a worker that dies on every try of a
    # task must not retry it for ever), and the task is not failed for it.
    assert task.state == m.TaskState.done and task.attempts == 2, task
    assert task.lease_owner != claimed.lease_owner
    assert Repository(s.engine).job_status(s.job_id).state == "ready"
    lost = assert_nothing_lost(s)
    record(Row(scenario=f"worker: SIGKILL {moment}", faults_injected=1, jobs_completed=1, data_lost=lost))


def test_a_worker_started_after_a_killed_one_takes_its_task_back_at_once(setup, workers):
    """A restarted `warmup serve` (or any worker sharing the killed one's work folder) does not wait for the
    dead worker's lease: the abandoned task folder names the task and its worker."""
    s = setup()
    first = WorkerProcess(
        s, "first", {**fake_artifacts(), "WARMUP_FAULT_HOLD_REHEARSAL": "1"}, "--lease", "600"
    )
    workers.append(first)
    wait_for(lambda: (s.faults / "rehearsing").exists(), PATIENCE_S, "the first worker to claim", first)
    first.signal(signal.SIGKILL)
    assert first.wait(30) == -signal.SIGKILL
    assert not lease_expired(s.engine)  # ten minutes left on the dead worker's lease

    second = WorkerProcess(s, "second", fake_artifacts(), "--exit-when-idle")
    workers.append(second)
    assert second.wait(PATIENCE_S) == 0, second.log
    assert "was killed (its task folder was abandoned); the task is due again now" in second.log
    [task] = tasks(s.engine)
    assert task.state == m.TaskState.done and task.attempts == 2, task
    lost = assert_nothing_lost(s)
    record(
        Row(
            scenario="worker: SIGKILL, a worker started at once",
            faults_injected=1,
            jobs_completed=1,
            data_lost=lost,
        )
    )


# --- a hung worker -------------------------------------------------------------------------------


def test_a_hung_worker_loses_its_task_and_its_late_complete_is_refused(setup, workers):
    s = setup()
    # Hung at its first upload: the lease runs out while it is frozen.
    faults = {**fake_artifacts(), "WARMUP_FAULT_HOLD_UPLOAD": "1"}
    hung = WorkerProcess(s, "hung", faults, "--exit-when-idle")
    workers.append(hung)
    wait_for(lambda: (s.faults / "uploading").exists(), PATIENCE_S, "the first worker to upload", hung)
    hung.signal(signal.SIGSTOP)
    [claimed] = tasks(s.engine)

    wait_for(lambda: lease_expired(s.engine), 30, "the hung worker's lease to run out")
    other = WorkerProcess(s, "other", fake_artifacts(), "--exit-when-idle")
    workers.append(other)
    assert other.wait(PATIENCE_S) == 0, other.log
    [done] = tasks(s.engine)
    assert done.state == m.TaskState.done and done.attempts == 2 and done.lease_owner != claimed.lease_owner
    before = sorted(entry_files(s.engine))
    assert len(before) == 3

    (s.faults / "go-upload").touch()
    hung.signal(signal.SIGCONT)
    # It finishes its upload, its complete is refused (the lease is another's), and it carries on:
    # nothing left to claim, so it exits cleanly.
    assert hung.wait(PATIENCE_S) == 0, hung.log
    assert "no longer holds the lease" in hung.log, hung.log
    [after] = tasks(s.engine)
    assert after == done  # the task as the other worker left it
    assert sorted(entry_files(s.engine)) == before  # one entry, the other worker's files
    lost = assert_nothing_lost(s)
    record(
        Row(scenario="worker: hung (SIGSTOP) mid-upload", faults_injected=1, jobs_completed=1, data_lost=lost)
    )


# --- a compile that crashes the process ----------------------------------------------------------


def test_a_compile_that_crashes_its_process_is_retried_then_fails_with_the_signal(setup, workers):
    s = setup(compiling=True)
    worker = WorkerProcess(
        s,
        "crashing",
        {"WARMUP_FAULT_CRASH_COMPILE": "SEGV,ABRT"},
        "--exit-when-idle",
        "--max-attempts",
        "2",
        "--retry-delay",
        "0",
    )
    workers.append(worker)
    assert worker.wait(PATIENCE_S) == 3, worker.log  # 3: a task failed
    crashes = sorted(p.name for p in s.faults.glob("crash-*"))
    assert crashes == ["crash-0-SEGV", "crash-1-ABRT"]
    [task] = tasks(s.engine)
    assert task.state == m.TaskState.failed and task.attempts == 2, task
    # The last attempt's crash, by name; the log tail is the dead run's own output.
    assert "the run was killed by SIGABRT" in task.error, task.error
    assert task.log_tail
    status = Repository(s.engine).job_status(s.job_id)
    assert status.state == "failed"
    assert status.signatures[0].error == task.error
    assert entry_files(s.engine) == []
    record(
        Row(
            scenario="worker: compile crashes (SIGSEGV, SIGABRT)",
            faults_injected=2,
            jobs_failed_with_reason=1,
        )
    )


def test_a_rehearsal_supervisor_that_crashes_is_retried_then_fails_with_the_signal(setup, workers):
    s = setup(compiling=True)
    worker = WorkerProcess(
        s,
        "crashing",
        {"WARMUP_FAULT_CRASH_SUPERVISOR": "1"},
        "--exit-when-idle",
        "--max-attempts",
        "3",
        "--retry-delay",
        "0",
    )
    workers.append(worker)
    assert worker.wait(PATIENCE_S) == 3, worker.log
    assert len(list(s.faults.glob("supervisor-crash-*"))) == 3
    [task] = tasks(s.engine)
    assert task.state == m.TaskState.failed and task.attempts == 3, task
    assert "the rehearsal supervisor was killed by SIGSEGV before planning" in task.error, task.error
    assert Repository(s.engine).job_status(s.job_id).state == "failed"
    record(
        Row(
            scenario="worker: rehearsal supervisor crashes (SIGSEGV)",
            faults_injected=3,
            jobs_failed_with_reason=1,
        )
    )


# --- a failed manifest write after the task is done ----------------------------------------------


def test_a_manifest_that_cannot_be_written_does_not_fail_the_done_task_or_stop_the_worker(setup, workers):
    s = setup()
    other_spec = spec_of(Path(s.spec.model), max_length=64)
    other_job = TaskQueue(s.engine).submit_job(
        Keyed.of(other_spec), s.toolchain, [Keyed.of(eager_signatures(2)[1])]
    )
    worker = WorkerProcess(
        s, "worker", {**fake_artifacts(), "WARMUP_FAULT_FAIL_MANIFEST": "1"}, "--exit-when-idle"
    )
    workers.append(worker)
    assert worker.wait(PATIENCE_S) == 0, worker.log
    assert (s.faults / "manifest-failed-1").exists()
    assert "were not published yet" in worker.log and "published the manifests" in worker.log
    rows = tasks(s.engine)
    assert [(t.state, t.attempts) for t in rows] == [(m.TaskState.done, 1)] * 2, rows
    repository = Repository(s.engine)
    assert repository.job_status(s.job_id).state == "ready"
    assert repository.job_status(other_job.job_id).state == "ready"
    audit = audit_store(s.engine, s.store)
    assert audit.lost == 0 and audit.entries == 2
    # The first manifest write failed; the worker wrote it again once idle, so both are in the bucket.
    assert [s.manifest_written(spec) for spec in (s.spec, other_spec)] == [True, True]
    record(
        Row(
            scenario="worker: manifest write fails (ENOSPC)",
            faults_injected=1,
            jobs_completed=2,
            data_lost=audit.lost,
        )
    )


# --- a task whose every attempt is killed --------------------------------------------------------


def test_a_task_whose_every_worker_is_killed_fails_with_the_reason_after_its_attempts(setup, workers):
    s = setup()
    attempts = "2"
    owners = []
    for number in (1, 2):
        (s.faults / "rehearsing").unlink(missing_ok=True)
        worker = WorkerProcess(
            s, f"killed-{number}", {"WARMUP_FAULT_HOLD_REHEARSAL": "1"}, "--max-attempts", attempts
        )
        workers.append(worker)
        wait_for(
            lambda: (s.faults / "rehearsing").exists(), PATIENCE_S, f"worker {number} to rehearse", worker
        )
        owners.append(tasks(s.engine)[0].lease_owner)
        worker.signal(signal.SIGKILL)
        assert worker.wait(30) == -signal.SIGKILL
        wait_for(lambda: lease_expired(s.engine), 30, "the lease to run out")

    last = WorkerProcess(s, "last", {}, "--max-attempts", attempts, "--exit-when-idle")
    workers.append(last)
    assert last.wait(PATIENCE_S) == 0, last.log  # nothing for it: the task is out of attempts
    [task] = tasks(s.engine)
    assert task.state == m.TaskState.failed and task.attempts == 2, task
    assert owners[0] != owners[1]
    assert task.error == f"gave up: the lease of worker {owners[1]} expired on the last attempt"
    status = Repository(s.engine).job_status(s.job_id)
    assert status.state == "failed" and status.signatures[0].error == task.error
    assert entry_files(s.engine) == []
    record(Row(scenario="worker: SIGKILL on every attempt", faults_injected=2, jobs_failed_with_reason=1))
