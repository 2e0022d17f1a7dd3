"""The task queue: every operation that creates a task or moves one between states lives here.

A task compiles one (signature, toolchain) and is shared by every job that needs it. Its life:

    queued --claim--> running --complete--> done
       ^                 |  \\--fail (attempts left)--> queued (run_after = now + backoff)
       |                 |   \\-fail (no attempts left, or permanent)--> failed
       +----release------+
       +--lease expired, claimed again (a stalled worker: no heartbeat)

A worker holds a task while the task is `running` with its name as `lease_owner`. The lease expires at
`lease_expires_at` unless heartbeats extend it; after that any worker of the toolchain may claim the
task, and only then does the first worker lose it: complete, fail, heartbeat and release all check
ownership in the same statement that changes the task, so a stolen task is never published twice.

Claims are one UPDATE ... WHERE id = (SELECT ... FOR UPDATE SKIP LOCKED) on PostgreSQL, so concurrent
workers never wait for each other; on SQLite the same statement runs in a BEGIN IMMEDIATE transaction
(see warmup.db.engine), which makes the single writer the lock.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy import Engine, and_, case, exists, literal, or_, select, update
from sqlalchemy.orm import Session

from warmup.db import models as m
from warmup.db.columns import db_now
from warmup.db.engine import dialect_insert, make_sessionmaker
from warmup.db.records import ClaimedTask, CoverageResult, FileRef, Keyed, SubmitResult
from warmup.errors import JobNotFoundError, LeaseLostError

TaskState = m.TaskState

# Rows per INSERT / IN list: far below PostgreSQL's 65535 bind parameters.
CHUNK = 500

# How long a worker's reservation keeps its not-yet-referenced blobs safe from garbage collection.
# It only has to outlast one upload and the `complete` call that follows it.
BLOB_RESERVATION_S = 6 * 3600.0


@dataclass(frozen=True)
class RetryStrategy:
    """Exponential backoff: attempt n (1-based) that fails waits base * factor**(n-1), capped."""

    max_attempts: int = 3
    base_delay_s: float = 30.0
    factor: float = 2.0
    max_delay_s: float = 3600.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if self.base_delay_s < 0 or self.factor < 1 or self.max_delay_s < 0:
            raise ValueError("delays must be non-negative and factor at least 1")

    def delay(self, attempts: int) -> float | None:
        """Seconds to wait before the next attempt after `attempts` failed ones; None: give up."""
        if attempts >= self.max_attempts:
            return None
        return min(self.base_delay_s * self.factor ** max(attempts - 1, 0), self.max_delay_s)


class TaskQueue:
    """Submits jobs, hands out tasks to workers and records their results."""

    def __init__(
        self, engine: Engine, *, retry: RetryStrategy | None = None, log_limit: int = 64_000
    ) -> None:
        self.engine = engine
        self.retry = retry or RetryStrategy()
        self.log_limit = log_limit
        self._sessions = make_sessionmaker(engine)

    # --- submission ----------------------------------------------------------------------------

    def submit_job(
        self,
        spec: Keyed,
        toolchain: Keyed,
        signatures: Sequence[Keyed],
        *,
        warnings: Sequence[str] = (),
        retry_failed: bool = False,
    ) -> SubmitResult:
        """Create the job for (spec, toolchain), or return the existing one, and enqueue one task per
        signature that has no entry under the toolchain and no task yet.

        Idempotent and safe under concurrent identical submissions: the job's unique constraint and
        INSERT ... ON CONFLICT decide, not a check-then-insert. Submitting again re-queues tasks whose
        entry has since been removed by retention, and, with `retry_failed`, tasks that failed.
        """
        signatures = _unique(signatures)
        keys = [s.key for s in signatures]
        with self._sessions.begin() as session:
            self._store_documents(session, m.Spec, [spec])
            self._store_documents(session, m.Toolchain, [toolchain])
            self._store_documents(session, m.Signature, signatures)
            job_id = session.execute(
                dialect_insert(session, m.Job)
                .values(
                    id=uuid.uuid4(), spec_key=spec.key, toolchain_key=toolchain.key, warnings=list(warnings)
                )
                .on_conflict_do_nothing()
                .returning(m.Job.id)
            ).scalar_one_or_none()
            created = job_id is not None
            if job_id is None:
                job_id = session.execute(
                    select(m.Job.id).where(m.Job.spec_key == spec.key, m.Job.toolchain_key == toolchain.key)
                ).scalar_one()
            self._link_signatures(session, job_id, keys, source="plan")
            with_entry = self._keys_with_entry(session, keys, toolchain.key)
            enqueued = self._enqueue(
                session, [k for k in keys if k not in with_entry], toolchain.key, retry_failed
            )
        return SubmitResult(job_id=job_id, created=created, enqueued=enqueued, reused=len(with_entry))

    def record_coverage(
        self,
        job_id: uuid.UUID,
        *,
        met: Sequence[str],
        missed: Sequence[Keyed],
        fresh_compiles: int,
        details: dict[str, Any] | None = None,
        unwarmable: Mapping[str, str] | None = None,
    ) -> CoverageResult:
        """Keep what a training run saw. The signatures it missed join the job as evidence (they never
        change its state): each the job's spec can produce becomes a task where it has no entry and no task
        under the job's toolchain; each it cannot (`unwarmable`: key -> why) is recorded with its reason, once,
        and gets no task."""
        missed = _unique(missed)
        refused = {key: why for key, why in (unwarmable or {}).items() if key in {s.key for s in missed}}
        with self._sessions.begin() as session:
            job = session.get(m.Job, job_id)
            if job is None:
                raise JobNotFoundError(job_id)
            keys = [s.key for s in missed]
            self._store_documents(session, m.Signature, missed)
            self._link_signatures(session, job_id, keys, source="coverage", unwarmable=refused)
            with_entry = self._keys_with_entry(session, keys, job.toolchain_key)
            # a link the plan made first keeps its source: that signature is the job's own, and warmable
            planned = set(
                session.execute(
                    select(m.JobSignature.signature_key).where(
                        m.JobSignature.job_id == job_id,
                        m.JobSignature.signature_key.in_(list(refused)),
                        m.JobSignature.source == "plan",
                    )
                ).scalars()
            )
            refused = {key: why for key, why in refused.items() if key not in planned}
            enqueued = self._enqueue(
                session,
                [k for k in keys if k not in with_entry and k not in refused],
                job.toolchain_key,
                False,
            )
            report = m.CoverageReport(
                job_id=job_id,
                met=list(met),
                missed=keys,
                fresh_compiles=fresh_compiles,
                details=details or {},
            )
            session.add(report)
            session.flush()
            return CoverageResult(report_id=report.id, enqueued=enqueued, unwarmable=refused)

    # --- workers -------------------------------------------------------------------------------

    def claim(self, worker_id: str, toolchain_key: str, lease_s: float) -> ClaimedTask | None:
        """Lease the next due task of this toolchain to `worker_id`, or None if there is none.

        Due: queued and past its backoff, or running under a lease that expired (its worker stopped
        heartbeating) with attempts left. Each claim counts as an attempt.
        """
        now = db_now()
        due = or_(
            and_(m.Task.state == TaskState.queued, m.Task.run_after <= now),
            and_(
                m.Task.state == TaskState.running,
                m.Task.lease_expires_at < now,
                m.Task.attempts < self.retry.max_attempts,
            ),
        )
        pick = (
            select(m.Task.id)
            .where(m.Task.toolchain_key == toolchain_key, due)
            .order_by(m.Task.run_after, m.Task.id)
            .limit(1)
            .with_for_update(skip_locked=True)
            .scalar_subquery()
        )
        stalled_note = literal("the previous attempt stopped: the lease of worker ") + m.Task.lease_owner
        claim = (
            update(m.Task)
            .where(m.Task.id == pick)
            .values(
                state=TaskState.running,
                attempts=m.Task.attempts + 1,
                lease_owner=worker_id,
                lease_expires_at=db_now(lease_s),
                heartbeat_at=now,
                started_at=now,
                finished_at=None,
                error=case(
                    (m.Task.state == TaskState.running, stalled_note + " expired"), else_=m.Task.error
                ),
            )
            .returning(m.Task.id, m.Task.signature_key, m.Task.attempts, m.Task.lease_expires_at)
        )
        with self._sessions.begin() as session:
            self._fail_stalled(session, toolchain_key)
            row = session.execute(claim).one_or_none()
            if row is None:
                return None
            signature = session.get_one(m.Signature, row.signature_key)
            spec = session.execute(
                select(m.Spec.key, m.Spec.data)
                .join(m.Job, m.Job.spec_key == m.Spec.key)
                .join(m.JobSignature, m.JobSignature.job_id == m.Job.id)
                .where(
                    m.JobSignature.signature_key == row.signature_key, m.Job.toolchain_key == toolchain_key
                )
                # a spec that plans the signature produces it; one whose run only reported it may not
                .order_by(case((m.JobSignature.source == "plan", 0), else_=1), m.Job.created_at, m.Job.id)
                .limit(1)
            ).one_or_none()
            return ClaimedTask(
                id=row.id,
                signature_key=row.signature_key,
                signature=signature.data,
                toolchain_key=toolchain_key,
                spec=Keyed(spec.key, spec.data) if spec else None,
                attempts=row.attempts,
                lease_expires_at=row.lease_expires_at,
            )

    def heartbeat(
        self, task_id: int, worker_id: str, lease_s: float, *, log_tail: str | None = None
    ) -> datetime:
        """Extend the lease by `lease_s` from now; returns the new expiry. Raises LeaseLostError if the
        worker no longer holds the task (it must then stop and publish nothing)."""
        values: dict[str, Any] = {"lease_expires_at": db_now(lease_s), "heartbeat_at": db_now()}
        if log_tail is not None:
            values["log_tail"] = self._tail(log_tail)
        with self._sessions.begin() as session:
            expires = session.execute(
                update(m.Task)
                .where(*self._held(task_id, worker_id))
                .values(**values)
                .returning(m.Task.lease_expires_at)
            ).scalar_one_or_none()
            if expires is None:
                raise LeaseLostError(task_id, worker_id)
            session.execute(update(m.Worker).where(m.Worker.id == worker_id).values(last_seen=db_now()))
            return expires

    def reserve_blobs(self, files: Iterable[FileRef], *, ttl_s: float = BLOB_RESERVATION_S) -> None:
        """Protect these blobs from garbage collection for `ttl_s` seconds. A worker calls this before
        it uploads the blobs of a new entry; once the entry is recorded, the entry protects them."""
        rows = {f.sha256: f.size for f in files}
        if not rows:
            return
        with self._sessions.begin() as session:
            for chunk in _chunks(sorted(rows.items())):
                stmt = dialect_insert(session, m.Blob).values(
                    [{"sha256": sha, "size": size, "reserved_until": db_now(ttl_s)} for sha, size in chunk]
                )
                session.execute(
                    stmt.on_conflict_do_update(
                        index_elements=[m.Blob.sha256],
                        set_={"reserved_until": _later(m.Blob.reserved_until, stmt.excluded.reserved_until)},
                    )
                )

    def complete(
        self,
        task_id: int,
        worker_id: str,
        files: Sequence[FileRef],
        compile_seconds: float | None,
        *,
        log_tail: str | None = None,
    ) -> int:
        """Record the entry of a finished task and mark the task done, in one transaction, only if
        `worker_id` still holds the task. Returns the entry id. The blobs must already be uploaded.

        Raises LeaseLostError (and records nothing) if the lease was lost.
        """
        paths = [f.path for f in files]
        if len(set(paths)) != len(paths):
            raise ValueError(f"task {task_id}: an entry lists a path twice")
        values: dict[str, Any] = {
            "state": TaskState.done,
            "finished_at": db_now(),
            "lease_expires_at": None,
            "compile_seconds": compile_seconds,
            "error": None,
        }
        if log_tail is not None:
            values["log_tail"] = self._tail(log_tail)
        with self._sessions.begin() as session:
            task = session.execute(
                update(m.Task)
                .where(*self._held(task_id, worker_id))
                .values(**values)
                .returning(m.Task.signature_key, m.Task.toolchain_key)
            ).one_or_none()
            if task is None:
                raise LeaseLostError(task_id, worker_id)
            blobs = sorted({f.sha256: f.size for f in files}.items())  # one lock order for everyone
            self._insert_ignore(session, m.Blob, [{"sha256": sha, "size": size} for sha, size in blobs])
            self._clear_damage(session, [sha for sha, _size in blobs])
            entry_id: int | None = session.execute(
                dialect_insert(session, m.Entry)
                .values(
                    signature_key=task.signature_key,
                    toolchain_key=task.toolchain_key,
                    compile_seconds=compile_seconds,
                )
                .on_conflict_do_nothing()
                .returning(m.Entry.id)
            ).scalar_one_or_none()
            if entry_id is None:  # recorded already (by an import, say): keep the first one whole
                existing: int = session.execute(
                    select(m.Entry.id).where(
                        m.Entry.signature_key == task.signature_key,
                        m.Entry.toolchain_key == task.toolchain_key,
                    )
                ).scalar_one()
                return existing
            self._insert_ignore(
                session,
                m.EntryFile,
                [{"entry_id": entry_id, "path": f.path, "blob_sha256": f.sha256} for f in files],
            )
            return entry_id

    def fail(
        self, task_id: int, worker_id: str, error: str, *, log_tail: str | None = None, retry: bool = True
    ) -> TaskState:
        """Record a failed attempt. With attempts left (and `retry`), the task is queued again after
        the strategy's backoff; otherwise it fails for good with its error and log. Returns the new
        state. Raises LeaseLostError if the worker no longer holds the task."""
        with self._sessions.begin() as session:
            attempts = session.execute(
                select(m.Task.attempts).where(*self._held(task_id, worker_id)).with_for_update()
            ).scalar_one_or_none()
            if attempts is None:
                raise LeaseLostError(task_id, worker_id)
            delay = self.retry.delay(attempts) if retry else None
            values: dict[str, Any] = {"error": error, "lease_expires_at": None}
            if log_tail is not None:  # else keep what the heartbeats sent
                values["log_tail"] = self._tail(log_tail)
            state = TaskState.failed if delay is None else TaskState.queued
            if delay is None:
                values.update(state=state, finished_at=db_now())
            else:
                values.update(state=state, run_after=db_now(delay))
            session.execute(update(m.Task).where(*self._held(task_id, worker_id)).values(**values))
            return state

    def release(self, task_id: int, worker_id: str) -> None:
        """Give a task back without counting the attempt (a worker shutting down on SIGTERM).
        Raises LeaseLostError if the worker no longer holds it."""
        with self._sessions.begin() as session:
            released = session.execute(
                update(m.Task)
                .where(*self._held(task_id, worker_id))
                .values(
                    state=TaskState.queued,
                    attempts=case((m.Task.attempts > 0, m.Task.attempts - 1), else_=0),
                    run_after=db_now(),
                    lease_expires_at=None,
                )
                .returning(m.Task.id)
            ).scalar_one_or_none()
            if released is None:
                raise LeaseLostError(task_id, worker_id)

    def end_lease_of_dead_worker(self, task_id: int, worker_id: str) -> bool:
        """End now the lease `worker_id` holds on a running task, when that worker is known to be dead (a
        worker found its task folder abandoned: warmup/leftovers.py); the next claim takes the task as it
        takes one whose lease ran out, counting the attempt. False if the worker no longer holds it."""
        with self._sessions.begin() as session:
            ended = session.execute(
                update(m.Task)
                .where(*self._held(task_id, worker_id))
                .values(lease_expires_at=db_now(-1))
                .returning(m.Task.id)
            ).scalar_one_or_none()
        return ended is not None

    def fail_stalled(self, toolchain_key: str | None = None) -> int:
        """Fail the tasks whose lease expired on their last allowed attempt; returns how many. `claim`
        does this for its toolchain; the server may call it for all of them."""
        with self._sessions.begin() as session:
            return self._fail_stalled(session, toolchain_key)

    # --- helpers -------------------------------------------------------------------------------

    def _fail_stalled(self, session: Session, toolchain_key: str | None) -> int:
        note = literal("gave up: the lease of worker ") + m.Task.lease_owner + " expired on the last attempt"
        stmt = (
            update(m.Task)
            .where(
                m.Task.state == TaskState.running,
                m.Task.lease_expires_at < db_now(),
                m.Task.attempts >= self.retry.max_attempts,
            )
            .values(state=TaskState.failed, finished_at=db_now(), lease_expires_at=None, error=note)
            .returning(m.Task.id)
        )
        if toolchain_key is not None:
            stmt = stmt.where(m.Task.toolchain_key == toolchain_key)
        return len(session.execute(stmt).all())

    @staticmethod
    def _held(task_id: int, worker_id: str) -> tuple[Any, ...]:
        """The task is running and leased to this worker. An expired lease still counts until another
        worker claims the task: the work done meanwhile is as good as any."""
        return (m.Task.id == task_id, m.Task.state == TaskState.running, m.Task.lease_owner == worker_id)

    @staticmethod
    def _clear_damage(session: Session, shas: list[str]) -> None:
        """The blobs were stored again for this entry: what `warmup store check` found is mended."""
        for chunk in _chunks(shas):
            session.execute(
                update(m.Blob)
                .where(m.Blob.sha256.in_(chunk), m.Blob.damaged_at.is_not(None))
                .values(damaged_at=None, damage=None)
            )

    def _tail(self, log: str) -> str:
        return log[-self.log_limit :]

    def _insert_ignore(self, session: Session, model: type[m.Base], rows: list[dict[str, Any]]) -> list[Any]:
        """Insert rows that do not exist yet (by any unique key); returns the primary keys inserted."""
        inserted: list[Any] = []
        pk = model.__mapper__.primary_key[0]
        for chunk in _chunks(rows):
            stmt = dialect_insert(session, model).values(chunk).on_conflict_do_nothing().returning(pk)
            inserted.extend(session.execute(stmt).scalars())
        return inserted

    def _store_documents(self, session: Session, model: type[m.Base], docs: Sequence[Keyed]) -> None:
        # Sorted, so that concurrent submissions lock the same rows in the same order (no deadlock).
        self._insert_ignore(
            session, model, [{"key": d.key, "data": d.data} for d in sorted(docs, key=lambda d: d.key)]
        )

    def _link_signatures(
        self,
        session: Session,
        job_id: uuid.UUID,
        keys: list[str],
        source: str,
        unwarmable: Mapping[str, str] | None = None,
    ) -> None:
        why = unwarmable or {}
        rows = [
            {"job_id": job_id, "signature_key": k, "source": source, "unwarmable": why.get(k)}
            for k in sorted(keys)
        ]
        self._insert_ignore(session, m.JobSignature, rows)

    @staticmethod
    def _keys_with_entry(session: Session, keys: list[str], toolchain_key: str) -> set[str]:
        found: set[str] = set()
        for chunk in _chunks(keys):
            found.update(
                session.execute(
                    select(m.Entry.signature_key).where(
                        m.Entry.toolchain_key == toolchain_key, m.Entry.signature_key.in_(chunk)
                    )
                ).scalars()
            )
        return found

    def _enqueue(
        self, session: Session, keys: list[str], toolchain_key: str, retry_failed: bool
    ) -> list[str]:
        """Give each signature a task (it has no entry); re-queue finished tasks whose entry is gone.
        Returns the keys whose task is new or re-queued."""
        rows = [{"signature_key": k, "toolchain_key": toolchain_key} for k in sorted(keys)]
        new_ids = self._insert_ignore(session, m.Task, rows)
        enqueued: list[str] = []
        for chunk in _chunks(new_ids):
            enqueued.extend(
                session.execute(select(m.Task.signature_key).where(m.Task.id.in_(chunk))).scalars()
            )
        redo = [TaskState.done, TaskState.failed] if retry_failed else [TaskState.done]
        no_entry = ~exists().where(
            m.Entry.signature_key == m.Task.signature_key, m.Entry.toolchain_key == m.Task.toolchain_key
        )
        for chunk in _chunks(sorted(keys)):
            requeued = session.execute(
                update(m.Task)
                .where(
                    m.Task.toolchain_key == toolchain_key,
                    m.Task.signature_key.in_(chunk),
                    m.Task.state.in_(redo),
                    no_entry,
                )
                .values(state=TaskState.queued, attempts=0, run_after=db_now(), error=None, finished_at=None)
                .returning(m.Task.signature_key)
            ).scalars()
            enqueued.extend(requeued)
        return sorted(enqueued)


T = TypeVar("T")


def _chunks(items: Sequence[T], size: int = CHUNK) -> Iterator[Sequence[T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _unique(docs: Sequence[Keyed]) -> list[Keyed]:
    return list({d.key: d for d in docs}.values())


def _later(a: Any, b: Any) -> Any:
    """The later of two timestamps (GREATEST on PostgreSQL, MAX on SQLite)."""
    return case((a > b, a), else_=b)
