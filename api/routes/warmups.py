"""Warm-up jobs: submit a spec for a toolchain (or a worker pool), follow its progress."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Response

from warmup.api.deps import JobAccess, ReadAccess, ServicesDep, SubmitAccess
from warmup.api.schemas import DATABASE_INT_MAX, WarmupRequest
from warmup.db.records import CoverageReportRecord, JobStatus, JobSummary, Keyed, TaskLog
from warmup.db.repository import MIN_ID_PREFIX
from warmup.errors import JobNotFoundError, RehearsalError, SpecError
from warmup.rehearsal.units import require_rehearsable

router = APIRouter(prefix="/v1", tags=["warmups"])
# A job's id, or a prefix of its hex digits that only one job has (the status page shows the first 8).
JobIdPath = Annotated[str, Path(min_length=MIN_ID_PREFIX, max_length=36, pattern=r"^[0-9a-fA-F-]+$")]


@router.post(
    "/warmups",
    response_model=JobStatus,
    status_code=201,
    dependencies=[SubmitAccess],
    summary="Warm every signature of a spec under a toolchain",
    responses={200: {"description": "The same spec under the same toolchain already had this job"}},
)
def submit_warmup(body: WarmupRequest, services: ServicesDep, response: Response) -> JobStatus:
    toolchain = body.toolchain or services.pool_toolchain(body.pool or "", body.spec.target.world_size)
    target = body.spec.target
    if (toolchain.backend, toolchain.device) != (target.backend, target.device):
        raise SpecError(
            f"the toolchain is {toolchain.backend}/{toolchain.device} but the spec targets "
            f"{target.backend}/{target.device}",
            loc="toolchain" if body.toolchain else "pool",
        )
    plan = services.plan(body.spec)
    # Passes the backend does not compile (compile="eager") have nothing to warm.
    warmable = [Keyed.of(s) for s in plan.signatures if s.compile != "eager"]
    if warmable:
        try:
            require_rehearsable(body.spec.trainer)
        except RehearsalError as error:
            raise SpecError(str(error), loc="spec.trainer") from None
    result = services.queue.submit_job(
        Keyed.of(body.spec),
        Keyed.of(toolchain),
        warmable,
        warnings=plan.warnings,
        retry_failed=body.retry_failed,
    )
    if not result.created:
        response.status_code = 200
    status = services.repository.job_status(result.job_id)
    assert status is not None
    return status


@router.get(
    "/warmups/{job_id}",
    response_model=JobStatus,
    dependencies=[JobAccess],
    summary="One job's progress (a read or a submit token: CI follows the job it submitted)",
)
def get_warmup(job_id: JobIdPath, services: ServicesDep) -> JobStatus:
    found = services.repository.resolve_job_id(job_id)
    status = services.repository.job_status(found)
    if status is None:
        raise JobNotFoundError(job_id)
    return status


@router.get(
    "/warmups", response_model=list[JobSummary], dependencies=[ReadAccess], summary="Jobs, newest first"
)
def list_warmups(
    services: ServicesDep,
    limit: int = Query(50, ge=1, le=500),
    offset: int = Query(0, ge=0, le=DATABASE_INT_MAX),
    spec_key: str | None = Query(None, pattern=r"^[0-9a-f]{64}$"),
    toolchain_key: str | None = Query(None, pattern=r"^[0-9a-f]{64}$"),
) -> list[JobSummary]:
    return services.repository.list_jobs(
        limit=limit, offset=offset, spec_key=spec_key, toolchain_key=toolchain_key
    )


@router.get(
    "/warmups/{job_id}/coverage",
    response_model=list[CoverageReportRecord],
    dependencies=[ReadAccess],
    summary="Coverage reports of training runs",
)
def job_coverage(job_id: JobIdPath, services: ServicesDep) -> list[CoverageReportRecord]:
    found = services.repository.resolve_job_id(job_id)
    if services.repository.job_status(found) is None:
        raise JobNotFoundError(job_id)
    return services.repository.coverage_reports(found)


@router.get(
    "/tasks/{task_id}/log",
    response_model=TaskLog,
    dependencies=[ReadAccess],
    summary="A task's error and log",
)
def task_log(services: ServicesDep, task_id: int = Path(ge=1, le=DATABASE_INT_MAX)) -> TaskLog:
    log = services.repository.task_log(task_id)
    if log is None:
        raise JobNotFoundError(f"no task {task_id}")
    return log
