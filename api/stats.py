"""Aggregate reads over the database for /metrics and the status page.

Each read is one grouped query (no per-row work in Python except over its few result rows), so a
scrape stays cheap however many tasks and entries there are. The exception is compile seconds
saved, which needs each coverage report's signatures: reports never change once written, so the
total is kept running and each report is read once.
"""

from __future__ import annotations

import threading
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast, get_args

from sqlalchemy import Engine, case, func, select
from sqlalchemy.orm import QueryableAttribute
from sqlalchemy.sql.elements import ColumnElement

from warmup.api.services import TTLCache
from warmup.db import models as m
from warmup.db.columns import db_now
from warmup.db.engine import make_sessionmaker
from warmup.db.integrity import damaged_blobs
from warmup.db.records import JobState, job_state
from warmup.db.repository import signature_rows, signature_state
from warmup.toolchain.model import Toolchain

# Compile times range from seconds (Inductor) to a minute (a Neuron graph) to many minutes (a new
# GRPO static-cache size on Trainium).
DURATION_BUCKETS = (1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 900.0, 1800.0, 3600.0)
CHUNK = 500
REPORT_WINDOW = 1000

# A coverage report with its job's toolchain: what its seconds saved are computed from.
_REPORTS = select(
    m.CoverageReport.id,
    m.CoverageReport.job_id,
    m.CoverageReport.created_at,
    m.CoverageReport.met,
    m.CoverageReport.missed,
    m.CoverageReport.fresh_compiles,
    m.Job.toolchain_key,
).join(m.Job, m.Job.id == m.CoverageReport.job_id)


@dataclass(frozen=True)
class Histogram:
    buckets: list[tuple[float, int]]  # (upper bound, cumulative count); the last bound is +Inf
    count: int
    total: float


@dataclass(frozen=True)
class CacheRow:
    """What one toolchain's cache holds."""

    toolchain_key: str
    toolchain: str  # a readable label
    entries: int
    bytes: int  # distinct blobs its entries reference
    compile_seconds: float  # what building its entries cost
    last_used_at: datetime | None


@dataclass(frozen=True)
class CoveragePoint:
    """One training run's report."""

    id: int
    job_id: uuid.UUID
    created_at: datetime
    met: int
    missed: int
    fresh_compiles: int
    seconds_saved: float


def toolchain_label(data: dict[str, Any]) -> str:
    try:
        return Toolchain.model_validate(data).short
    except ValueError:  # a document written by an older version: say what we can
        return f"{data.get('backend', '?')}/{data.get('device', '?')}"


class Stats:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._sessions = make_sessionmaker(engine)
        self._saved: TTLCache[int, float] = TTLCache(1024, 24 * 3600.0)  # report id -> seconds saved
        self._lock = threading.Lock()
        self._saved_total = 0.0
        self._high_water = 0  # the highest report id counted in _saved_total
        self._counted: set[int] = set()  # counted ids within REPORT_WINDOW of it

    # --- jobs and tasks ----------------------------------------------------------------------

    def job_states(self) -> dict[str, int]:
        """Jobs by state (every JobState), by the same rule as a job's status: its planned signatures'."""
        rows = signature_rows().where(m.JobSignature.source == "plan").subquery()
        has_entry = rows.c.entry_id.isnot(None).label("has_entry")
        query = select(rows.c.job_id, has_entry, rows.c.task_state, func.count()).group_by(
            rows.c.job_id, has_entry, rows.c.task_state
        )
        per_job: dict[uuid.UUID, Counter[str]] = defaultdict(Counter)
        with self._sessions() as session:
            for job_id, has_entry, task_state, count in session.execute(query):
                per_job[job_id][signature_state(bool(has_entry), task_state)] += count
            jobs = session.execute(select(func.count()).select_from(m.Job)).scalar_one()
        states = Counter(job_state(dict(counts)) for counts in per_job.values())
        states["ready"] += jobs - len(per_job)  # a job with no signature has nothing left to do
        return {state: states[state] for state in get_args(JobState)}  # every state, zeros too

    def tasks(self) -> dict[tuple[str, str], int]:
        """(toolchain key, task state) -> number of tasks: queued and running are the queue depth."""
        with self._sessions() as session:
            rows = session.execute(
                select(m.Task.toolchain_key, m.Task.state, func.count()).group_by(
                    m.Task.toolchain_key, m.Task.state
                )
            )
            return {(key, state.value): count for key, state, count in rows}

    def task_durations(self) -> Histogram:
        """Wall time of finished task attempts (claim to done), rehearsal and upload together."""
        seconds = self._seconds_between(m.Task.started_at, m.Task.finished_at)
        return self._histogram(
            seconds,
            m.Task.state == m.TaskState.done,
            m.Task.started_at.isnot(None),
            m.Task.finished_at.isnot(None),
        )

    def compile_durations(self) -> Histogram:
        """Compile seconds of the entries in the caches."""
        return self._histogram(m.Entry.compile_seconds, m.Entry.compile_seconds.isnot(None))

    def workers(self, seen_within_s: float = 300.0) -> dict[str, int]:
        """Toolchain key -> workers seen within the last `seen_within_s` seconds."""
        with self._sessions() as session:
            rows = session.execute(
                select(m.Worker.toolchain_key, func.count())
                .where(m.Worker.last_seen >= db_now(-seen_within_s))
                .group_by(m.Worker.toolchain_key)
            )
            # A Row unpacks like a tuple (Result.tuples() is deprecated in SQLAlchemy 2.1).
            return {toolchain: count for toolchain, count in rows}

    # --- caches ------------------------------------------------------------------------------

    def blobs(self) -> tuple[int, int]:
        """(number of blobs, bytes) in the store, as the database knows them."""
        with self._sessions() as session:
            count, size = session.execute(select(func.count(), func.coalesce(func.sum(m.Blob.size), 0))).one()
            return int(count), int(size)

    def damaged_blobs(self) -> tuple[int, datetime | None]:
        """(blobs `warmup store check` found damaged and nobody stored again yet, when the latest was found)."""
        return damaged_blobs(self.engine)

    def caches(self) -> list[CacheRow]:
        """One row per toolchain that has entries, largest first."""
        pairs = (
            select(m.Entry.toolchain_key, m.EntryFile.blob_sha256)
            .join(m.EntryFile, m.EntryFile.entry_id == m.Entry.id)
            .group_by(m.Entry.toolchain_key, m.EntryFile.blob_sha256)
            .subquery()
        )
        with self._sessions() as session:
            sizes: dict[str, int] = dict(
                session.execute(
                    select(pairs.c.toolchain_key, func.sum(m.Blob.size))
                    .join(m.Blob, m.Blob.sha256 == pairs.c.blob_sha256)
                    .group_by(pairs.c.toolchain_key)
                ).all()  # a Result has keys(): dict() would treat it as a mapping
            )
            rows = session.execute(
                select(
                    m.Entry.toolchain_key,
                    m.Toolchain.data,
                    func.count(),
                    func.coalesce(func.sum(m.Entry.compile_seconds), 0.0),
                    func.max(m.Entry.last_used_at),
                )
                .join(m.Toolchain, m.Toolchain.key == m.Entry.toolchain_key)
                .group_by(m.Entry.toolchain_key, m.Toolchain.data)
            ).all()
        caches = [
            CacheRow(
                toolchain_key=key,
                toolchain=toolchain_label(data),
                entries=count,
                bytes=int(sizes.get(key) or 0),
                compile_seconds=float(seconds),
                last_used_at=last_used,
            )
            for key, data, count, seconds, last_used in rows
        ]
        return sorted(caches, key=lambda c: -c.bytes)

    def toolchain_labels(self, keys: set[str]) -> dict[str, str]:
        with self._sessions() as session:
            rows = session.execute(
                select(m.Toolchain.key, m.Toolchain.data).where(m.Toolchain.key.in_(sorted(keys)))
            )
            return {key: toolchain_label(data) for key, data in rows}

    # --- coverage ----------------------------------------------------------------------------

    def coverage(self, limit: int) -> list[CoveragePoint]:
        """The newest `limit` reports of training runs, oldest first, with the compile seconds each
        one saved: the compile seconds of the entries of the signatures it met warm."""
        with self._sessions() as session:
            rows = session.execute(_REPORTS.order_by(m.CoverageReport.id.desc()).limit(limit)).all()
        return [
            CoveragePoint(
                id=row.id,
                job_id=row.job_id,
                created_at=row.created_at,
                met=len(row.met),
                missed=len(row.missed),
                fresh_compiles=row.fresh_compiles,
                seconds_saved=self._seconds_saved(row),
            )
            for row in reversed(rows)
        ]

    def coverage_totals(self) -> tuple[int, int, float]:
        """(reports, fresh compiles they reported, compile seconds they saved), over all reports.

        Reports never change, so the seconds saved are a running total: each call adds the reports
        it has not counted yet. Ids up to REPORT_WINDOW below the highest counted one are looked at
        again, for reports whose transaction committed after a later one's."""
        # One session at a time: on SQLite every transaction takes the database lock.
        with self._sessions() as session:
            reports, fresh = session.execute(
                select(func.count(), func.coalesce(func.sum(m.CoverageReport.fresh_compiles), 0))
            ).one()
        with self._lock:  # one caller at a time moves the running total
            with self._sessions() as session:
                ids = session.execute(
                    select(m.CoverageReport.id).where(m.CoverageReport.id > self._high_water - REPORT_WINDOW)
                ).scalars()
                new = sorted(set(ids) - self._counted)
                rows = [
                    row
                    for start in range(0, len(new), CHUNK)
                    for row in session.execute(
                        _REPORTS.where(m.CoverageReport.id.in_(new[start : start + CHUNK]))
                    )
                ]
            self._saved_total += sum(self._seconds_saved(row) for row in rows)
            self._high_water = max([self._high_water, *new])
            self._counted = {i for i in self._counted | set(new) if i > self._high_water - REPORT_WINDOW}
            return int(reports), int(fresh), self._saved_total

    def _seconds_saved(self, row: Any) -> float:
        """What one report saved (remembered for the newest reports, which the status page shows)."""
        known = self._saved.get(row.id)
        if known is not None:
            return known
        warm = sorted(set(row.met) - set(row.missed))
        total = 0.0
        with self._sessions() as session:
            for start in range(0, len(warm), CHUNK):
                total += cast(  # coalesce: never NULL
                    float,
                    session.execute(
                        select(func.coalesce(func.sum(m.Entry.compile_seconds), 0.0)).where(
                            m.Entry.toolchain_key == row.toolchain_key,
                            m.Entry.signature_key.in_(warm[start : start + CHUNK]),
                        )
                    ).scalar_one(),
                )
        self._saved.put(row.id, float(total))
        return float(total)

    # --- helpers -----------------------------------------------------------------------------

    def _seconds_between(self, start: Any, end: Any) -> ColumnElement[Any]:
        if self.engine.dialect.name == "postgresql":
            return func.extract("epoch", end - start)
        return (func.julianday(end) - func.julianday(start)) * 86400.0

    def _histogram(
        self, value: ColumnElement[Any] | QueryableAttribute[Any], *where: ColumnElement[bool]
    ) -> Histogram:
        columns = [func.count(), func.coalesce(func.sum(value), 0.0)]
        columns += [
            func.coalesce(func.sum(case((value <= bound, 1), else_=0)), 0) for bound in DURATION_BUCKETS
        ]
        with self._sessions() as session:
            count, total, *cumulative = session.execute(select(*columns).where(*where)).one()
        buckets = [(bound, int(n)) for bound, n in zip(DURATION_BUCKETS, cumulative, strict=True)]
        return Histogram(buckets=[*buckets, (float("inf"), int(count))], count=int(count), total=float(total))
