"""The one exception hierarchy of trl-warmup.

Every error a user can cause is a `WarmupError` whose message says what was wrong and what to do.
The CLI prints it as one line (no traceback); the API maps it to a 4xx answer.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class FieldProblem:
    """One invalid field: where it is in the spec (dotted path) and why it is wrong."""

    loc: str
    msg: str

    def __str__(self) -> str:
        return f"{self.loc}: {self.msg}" if self.loc else self.msg


class WarmupError(Exception):
    """Base of every error trl-warmup raises on purpose."""

    exit_code = 1


# --- specs and plans ---------------------------------------------------------------------------


class SpecError(WarmupError):
    """The spec is invalid. Carries every problem found, each with its field path."""

    exit_code = 2

    def __init__(self, problems: list[FieldProblem] | str, *, loc: str = "") -> None:
        if isinstance(problems, str):
            problems = [FieldProblem(loc, problems)]
        self.problems = problems
        super().__init__("invalid spec: " + "; ".join(str(p) for p in problems))

    def __reduce__(self) -> tuple[type[SpecError], tuple[list[FieldProblem]]]:
        # Rebuilt from its problems when it crosses a process boundary (a worker raised it), not from its message.
        return (self.__class__, (self.problems,))


class UnknownTrainerError(SpecError):
    """The spec names a trainer trl-warmup does not know."""


class PlanTooLargeError(SpecError):
    """The spec plans more signatures than the service accepts."""


class EmptyPlanError(SpecError):
    """The job compiles, but the spec lacks what its shapes are computed from: a plan of no signatures
    would warm nothing and report success. Names the missing fact."""


class UnsupportedLaunchError(SpecError):
    """The job's launch (FSDP, DeepSpeed ZeRO) cannot be warmed faithfully on its target: names the reason and the
    nearest mode that works."""


class DatasetError(SpecError):
    """The dataset whose facts were asked for cannot be read as the trainer reads it."""


class ModelConfigError(WarmupError):
    """The model's config.json (or tokenizer) cannot be read."""

    exit_code = 2


class MissingDependencyError(WarmupError):
    """An optional package this operation needs is not installed."""


# --- environments ------------------------------------------------------------------------------


class ToolchainMismatchError(WarmupError):
    """Two toolchains differ where a cache hit needs them equal; names each differing field."""

    def __init__(
        self,
        differences: dict[str, tuple[object, object]],
        *,
        what: str = "toolchain",
        remedy: str = "warm the cache from a worker with this environment, "
        "or run training in the environment the cache was built for",
    ) -> None:
        self.differences = differences
        detail = ", ".join(f"{k}: {a!r} here vs {b!r} in the cache" for k, a, b in _triples(differences))
        super().__init__(f"{what} mismatch ({detail}); {remedy}")


def _triples(differences: dict[str, tuple[object, object]]) -> Iterator[tuple[str, object, object]]:
    for key, (ours, theirs) in sorted(differences.items()):
        yield key, ours, theirs


class BackendUnavailableError(WarmupError):
    """The compile backend the spec targets cannot run on this machine."""


class IncompatibleLibraryError(BackendUnavailableError):
    """A private name of torch, TRL, accelerate or transformers that trl-warmup reaches (warmup/_compat/) is
    gone or changed at the installed version: the feature that needs it cannot run here."""


# --- warming -----------------------------------------------------------------------------------


class RehearsalError(WarmupError):
    """A signature's rehearsal failed (crash, time limit, or compiled the wrong thing)."""

    exit_code = 3

    def __init__(self, message: str, *, log: str = "") -> None:
        self.log = log
        super().__init__(message)


# --- storage -----------------------------------------------------------------------------------


class StoreError(WarmupError):
    """The blob store refused or failed an operation."""


class StoreUnreachableError(StoreError):
    """The blob store cannot be reached, the bucket is missing or the credentials are refused."""


class BlobIntegrityError(StoreError):
    """A blob's content does not match its sha256 or size."""


class BlobNotFoundError(StoreError):
    """The blob store has no blob (or document) under this key."""


class StoreDamagedError(StoreError):
    """`warmup store check` found blobs missing or altered in the store (docs/how-to/repair-store.md)."""

    exit_code = 3


# --- the database ------------------------------------------------------------------------------


class DatabaseError(WarmupError):
    """The database cannot be reached or migrated."""


class JobNotFoundError(WarmupError):
    """No warm-up job has this id."""

    def __init__(self, job_id: object) -> None:
        self.job_id = job_id
        super().__init__(f"no warm-up job with id {job_id}; submit the spec to create one")


class AmbiguousIdError(WarmupError):
    """A job id that is not one, or a prefix of several jobs' ids (HTTP 400): give more of its digits."""

    exit_code = 2


class LeaseLostError(WarmupError):
    """A worker acted on a task it no longer holds: another worker claimed it after the lease ran out,
    or it was released or finished. The worker must drop the task and publish nothing."""

    def __init__(self, task_id: int, worker_id: str) -> None:
        self.task_id = task_id
        self.worker_id = worker_id
        super().__init__(
            f"worker {worker_id!r} no longer holds the lease on task {task_id} (it expired and the task was "
            "claimed again, or the task was released or finished); drop this attempt and claim another task"
        )


class UnsafeArtifactError(WarmupError):
    """An artifact path would land outside the destination (absolute, `..`, symlink)."""


# --- the service and its clients ---------------------------------------------------------------


class ServerError(WarmupError):
    """The service answered with an error."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        self.status = status
        super().__init__(message)


class ServerUnreachableError(ServerError):
    """The service cannot be reached."""


class NotWarmedError(WarmupError):
    """No cache exists yet for this spec and toolchain."""

    exit_code = 3


class PartlyWarmedError(WarmupError):
    """Some signatures of the spec have no entry yet."""

    exit_code = 3

    def __init__(self, missing: list[str], message: str | None = None) -> None:
        self.missing = missing
        super().__init__(
            message
            or f"{len(missing)} signature(s) not warmed yet: {', '.join(missing[:10])}"
            + (" ..." if len(missing) > 10 else "")
            + "; wait for the warm-up (--wait) or install what exists (--allow-partial)"
        )


class BackgroundPullError(WarmupError):
    """The download `warmup exec` ran beside the training command's start failed: the training process
    stops before its first compile, as `warmup exec` stopped before starting it when the pull was first."""

    exit_code = 3


class UnwarmedCompileError(WarmupError):
    """Strict mode (`warmup exec --strict`, `WarmupCallback(strict=True)`): training met a graph the
    cache does not hold, and stops rather than compile it."""

    exit_code = 3


class WarmupFailedError(WarmupError):
    """The warm-up job of this spec gave up on some signatures: waiting longer will not make them warm."""

    exit_code = 3


class AuthError(ServerError):
    """Missing, unknown or insufficient bearer token."""
