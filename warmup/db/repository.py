"""Reads the API needs (jobs and their status, entries for manifests) and worker registration.

Everything that creates or moves tasks is in `warmup.db.queue.TaskQueue`; this module never does.
"""

from __future__ import annotations

import math
import re
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from typing import Any, cast

from sqlalchemy import Engine, String, and_, func, select, update
from sqlalchemy import cast as sql_cast
from sqlalchemy.orm import selectinload

from warmup.db import models as m
from warmup.db.columns import db_now
from warmup.db.engine import dialect_insert, make_sessionmaker
from warmup.db.records import (
    CoverageReportRecord,
    EntryRecord,
    FileRef,
    JobStatus,
    JobSummary,
    Keyed,
    SignatureState,
    SignatureStatus,
    TaskLog,
    WorkerRecord,
    job_state,
)
from warmup.errors import AmbiguousIdError, JobNotFoundError

# The fewest hex digits of a job's id that are taken for the id (when only one job's id starts with them).
MIN_ID_PREFIX = 4
# A manifest read refreshes an entry's last_used_at at most this often, so that many pods pulling
# the same cache do not all write to the database.
TOUCH_INTERVAL_S = 3600.0
CHUNK = 500


def pool_entry(pool: str, world_size: int) -> str:
    """The pools-table name of a pool for jobs of `world_size` processes.

    A job's toolchain is what one of its training processes sees, and under torchrun a CPU process
    runs fewer threads (part of Inductor's key): a worker registers `pool` for jobs of one process and
    `pool@N` for jobs of several. Every rank of a job of N > 1 processes compiles the same graphs
    and runs the same threads at any N (warmup/planner/topology.py), so one entry, `pool@2`,
    serves them all: a worker started with `--world-sizes 1,2` warms a job of 64 processes.
    """
    return pool if world_size == 1 else f"{pool}@2"


def signature_state(
    has_entry: bool, task_state: m.TaskState | None, unwarmable: str | None = None
) -> SignatureState:
    """A signature's state under a toolchain: ready once it has an entry, else its task's state.
    A done task without an entry means retention removed the entry: missing until re-submitted.
    A reported signature the job's spec cannot produce is unwarmable for that job (it has no task)."""
    if has_entry:
        return "ready"
    if unwarmable is not None:
        return "unwarmable"
    if task_state is None or task_state == m.TaskState.done:
        return "missing"
    return task_state.value  # type: ignore[return-value]


class Repository:
    """Queries over jobs, entries, specs and toolchains; worker and pool registration."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._sessions = make_sessionmaker(engine)

    # --- jobs ----------------------------------------------------------------------------------

    def find_job(self, spec_key: str, toolchain_key: str) -> uuid.UUID | None:
        with self._sessions() as session:
            return session.execute(
                select(m.Job.id).where(m.Job.spec_key == spec_key, m.Job.toolchain_key == toolchain_key)
            ).scalar_one_or_none()

    def resolve_job_id(self, given: str) -> uuid.UUID:
        """A job's id from its full form or from a prefix of its hex digits that only one job has (the status
        page and the command line show the first 8). JobNotFoundError when none has it, AmbiguousIdError when
        several do."""
        digits = given.strip().lower().replace("-", "")
        if not re.fullmatch(f"[0-9a-f]{{{MIN_ID_PREFIX},32}}", digits):
            raise AmbiguousIdError(
                f"{given!r} is not a job id: give the id `warmup submit` printed, or its first {MIN_ID_PREFIX} or "
                "more hex digits (the status page shows 8)"
            )
        if len(digits) == 32:
            return uuid.UUID(digits)
        with self._sessions() as session:
            # the text form differs by dialect (PostgreSQL's has dashes, a CHAR(32) column none)
            text = func.replace(sql_cast(m.Job.id, String), "-", "")
            found = list(
                session.execute(select(m.Job.id).where(text.like(f"{digits}%")).order_by(m.Job.id).limit(3))
                .scalars()
                .all()
            )
        if not found:
            raise JobNotFoundError(given)
        if len(found) > 1:
            shown = ", ".join(str(job_id) for job_id in found[:2]) + (", ..." if len(found) > 2 else "")
            raise AmbiguousIdError(
                f"job id prefix {given!r} is ambiguous: more than one job's id starts with it ({shown}); "
                "give more of its digits"
            )
        return found[0]

    def job_status(self, job_id: uuid.UUID) -> JobStatus | None:
        """The job with the state of every signature it needs (None if there is no such job)."""
        with self._sessions() as session:
            job = session.get(m.Job, job_id)
            if job is None:
                return None
            rows = session.execute(
                signature_rows([job_id])
                .join(m.Signature, m.Signature.key == m.JobSignature.signature_key)
                .add_columns(
                    m.Signature.data.label("signature"),
                    m.Entry.compile_seconds.label("entry_seconds"),
                    m.Task.id.label("task_id"),
                    m.Task.attempts,
                    m.Task.error,
                    m.Task.lease_owner,
                    m.Task.lease_expires_at,
                    and_(m.Task.state == m.TaskState.running, m.Task.lease_expires_at < db_now()).label(
                        "stalled"
                    ),
                    m.Task.run_after,
                    m.Task.heartbeat_at,
                    m.Task.finished_at,
                    m.Task.compile_seconds.label("task_seconds"),
                )
                .order_by(m.JobSignature.signature_key)
            ).all()
            signatures = []
            for row in rows:
                state = signature_state(row.entry_id is not None, row.task_state, row.unwarmable)
                signatures.append(
                    SignatureStatus(
                        key=row.signature_key,
                        signature=row.signature,
                        state=state,
                        source=row.source,
                        compile_seconds=row.entry_seconds if state == "ready" else row.task_seconds,
                        task_id=row.task_id,
                        attempts=row.attempts or 0,
                        error=row.unwarmable if state == "unwarmable" else row.error,
                        lease_owner=row.lease_owner,
                        lease_expires_at=row.lease_expires_at,
                        stalled=bool(row.stalled),
                        run_after=row.run_after,
                        heartbeat_at=row.heartbeat_at,
                        finished_at=row.finished_at,
                    )
                )
            counts: dict[str, Counter[str]] = {"plan": Counter(), "coverage": Counter()}
            for signature in signatures:
                counts[signature.source][signature.state] += 1
            return JobStatus(
                **_summary_fields(job, counts["plan"], counts["coverage"]),
                warnings=job.warnings,
                signatures=signatures,
            )

    def jobs_needing(self, signature_key: str, toolchain_key: str) -> list[tuple[uuid.UUID, str]]:
        """(job id, spec key) of every job that needs this signature under this toolchain."""
        with self._sessions() as session:
            rows = session.execute(
                select(m.Job.id, m.Job.spec_key)
                .join(m.JobSignature, m.JobSignature.job_id == m.Job.id)
                .where(m.JobSignature.signature_key == signature_key, m.Job.toolchain_key == toolchain_key)
            )
            return [(row.id, row.spec_key) for row in rows]

    def list_jobs(
        self,
        *,
        limit: int = 50,
        offset: int = 0,
        spec_key: str | None = None,
        toolchain_key: str | None = None,
    ) -> list[JobSummary]:
        """Newest first, with how many signatures are in each state. `spec_key` lists one spec's
        jobs under every toolchain (to explain a toolchain mismatch to a pod)."""
        with self._sessions() as session:
            query = select(m.Job).order_by(m.Job.created_at.desc(), m.Job.id).limit(limit).offset(offset)
            if spec_key is not None:
                query = query.where(m.Job.spec_key == spec_key)
            if toolchain_key is not None:
                query = query.where(m.Job.toolchain_key == toolchain_key)
            jobs = list(session.execute(query).scalars())
            counts: dict[tuple[uuid.UUID, str], Counter[str]] = defaultdict(Counter)
            if jobs:
                for row in session.execute(signature_rows([job.id for job in jobs])):
                    state = signature_state(row.entry_id is not None, row.task_state, row.unwarmable)
                    counts[row.job_id, row.source][state] += 1
            return [
                JobSummary(**_summary_fields(job, counts[job.id, "plan"], counts[job.id, "coverage"]))
                for job in jobs
            ]

    def task_log(self, task_id: int) -> TaskLog | None:
        with self._sessions() as session:
            task = session.get(m.Task, task_id)
            if task is None:
                return None
            return TaskLog(
                task_id=task.id,
                state=task.state.value,
                attempts=task.attempts,
                error=task.error,
                log_tail=task.log_tail,
            )

    def coverage_reports(self, job_id: uuid.UUID) -> list[CoverageReportRecord]:
        with self._sessions() as session:
            reports = session.execute(
                select(m.CoverageReport)
                .where(m.CoverageReport.job_id == job_id)
                .order_by(m.CoverageReport.id)
            ).scalars()
            return [
                CoverageReportRecord(
                    id=r.id,
                    job_id=r.job_id,
                    met=r.met,
                    missed=r.missed,
                    fresh_compiles=r.fresh_compiles,
                    details=r.details,
                    created_at=r.created_at,
                )
                for r in reports
            ]

    # --- entries and documents -----------------------------------------------------------------

    def entries_for(
        self, signature_keys: Sequence[str], toolchain_key: str, *, touch: bool = True
    ) -> dict[str, EntryRecord]:
        """The entries of these signatures under the toolchain (missing ones are absent), for a
        manifest. `touch` marks them used, which keeps them from retention."""
        found: dict[str, EntryRecord] = {}
        with self._sessions.begin() as session:
            for start in range(0, len(signature_keys), CHUNK):
                chunk = list(signature_keys[start : start + CHUNK])
                entries = session.execute(
                    select(m.Entry)
                    .where(m.Entry.toolchain_key == toolchain_key, m.Entry.signature_key.in_(chunk))
                    .options(selectinload(m.Entry.files).selectinload(m.EntryFile.blob))
                ).scalars()
                for entry in entries:
                    found[entry.signature_key] = EntryRecord(
                        signature_key=entry.signature_key,
                        toolchain_key=entry.toolchain_key,
                        compile_seconds=entry.compile_seconds,
                        created_at=entry.created_at,
                        files=[
                            FileRef(path=f.path, sha256=f.blob_sha256, size=f.blob.size) for f in entry.files
                        ],
                    )
                if touch and chunk:
                    session.execute(
                        update(m.Entry)
                        .where(
                            m.Entry.toolchain_key == toolchain_key,
                            m.Entry.signature_key.in_(chunk),
                            m.Entry.last_used_at < db_now(-TOUCH_INTERVAL_S),
                        )
                        .values(last_used_at=db_now())
                    )
        return found

    def toolchains_with_entries(self, signature_keys: Sequence[str]) -> dict[str, int]:
        """For each toolchain that has entries of some of these signatures: how many it has.
        Tells "warmed for another environment" (a toolchain mismatch) from "never warmed"."""
        counts: Counter[str] = Counter()
        with self._sessions() as session:
            for start in range(0, len(signature_keys), CHUNK):
                chunk = list(signature_keys[start : start + CHUNK])
                rows = session.execute(
                    select(m.Entry.toolchain_key, func.count())
                    .where(m.Entry.signature_key.in_(chunk))
                    .group_by(m.Entry.toolchain_key)
                )
                for toolchain_key, count in rows:
                    counts[toolchain_key] += count
        return dict(counts)

    def compile_seconds(self, signature_keys: Sequence[str], toolchain_key: str) -> dict[str, float]:
        """The compile seconds recorded for these signatures under the toolchain (those with an entry)."""
        found: dict[str, float] = {}
        with self._sessions() as session:
            for start in range(0, len(signature_keys), CHUNK):
                chunk = list(signature_keys[start : start + CHUNK])
                rows = session.execute(
                    select(m.Entry.signature_key, m.Entry.compile_seconds).where(
                        m.Entry.toolchain_key == toolchain_key,
                        m.Entry.signature_key.in_(chunk),
                        m.Entry.compile_seconds.is_not(None),
                    )
                )
                found.update({key: float(seconds) for key, seconds in rows if seconds is not None})
        return found

    def compile_samples(self, toolchain_key: str, *, limit: int = 5000) -> list[tuple[str, str, float]]:
        """(model config hash, phase, compile seconds) of the newest entries under the toolchain."""
        with self._sessions() as session:
            rows = session.execute(
                select(m.Signature.data, m.Entry.compile_seconds)
                .join(m.Signature, m.Signature.key == m.Entry.signature_key)
                .where(m.Entry.toolchain_key == toolchain_key, m.Entry.compile_seconds.is_not(None))
                .order_by(m.Entry.created_at.desc())
                .limit(limit)
            )
            return [
                (str(data.get("model")), str(data.get("phase")), float(seconds))
                for data, seconds in rows
                if isinstance(data, dict)
            ]

    def step_timings(
        self, toolchain_key: str, spec_matches: Callable[[dict[str, Any]], bool], *, limit: int = 200
    ) -> tuple[int, float]:
        """(steps, seconds) of the steady-state training steps timed by the newest coverage reports under the
        toolchain whose job's spec document `spec_matches` (WarmupCallback's `details.timed_steps`)."""
        with self._sessions() as session:
            rows = session.execute(
                select(m.Spec.data, m.CoverageReport.details)
                .join(m.Job, m.Job.id == m.CoverageReport.job_id)
                .join(m.Spec, m.Spec.key == m.Job.spec_key)
                .where(m.Job.toolchain_key == toolchain_key)
                .order_by(m.CoverageReport.id.desc())
                .limit(limit)
            )
            steps, seconds = 0, 0.0
            for spec, details in rows:
                timed = details.get("timed_steps") if isinstance(details, dict) else None
                if not isinstance(timed, dict) or not spec_matches(spec):
                    continue
                count, spent = timed.get("count"), timed.get("seconds")
                if (
                    isinstance(count, int)
                    and count > 0
                    and isinstance(spent, int | float)
                    and 0 < spent < math.inf
                ):
                    steps, seconds = steps + count, seconds + float(spent)
            return steps, seconds

    def get_spec(self, key: str) -> Keyed | None:
        return self._document(m.Spec, key)

    def get_toolchain(self, key: str) -> Keyed | None:
        return self._document(m.Toolchain, key)

    def get_signature(self, key: str) -> Keyed | None:
        return self._document(m.Signature, key)

    def _document(self, model: type[m.Spec | m.Toolchain | m.Signature], key: str) -> Keyed | None:
        with self._sessions() as session:
            row = cast("m.Spec | m.Toolchain | m.Signature | None", session.get(model, key))
            return Keyed(row.key, row.data) if row is not None else None

    # --- workers and pools ---------------------------------------------------------------------

    def register_worker(
        self, worker_id: str, toolchain: Keyed, *, pool: str | None = None, host: str | None = None
    ) -> None:
        """Record a worker and its toolchain; a worker naming a pool points the pool at its toolchain
        (the newest registration wins, which is what a rolling upgrade wants)."""
        with self._sessions.begin() as session:
            session.execute(
                dialect_insert(session, m.Toolchain)
                .values(key=toolchain.key, data=toolchain.data)
                .on_conflict_do_nothing()
            )
            worker = dialect_insert(session, m.Worker).values(
                id=worker_id, toolchain_key=toolchain.key, pool=pool, host=host
            )
            session.execute(
                worker.on_conflict_do_update(
                    index_elements=[m.Worker.id],
                    set_={
                        "toolchain_key": toolchain.key,
                        "pool": pool,
                        "host": host,
                        "started_at": db_now(),
                        "last_seen": db_now(),
                    },
                )
            )
            if pool is not None:
                session.execute(
                    dialect_insert(session, m.Pool)
                    .values(name=pool, toolchain_key=toolchain.key)
                    .on_conflict_do_update(
                        index_elements=[m.Pool.name],
                        set_={"toolchain_key": toolchain.key, "updated_at": db_now()},
                    )
                )

    def touch_worker(self, worker_id: str) -> bool:
        """An idle worker's sign of life; False if it is not registered."""
        with self._sessions.begin() as session:
            result = session.execute(
                update(m.Worker)
                .where(m.Worker.id == worker_id)
                .values(last_seen=db_now())
                .returning(m.Worker.id)
            )
            return result.scalar_one_or_none() is not None

    def remove_worker(self, worker_id: str) -> None:
        with self._sessions.begin() as session:
            worker = session.get(m.Worker, worker_id)
            if worker is not None:
                session.delete(worker)

    def list_workers(self, *, seen_within_s: float | None = None) -> list[WorkerRecord]:
        with self._sessions() as session:
            query = select(m.Worker).order_by(m.Worker.id)
            if seen_within_s is not None:
                query = query.where(m.Worker.last_seen >= db_now(-seen_within_s))
            return [
                WorkerRecord(
                    id=w.id,
                    toolchain_key=w.toolchain_key,
                    pool=w.pool,
                    host=w.host,
                    started_at=w.started_at,
                    last_seen=w.last_seen,
                )
                for w in session.execute(query).scalars()
            ]

    def resolve_pool(self, name: str, world_size: int = 1) -> Keyed | None:
        """The toolchain a named worker pool warms jobs of `world_size` processes under, or None if
        no worker has registered it (see `pool_entry`)."""
        with self._sessions() as session:
            row = session.execute(
                select(m.Toolchain.key, m.Toolchain.data)
                .join(m.Pool, m.Pool.toolchain_key == m.Toolchain.key)
                .where(m.Pool.name == pool_entry(name, world_size))
            ).one_or_none()
            return Keyed(row.key, row.data) if row is not None else None


def signature_rows(job_ids: list[uuid.UUID] | None = None) -> Any:
    """Each signature of these jobs (all jobs: None), with its entry and task under the job's toolchain."""
    query = (
        select(
            m.JobSignature.job_id,
            m.JobSignature.signature_key,
            m.JobSignature.source,
            m.JobSignature.unwarmable,
            m.Entry.id.label("entry_id"),
            m.Task.state.label("task_state"),
        )
        .join(m.Job, m.Job.id == m.JobSignature.job_id)
        .outerjoin(
            m.Entry,
            and_(
                m.Entry.signature_key == m.JobSignature.signature_key,
                m.Entry.toolchain_key == m.Job.toolchain_key,
            ),
        )
        .outerjoin(
            m.Task,
            and_(
                m.Task.signature_key == m.JobSignature.signature_key,
                m.Task.toolchain_key == m.Job.toolchain_key,
            ),
        )
    )
    return query if job_ids is None else query.where(m.JobSignature.job_id.in_(job_ids))


def _summary_fields(job: m.Job, planned: Counter[str], reported: Counter[str]) -> dict[str, Any]:
    return {
        "id": job.id,
        "spec_key": job.spec_key,
        "toolchain_key": job.toolchain_key,
        "created_at": job.created_at,
        "state": job_state(dict(planned)),  # what runs reported never decides it
        "counts": dict(planned),
        "reported": dict(reported),
    }
