"""The worker: claim a task, rehearse its signature, upload the artifacts, record the entry.

One task at a time, under a lease that a heartbeat thread renews. The order is what keeps a
half-done task invisible: blobs are reserved (so garbage collection leaves them alone), uploaded,
and only then is the entry recorded, in the same statement that checks this worker still holds the
lease. A failed rehearsal is retried with backoff by the queue, then recorded with its log.

When a task completes a job (every signature ready), the worker publishes the job's manifest into
the bucket, after its blobs, so that pods with bucket credentials can pull while the API is down.

Workers and the API never import each other: they meet only in the database and the blob store
(docs/architecture.md).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import socket
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from sqlalchemy import Engine

from warmup.db.engine import make_engine
from warmup.db.manifests import build_manifest, publish_manifest
from warmup.db.outage import Outage, is_unavailable, reason, riding_out
from warmup.db.queue import RetryStrategy, TaskQueue
from warmup.db.records import ClaimedTask, FileRef, Keyed
from warmup.db.repository import Repository, pool_entry
from warmup.errors import LeaseLostError, RehearsalError, StoreError, WarmupError
from warmup.job.spec import Spec
from warmup.leftovers import locked_temp_dir, remove_abandoned
from warmup.logs import log_context
from warmup.settings import Settings
from warmup.signature import Signature
from warmup.store import BlobStore, open_store
from warmup.toolchain.memo import host_toolchain
from warmup.toolchain.model import Toolchain

if TYPE_CHECKING:
    from warmup.rehearsal.runner import SignatureResult

log = logging.getLogger("warmup.worker")
TASK_FOLDER = "warmup-task-"
_TASK_FOLDER_NAME = re.compile(rf"^{TASK_FOLDER}(\d+)-(.+)-[^-]+$")  # mkdtemp's random suffix has no dash


def task_folder_prefix(task_id: int, worker_id: str) -> str:
    """A task folder's name: the task and the worker holding it (`task_folder_owner` reads them back)."""
    return f"{TASK_FOLDER}{task_id}-{worker_id}-"


def task_folder_owner(name: str) -> tuple[int, str] | None:
    """(task id, worker id) from a task folder's name, or None for a name `task_folder_prefix` did not make."""
    match = _TASK_FOLDER_NAME.match(name)
    return (int(match.group(1)), match.group(2)) if match else None


@dataclass
class WorkerOptions:
    database_url: str
    store_url: str
    backend: str = "inductor"
    device: str = "cpu"
    pool: str | None = None
    worker_id: str = field(
        default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    )
    lease_s: float = 120.0
    poll_s: float = 2.0
    task_timeout_s: float = 3600.0
    grace_s: float = 60.0  # on SIGTERM: how long the current task may take to finish before it is released
    work_dir: Path | None = None  # where task folders go (None: `task_root`'s default)
    exit_when_idle: bool = False  # for tests and one-shot CI workers
    max_attempts: int = 3  # a rehearsal that crashes or times out is tried this many times
    retry_delay_s: float = 30.0  # before the 2nd attempt; doubles after each failure
    world_sizes: tuple[int, ...] = (1,)  # jobs of these many processes are rehearsed (torchrun beyond 1)
    max_tasks: int | None = None

    def task_root(self) -> Path:
        """Where the task folders go: `work_dir`, else a folder of the temporary directory named for the queue's
        database. Every worker of that queue on this host shares it, so a worker started after a killed one finds
        the folder it abandoned and takes its task back at once; the workers of another queue (another service on
        the same host) never see it, so none of them removes it first."""
        if self.work_dir is not None:
            return self.work_dir
        queue = hashlib.sha256(self.database_url.encode()).hexdigest()[:16]
        return Path(tempfile.gettempdir()) / f"trl-warmup-tasks-{queue}"

    @classmethod
    def from_settings(cls, settings: Settings, **overrides: Any) -> WorkerOptions:
        """The options of a worker started with these settings (the command line's, or `serve`'s)."""
        values: dict[str, Any] = {
            "database_url": settings.resolved_database_url,
            "store_url": settings.resolved_store_url,
            "backend": settings.backend,
            "device": settings.worker_device(),
            "pool": settings.pool,
            "lease_s": settings.lease_s,
            "poll_s": settings.poll_interval_s,
            "task_timeout_s": settings.task_timeout_s,
            "grace_s": settings.grace_s,
            "exit_when_idle": settings.exit_when_idle,
            "max_attempts": settings.max_attempts,
            "retry_delay_s": settings.retry_delay_s,
            "world_sizes": settings.world_sizes,
        }
        return cls(**{**values, **overrides})


@dataclass
class TaskOutcome:
    task_id: int
    signature: str
    status: str  # done | failed | retry | released | lost
    seconds: float
    detail: str = ""


class Worker:
    """Claims and runs tasks of this host's toolchains: one per world size it rehearses (a torchrun
    rank sees fewer CPU threads, which are part of Inductor's key). Every size above 1 gives the same
    toolchain and pool entry: a job of any number of processes is rehearsed with 2 (planner/topology.py)."""

    def __init__(
        self,
        options: WorkerOptions,
        *,
        engine: Engine | None = None,
        store: BlobStore | None = None,
        toolchain: Toolchain | None = None,
        stop: threading.Event | None = None,
    ) -> None:
        self.options = options
        self.engine = engine or make_engine(options.database_url)
        self.store = store or open_store(options.store_url)
        self.stop = stop or threading.Event()  # set: claim nothing new
        # A database restart or failover is waited out (with backoff, logged once per outage), not
        # fatal: every queue and repository call is retried while the database is unavailable.
        self.outage = Outage(self.stop, logger=log)
        self.queue = riding_out(
            TaskQueue(
                self.engine,
                retry=RetryStrategy(max_attempts=options.max_attempts, base_delay_s=options.retry_delay_s),
            ),
            self.outage,
        )
        self.repository = riding_out(Repository(self.engine), self.outage)
        if toolchain is not None:
            self.toolchains = {1: toolchain}
        else:
            self.toolchains = {
                size: host_toolchain(options.backend, options.device, world_size=size)
                for size in options.world_sizes
            }
        self.toolchain = self.toolchains[min(self.toolchains)]
        self.outcomes: list[TaskOutcome] = []
        # (signature key, toolchain key) of done tasks whose jobs' manifests could not be written into
        # the bucket (the store was away): tried again whenever the queue is idle.
        self.unpublished: set[tuple[str, str]] = set()

    # --- the loop ----------------------------------------------------------------------------

    def run(self) -> list[TaskOutcome]:
        """Work until `stop` is set (or, with exit_when_idle, until the queue has nothing for us)."""
        self.store.check()
        self.remove_leftovers()
        for size, toolchain in self.toolchains.items():
            self.repository.register_worker(
                self._registration(size),
                Keyed.of(toolchain),
                pool=pool_entry(self.options.pool, size) if self.options.pool else None,
                host=socket.gethostname(),
            )
        log.info("worker %s ready for %s", self.options.worker_id, self.toolchain.short)
        try:
            while not self.stop.is_set():
                if self.options.max_tasks is not None and len(self.outcomes) >= self.options.max_tasks:
                    break
                task = self._claim()
                if task is None:
                    self._publish_again()
                    if self.options.exit_when_idle:
                        break
                    for size in self.toolchains:
                        self.repository.touch_worker(self._registration(size))
                    self.stop.wait(self.options.poll_s)
                    continue
                self.outcomes.append(self.process(task))
        except Exception as error:
            if not self._stopped_in_an_outage(error):
                raise
            log.warning(
                "stopped while the database is unavailable (%s): a task in progress goes back to the "
                "queue when its lease runs out",
                reason(error),
            )
        finally:
            self._deregister()
        return self.outcomes

    def remove_leftovers(self) -> None:
        """Task folders and upload temp files that killed workers left, said and removed; those of live
        workers sharing the folder or the store are locked by them and stay (warmup/leftovers.py)."""
        work_dir = self.options.task_root()
        folders = remove_abandoned(sorted(work_dir.glob(f"{TASK_FOLDER}*")))
        self._take_back_tasks_of_killed_workers(folders.paths)
        uploads = self.store.remove_stale_uploads()
        for removed, what in (
            (folders, f"task folders in {work_dir}"),
            (uploads, f"upload temp files in {self.store.location}"),
        ):
            if removed.paths:
                log.warning("%s", removed.describe(what))

    def _take_back_tasks_of_killed_workers(self, abandoned: list[Path]) -> None:
        """An abandoned task folder names its task and the worker that held it: that worker is dead (the
        kernel dropped its lock), so its lease ends now rather than when it runs out (a `warmup serve`
        restarted at once takes its own task back in seconds, not after the lease)."""
        for folder in abandoned:
            named = task_folder_owner(folder.name)
            if named is None:
                continue
            task_id, worker_id = named
            if self.queue.end_lease_of_dead_worker(task_id, worker_id):
                log.warning(
                    "task %d: its worker %s was killed (its task folder was abandoned); the task is due again now",
                    task_id,
                    worker_id,
                )

    def _stopped_in_an_outage(self, error: BaseException) -> bool:
        """Asked to stop while waiting out a database outage: the wait ends, and so does the worker."""
        return self.stop.is_set() and is_unavailable(error)

    def _deregister(self) -> None:
        for size in self.toolchains:
            try:
                self.repository.remove_worker(self._registration(size))
            except Exception as error:
                if not self._stopped_in_an_outage(error):
                    raise
                return  # unregistered or not, the row drops out of the workers list once it is stale

    def _claim(self) -> ClaimedTask | None:
        keys = list(dict.fromkeys(toolchain.key() for toolchain in self.toolchains.values()))
        for key in keys:
            task = self.queue.claim(self.options.worker_id, key, self.options.lease_s)
            if task is not None:
                return task
        return None

    def _registration(self, world_size: int) -> str:
        return self.options.worker_id if world_size == 1 else f"{self.options.worker_id}@{world_size}"

    def _toolchain_of(self, key: str) -> Toolchain:
        return next(toolchain for toolchain in self.toolchains.values() if toolchain.key() == key)

    def process(self, task: ClaimedTask) -> TaskOutcome:
        with log_context(
            task_id=task.id, signature=task.signature_key[:12], worker_id=self.options.worker_id
        ):
            return self._process(task)

    def _process(self, task: ClaimedTask) -> TaskOutcome:
        started = time.monotonic()
        signature = Signature.model_validate(task.signature)
        label = f"task {task.id} ({signature.shape_label})"
        log.info("%s: rehearsing (attempt %d)", label, task.attempts)
        if task.spec is None:
            self.queue.fail(
                task.id, self.options.worker_id, "no job needs this signature any more", retry=False
            )
            return TaskOutcome(task.id, signature.shape_label, "failed", 0.0, "orphan task")
        heartbeat = _Heartbeat(self.queue, task.id, self.options.worker_id, self.options.lease_s)
        heartbeat.start()
        # Locked while the task runs: a worker starting meanwhile leaves it alone (remove_leftovers).
        root = self.options.task_root()
        root.mkdir(parents=True, exist_ok=True)
        lock, work = locked_temp_dir(root, task_folder_prefix(task.id, self.options.worker_id))
        try:
            result = self._rehearse(Spec.model_validate(task.spec.data), signature, work, heartbeat)
            if heartbeat.lost.is_set():
                log.warning("%s: lost its lease during the rehearsal; dropped, publishing nothing", label)
                return TaskOutcome(
                    task.id,
                    signature.shape_label,
                    "lost",
                    time.monotonic() - started,
                    "another worker took the task over",
                )
            if result is None:  # stopped (SIGTERM) before the rehearsal finished
                self.queue.release(task.id, self.options.worker_id)
                return TaskOutcome(task.id, signature.shape_label, "released", time.monotonic() - started)
            return self._record(task, signature, result, started)
        except LeaseLostError as error:  # frozen or cut off past the lease: another worker has it
            log.warning("%s: dropped, its result unrecorded: %s", label, error)
            return TaskOutcome(task.id, signature.shape_label, "lost", time.monotonic() - started, str(error))
        except StoreError as error:  # the upload failed (store away or failing): retried like a crash
            log.warning("%s: uploading its artifacts failed: %s", label, error)
            state = self.queue.fail(task.id, self.options.worker_id, f"{type(error).__name__}: {error}")
            status = "retry" if state == "queued" else "failed"
            return TaskOutcome(task.id, signature.shape_label, status, time.monotonic() - started, str(error))
        except WarmupError as error:  # refused before compiling (unsupported, impossible shape): final
            log.warning("%s cannot be rehearsed: %s", label, error)
            self.queue.fail(task.id, self.options.worker_id, f"{type(error).__name__}: {error}", retry=False)
            return TaskOutcome(
                task.id, signature.shape_label, "failed", time.monotonic() - started, str(error)
            )
        except Exception as error:  # a crash of ours: record it on the task, keep working
            log.exception("%s failed", label)
            state = self.queue.fail(task.id, self.options.worker_id, f"{type(error).__name__}: {error}")
            return TaskOutcome(
                task.id,
                signature.shape_label,
                "retry" if state == "queued" else "failed",
                time.monotonic() - started,
                str(error),
            )
        finally:
            heartbeat.cancel()
            shutil.rmtree(work, ignore_errors=True)
            os.close(lock)

    # --- steps -------------------------------------------------------------------------------

    def _rehearse(
        self, spec: Spec, signature: Signature, work: Path, heartbeat: _Heartbeat
    ) -> SignatureResult | None:
        """Rehearse in a thread so that SIGTERM can stop waiting; None when stopped first."""
        from warmup.rehearsal.runner import rehearse

        box: dict[str, object] = {}
        cancel = threading.Event()

        def run() -> None:
            try:
                box["result"] = rehearse(
                    spec,
                    [signature],
                    work / "rehearsal",
                    timeout_s=self.options.task_timeout_s,
                    cancel=cancel,
                )[0]
            except BaseException as error:  # handed to the calling thread
                box["error"] = error

        thread = threading.Thread(target=run, name="rehearsal", daemon=True)
        thread.start()
        grace_deadline: float | None = None
        while thread.is_alive():
            thread.join(0.5)
            if heartbeat.lost.is_set():
                cancel.set()
            if self.stop.is_set() and grace_deadline is None:
                grace_deadline = time.monotonic() + self.options.grace_s
            if grace_deadline is not None and time.monotonic() > grace_deadline:
                cancel.set()
                thread.join(30)
                return None
        if "error" in box:
            raise box["error"]  # type: ignore[misc]
        return cast("SignatureResult", box["result"])

    def _record(
        self, task: ClaimedTask, signature: Signature, result: SignatureResult, started: float
    ) -> TaskOutcome:
        elapsed = time.monotonic() - started
        worker = self.options.worker_id
        if result.status != "ok":
            error = f"{result.status}: {result.note}" if result.note else result.status
            # a shape the spec's trainer does not produce fails again at every attempt: once is enough
            state = self.queue.fail(
                task.id, worker, error, log_tail=result.log_tail, retry=not result.permanent
            )
            log.warning("task %d %s: %s (%s)", task.id, signature.shape_label, error, state)
            return TaskOutcome(
                task.id, signature.shape_label, "retry" if state == "queued" else "failed", elapsed, error
            )
        refs = [FileRef(path=f.path, sha256=f.sha256, size=f.size) for f in result.files]
        self.queue.reserve_blobs(refs)  # before uploading: garbage collection must not take them
        if result.files and result.cache_dir is None:
            raise RehearsalError("the rehearsal listed files but no cache directory holding them")
        for file in result.files:
            self.store.put_file(Path(result.cache_dir or "") / file.path, file.sha256)
        self.queue.complete(task.id, worker, refs, result.compile_seconds, log_tail=result.log_tail or None)
        log.info(
            "task %d %s: done in %.1fs (%d files, compile %.1fs)",
            task.id,
            signature.shape_label,
            elapsed,
            len(refs),
            result.compile_seconds,
        )
        if result.trace_lost:
            log.warning(
                "task %d %s: %s; training traces those calls with Dynamo, and the warmed caches serve them",
                task.id,
                signature.shape_label,
                result.trace_lost,
            )
        try:
            published = self._publish_ready_manifests(task.signature_key, task.toolchain_key)
        except Exception:  # best effort, after the task is done: it must not count as a failed task
            log.exception("task %d: done, but publishing the manifests of its jobs failed", task.id)
            published = False
        if not published:
            log.warning("task %d: the manifests of the jobs it completed were not published yet", task.id)
            self.unpublished.add((task.signature_key, task.toolchain_key))
        return TaskOutcome(task.id, signature.shape_label, "done", elapsed, result.note)

    def _publish_again(self) -> None:
        for keys in sorted(self.unpublished):
            try:
                published = self._publish_ready_manifests(*keys)
            except Exception:
                log.exception("publishing manifests again failed")
                return
            if published:
                self.unpublished.discard(keys)
                log.info("published the manifests of signature %s's jobs after all", keys[0][:12])

    def _publish_ready_manifests(self, signature_key: str, toolchain_key: str) -> bool:
        """Jobs this task completed get their manifest written into the bucket (best effort); False
        if one could not be written."""
        from warmup.planner.planning import plan_spec

        published = True
        toolchain = self._toolchain_of(toolchain_key)
        for job_id, spec_key in self.repository.jobs_needing(signature_key, toolchain_key):
            status = self.repository.job_status(job_id)
            if status is None or status.state != "ready":
                continue
            try:
                spec_doc = self.repository.get_spec(spec_key)
                plan_size = len(plan_spec(Spec.model_validate(spec_doc.data)).signatures) if spec_doc else 0
                manifest = build_manifest(
                    self.repository,
                    None,
                    spec_key=spec_key,
                    toolchain=Keyed.of(toolchain),
                    signature_keys=status.manifest_keys(),
                    plan_size=plan_size,
                )
                if not manifest.missing:
                    publish_manifest(self.store, manifest)
            except WarmupError as error:
                published = False
                log.warning(
                    "could not publish the manifest of job %s: %s",
                    job_id,
                    error,
                    extra={"job_id": str(job_id)},
                )
        return published


class _Heartbeat(threading.Thread):
    """Renews the task's lease every lease/4 seconds; sets `lost` when another worker took it."""

    def __init__(self, queue: TaskQueue, task_id: int, worker_id: str, lease_s: float) -> None:
        super().__init__(name=f"heartbeat-{task_id}", daemon=True)
        self.queue, self.task_id, self.worker_id, self.lease_s = queue, task_id, worker_id, lease_s
        self.lost = threading.Event()
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.wait(self.lease_s / 4):
            try:
                self.queue.heartbeat(self.task_id, self.worker_id, self.lease_s)
            except LeaseLostError:
                self.lost.set()
                return
            except Exception as error:  # the database is away for a moment: the lease has slack
                log.warning("heartbeat of task %d failed: %s", self.task_id, error)

    def cancel(self) -> None:
        self._done.set()


__all__ = ["RehearsalError", "TaskOutcome", "Worker", "WorkerOptions"]
