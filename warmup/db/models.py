"""The database schema, as SQLAlchemy 2.0 models.

The migrations in `migrations/` are the only thing that creates these tables; a test checks that they
match this module. Keys of specs, toolchains and signatures are sha256 hex digests computed by the
library (`Spec.key()`, `Toolchain.key()`, `Signature.key()`); their JSON is stored next to the key so
that a worker can rebuild the object it must compile.
"""

from __future__ import annotations

import enum
import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Enum,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    Uuid,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from warmup.db.columns import JSONDocument, UTCDateTime, db_now

KEY = String(64)  # sha256 hex

# Stable constraint names, so that migrations can refer to them on every backend.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {datetime: UTCDateTime(), dict[str, Any]: JSONDocument}


class TaskState(enum.StrEnum):
    queued = "queued"  # waiting for a worker (maybe until run_after, after a failed attempt)
    running = "running"  # leased by a worker; claimable again once the lease expires
    done = "done"  # the entry is recorded
    failed = "failed"  # attempts exhausted or a permanent error; error and log_tail say why


class Spec(Base):
    __tablename__ = "specs"

    key: Mapped[str] = mapped_column(KEY, primary_key=True)
    data: Mapped[dict[str, Any]]
    created_at: Mapped[datetime] = mapped_column(default=db_now())


class Toolchain(Base):
    __tablename__ = "toolchains"

    key: Mapped[str] = mapped_column(KEY, primary_key=True)
    data: Mapped[dict[str, Any]]
    created_at: Mapped[datetime] = mapped_column(default=db_now())


class Pool(Base):
    """A named worker pool: the toolchain its workers registered most recently.

    A pool is a name, not a property of a toolchain: during a rolling upgrade the pool moves to the
    new toolchain while entries built under the old one stay valid for the pods still running it.
    """

    __tablename__ = "pools"

    name: Mapped[str] = mapped_column(String(128), primary_key=True)
    toolchain_key: Mapped[str] = mapped_column(ForeignKey("toolchains.key"))
    updated_at: Mapped[datetime] = mapped_column(default=db_now(), onupdate=db_now())


class Signature(Base):
    __tablename__ = "signatures"

    key: Mapped[str] = mapped_column(KEY, primary_key=True)
    data: Mapped[dict[str, Any]]
    created_at: Mapped[datetime] = mapped_column(default=db_now())


class Blob(Base):
    """One artifact file in the blob store, addressed by its sha256.

    `reserved_until` protects a blob that no entry references yet: a worker reserves its blobs before
    uploading them, and garbage collection only removes unreferenced blobs whose reservation is over.
    `damaged_at` and `damage`: when and how `warmup store check` found the stored copy wrong (missing,
    or other bytes); the check removed the entries that listed it, and storing the blob again clears it.
    """

    __tablename__ = "blobs"

    sha256: Mapped[str] = mapped_column(KEY, primary_key=True)
    size: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(default=db_now())
    reserved_until: Mapped[datetime] = mapped_column(default=db_now(), index=True)
    damaged_at: Mapped[datetime | None] = mapped_column(index=True)
    damage: Mapped[str | None] = mapped_column(Text)


class Entry(Base):
    """The compiled artifacts of one signature under one toolchain."""

    __tablename__ = "entries"
    __table_args__ = (UniqueConstraint("signature_key", "toolchain_key"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    signature_key: Mapped[str] = mapped_column(ForeignKey("signatures.key"))
    toolchain_key: Mapped[str] = mapped_column(ForeignKey("toolchains.key"), index=True)
    compile_seconds: Mapped[float | None] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(default=db_now())
    # Refreshed when a manifest lists the entry; retention removes entries unused for long.
    last_used_at: Mapped[datetime] = mapped_column(default=db_now(), index=True)

    files: Mapped[list[EntryFile]] = relationship(
        back_populates="entry", cascade="all, delete-orphan", passive_deletes=True, order_by="EntryFile.path"
    )


class EntryFile(Base):
    """One file of an entry: its path relative to the cache directory, and the blob with its bytes."""

    __tablename__ = "entry_files"

    entry_id: Mapped[int] = mapped_column(ForeignKey("entries.id", ondelete="CASCADE"), primary_key=True)
    path: Mapped[str] = mapped_column(String(1024), primary_key=True)
    blob_sha256: Mapped[str] = mapped_column(ForeignKey("blobs.sha256"), index=True)

    entry: Mapped[Entry] = relationship(back_populates="files")
    blob: Mapped[Blob] = relationship()


class Job(Base):
    """A warm-up job: make every signature of a spec present under a toolchain.

    One per (spec, toolchain): the unique constraint is what makes concurrent identical submissions
    land on one job.
    """

    __tablename__ = "jobs"
    __table_args__ = (UniqueConstraint("spec_key", "toolchain_key"),)

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid.uuid4)
    spec_key: Mapped[str] = mapped_column(ForeignKey("specs.key"))
    toolchain_key: Mapped[str] = mapped_column(ForeignKey("toolchains.key"), index=True)
    # What the planner could not enumerate, as it said when the job was submitted.
    warnings: Mapped[list[str]] = mapped_column(JSONDocument, default=list)
    created_at: Mapped[datetime] = mapped_column(default=db_now(), index=True)


class JobSignature(Base):
    """A signature of a job: from its plan (what the job is), or met by a training run and reported as
    missed (evidence: warmed where the job's spec can produce it; it never decides the job's state)."""

    __tablename__ = "job_signatures"
    __table_args__ = (CheckConstraint("source IN ('plan', 'coverage')", name="source"),)

    job_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    signature_key: Mapped[str] = mapped_column(ForeignKey("signatures.key"), primary_key=True, index=True)
    source: Mapped[str] = mapped_column(String(16), default="plan")
    # Why the job's spec cannot warm this reported signature (it gets no task); None: it can, or planned.
    unwarmable: Mapped[str | None] = mapped_column(Text)


class Task(Base):
    """Compiling one missing (signature, toolchain); shared by every job that needs it."""

    __tablename__ = "tasks"
    __table_args__ = (
        UniqueConstraint("signature_key", "toolchain_key"),
        # The claim query: this toolchain's tasks that are due, or whose lease has run out.
        Index("ix_tasks_claim", "toolchain_key", "state", "run_after"),
        CheckConstraint("attempts >= 0", name="attempts"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    signature_key: Mapped[str] = mapped_column(ForeignKey("signatures.key"))
    toolchain_key: Mapped[str] = mapped_column(ForeignKey("toolchains.key"))
    state: Mapped[TaskState] = mapped_column(
        Enum(TaskState, native_enum=False, length=16, create_constraint=True, name="task_state"),
        default=TaskState.queued,
    )
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    run_after: Mapped[datetime] = mapped_column(default=db_now())
    lease_owner: Mapped[str | None] = mapped_column(String(255))
    lease_expires_at: Mapped[datetime | None]
    heartbeat_at: Mapped[datetime | None]
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    error: Mapped[str | None] = mapped_column(Text)
    log_tail: Mapped[str | None] = mapped_column(Text)
    compile_seconds: Mapped[float | None] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(default=db_now())
    updated_at: Mapped[datetime] = mapped_column(default=db_now(), onupdate=db_now())


class CoverageReport(Base):
    """What a training run saw: the signatures it met, its fresh compiles, and the ones it missed."""

    __tablename__ = "coverage_reports"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    met: Mapped[list[str]] = mapped_column(JSONDocument)
    missed: Mapped[list[str]] = mapped_column(JSONDocument)
    fresh_compiles: Mapped[int] = mapped_column(Integer)
    # Anything else the reporter wants kept (host, rank, compile seconds still spent ...).
    details: Mapped[dict[str, Any]] = mapped_column(default=dict)
    created_at: Mapped[datetime] = mapped_column(default=db_now(), index=True)


class Worker(Base):
    __tablename__ = "workers"

    id: Mapped[str] = mapped_column(String(255), primary_key=True)
    toolchain_key: Mapped[str] = mapped_column(ForeignKey("toolchains.key"), index=True)
    pool: Mapped[str | None] = mapped_column(String(128))
    host: Mapped[str | None] = mapped_column(String(255))
    started_at: Mapped[datetime] = mapped_column(default=db_now())
    last_seen: Mapped[datetime] = mapped_column(default=db_now(), onupdate=db_now())


class Token(Base):
    """An API bearer token. Only its sha256 is stored: the token itself is shown once, at creation."""

    __tablename__ = "tokens"

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid.uuid4)
    name: Mapped[str] = mapped_column(String(128))
    scopes: Mapped[list[str]] = mapped_column(JSONDocument)
    token_sha256: Mapped[str] = mapped_column(KEY, unique=True)
    created_at: Mapped[datetime] = mapped_column(default=db_now())
    revoked_at: Mapped[datetime | None]
