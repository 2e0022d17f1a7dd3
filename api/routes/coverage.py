"""POST /v1/coverage: a training run reports what it met and what still compiled; misses become tasks."""

from __future__ import annotations

from fastapi import APIRouter

from warmup.api.deps import ReadAccess, ServicesDep
from warmup.api.schemas import CoverageRequest, CoverageResponse
from warmup.db.records import Keyed
from warmup.errors import SpecError

router = APIRouter(prefix="/v1", tags=["coverage"])


@router.post(
    "/coverage", response_model=CoverageResponse, dependencies=[ReadAccess], summary="Report coverage"
)
def report_coverage(body: CoverageRequest, services: ServicesDep) -> CoverageResponse:
    plan = services.plan(body.spec)
    models = {s.model for s in plan.signatures}
    for index, missed in enumerate(body.missed):
        # A report may only add signatures of this spec's own models and trainer.
        if missed.trainer != body.spec.trainer or missed.model not in models:
            raise SpecError("not a signature of this spec's trainer and models", loc=f"missed.{index}")
    spec_key, toolchain = body.spec.key(), Keyed.of(body.toolchain)
    job_id = services.repository.find_job(spec_key, toolchain.key)
    if job_id is None:  # the pod pulled entries warmed for other specs: give its spec a job now
        warmable = [Keyed.of(s) for s in plan.signatures if s.compile != "eager"]
        job_id = services.queue.submit_job(
            Keyed.of(body.spec), toolchain, warmable, warnings=plan.warnings
        ).job_id
    result = services.queue.record_coverage(
        job_id,
        met=body.met,
        missed=[Keyed.of(s) for s in body.missed],
        fresh_compiles=body.fresh_compiles,
        details=body.details,
    )
    if result.enqueued:  # the job grew: a cached complete manifest no longer is
        services.manifests.pop((spec_key, toolchain.key))
    return CoverageResponse(job_id=job_id, report_id=result.report_id, enqueued=result.enqueued)
