"""What the database layer takes and gives back: plain values, detached from any session.

The API serializes these directly; the worker reads `ClaimedTask`. Specs, toolchains and signatures
travel as `Keyed` (key + JSON), so this layer does not depend on their pydantic models.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from pathlib import PurePosixPath
from typing import Any, Literal, NamedTuple, Protocol

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, field_validator

from warmup.errors import UnsafeArtifactError

SHA256_PATTERN = r"^[0-9a-f]{64}$"


class _HasKey(Protocol):
    def key(self) -> str: ...
    def model_dump(self, *, mode: str = ...) -> dict[str, Any]: ...


class Keyed(NamedTuple):
    """A spec, toolchain or signature as the database sees it: its key and its JSON."""

    key: str
    data: dict[str, Any]

    @classmethod
    def of(cls, model: _HasKey) -> Keyed:
        """From any of the library's models (`Spec`, `Signature`, `Toolchain`)."""
        return cls(model.key(), model.model_dump(mode="json"))


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True)


class FileRef(_Record):
    """One file of an entry: where it goes in the cache directory and which blob holds its bytes."""

    path: str = Field(min_length=1, max_length=1024)
    sha256: str = Field(pattern=SHA256_PATTERN)
    size: NonNegativeInt

    @field_validator("path")
    @classmethod
    def _relative_and_inside(cls, path: str) -> str:
        pure = PurePosixPath(path)
        if pure.is_absolute() or ".." in pure.parts or "\\" in path or str(pure) != path:
            raise UnsafeArtifactError(
                f"artifact path {path!r} must be relative, normalized and stay inside the cache directory"
            )
        return path


class ClaimedTask(_Record):
    """A task leased to one worker: what to compile, and the spec that tells how to build it."""

    id: int
    signature_key: str
    signature: dict[str, Any]
    toolchain_key: str
    # Any job's spec that needs this signature under this toolchain (the oldest); None only if
    # every such job was deleted.
    spec: Keyed | None
    attempts: int
    lease_expires_at: datetime


class SubmitResult(_Record):
    job_id: uuid.UUID
    created: bool  # False: the same spec under the same toolchain had a job already
    enqueued: list[str]  # signature keys that got a new (or re-queued) task
    reused: int  # signatures that already had an entry under the toolchain


SignatureState = Literal["ready", "queued", "running", "failed", "missing", "unwarmable"]
JobState = Literal["ready", "failed", "running", "queued", "incomplete"]


class SignatureStatus(_Record):
    """One signature of a job: ready (has an entry), or the state of its task."""

    key: str
    signature: dict[str, Any]  # the signature's document: phase, shapes, graph settings
    state: SignatureState  # unwarmable: reported by a run, and the job's spec cannot produce it (no task)
    source: str  # "plan", or "coverage" when a training run reported it missed
    compile_seconds: float | None
    task_id: int | None
    attempts: int
    error: str | None  # the task's last error; for an unwarmable signature, why the spec cannot warm it
    lease_owner: str | None  # the worker running it (or that last ran it)
    lease_expires_at: datetime | None
    stalled: bool  # running, but its worker stopped heartbeating; the next claim takes it over
    run_after: datetime | None
    heartbeat_at: datetime | None
    finished_at: datetime | None


def job_state(counts: dict[str, int]) -> JobState:
    """A job's state from its planned signatures' states: any final failure fails the job. The signatures
    training runs reported are evidence, not the job: they never change its state (`JobSummary.reported`)."""
    if counts.get("failed"):
        return "failed"
    if sum(counts.values()) == counts.get("ready", 0):
        return "ready"
    if counts.get("running"):
        return "running"
    if counts.get("queued"):
        return "queued"
    return "incomplete"  # entries went away (retention); submitting the spec again re-queues them


class JobSummary(_Record):
    id: uuid.UUID
    spec_key: str
    toolchain_key: str
    created_at: datetime
    state: JobState
    counts: dict[str, int]  # signature state -> number of planned signatures
    # signature state -> number of the signatures training runs reported missed that the plan does not list
    reported: dict[str, int] = Field(default_factory=dict)


class JobStatus(JobSummary):
    warnings: list[str]
    signatures: list[SignatureStatus]

    def manifest_keys(self) -> list[str]:
        """What a pod installs: every planned signature (the manifest is complete once all are ready), and
        the reported ones that are ready (a reported one still warming, or unwarmable, never holds a pod up)."""
        return [s.key for s in self.signatures if s.source == "plan" or s.state == "ready"]

    def reported_pending(self) -> bool:
        """A reported signature is still queued or running: the manifest will grow when it is ready."""
        return any(s.source != "plan" and s.state in ("queued", "running") for s in self.signatures)


class TaskLog(_Record):
    task_id: int
    state: str
    attempts: int
    error: str | None
    log_tail: str | None


class EntryRecord(_Record):
    signature_key: str
    toolchain_key: str
    compile_seconds: float | None
    created_at: datetime
    files: list[FileRef]


class CoverageResult(_Record):
    report_id: int
    enqueued: list[str]  # missed signature keys that became new tasks
    unwarmable: dict[str, str] = Field(default_factory=dict)  # missed keys the spec cannot warm -> why


class CoverageReportRecord(_Record):
    id: int
    job_id: uuid.UUID
    met: list[str]
    missed: list[str]
    fresh_compiles: int
    details: dict[str, Any]
    created_at: datetime


class WorkerRecord(_Record):
    id: str
    toolchain_key: str
    pool: str | None
    host: str | None
    started_at: datetime
    last_seen: datetime
