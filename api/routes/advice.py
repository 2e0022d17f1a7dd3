"""POST /v1/advice: which padding makes a job fastest on its dataset, no side effects."""

from __future__ import annotations

from fastapi import APIRouter

from warmup.advise.advice import Advice, advise
from warmup.api.deps import ReadAccess, ServicesDep
from warmup.api.schemas import AdviceRequest
from warmup.api.services import refuse_service_relative_paths

router = APIRouter(prefix="/v1", tags=["advice"])


@router.post(
    "/advice",
    response_model=Advice,
    dependencies=[ReadAccess],
    summary="Compare padding settings of a job: compiles against padding waste, whole-job time",
)
def create_advice(body: AdviceRequest, services: ServicesDep) -> Advice:
    spec = body.spec
    refuse_service_relative_paths(spec)
    lengths = body.dataset.lengths("the request's dataset") if body.dataset is not None else None
    toolchain = body.toolchain
    if body.pool is not None:
        toolchain = services.pool_toolchain(body.pool, spec.target.world_size)
    step_seconds, measured_by = body.step_seconds, ""
    if step_seconds is None and toolchain is not None:  # the job's own training runs, where they reported
        step_seconds, measured_by = services.recorded_step_seconds(spec, toolchain.key())
    return advise(
        spec,
        lengths,
        multiples=body.multiples,
        max_truncated=body.max_truncated,
        completion_tokens=body.completion_tokens,
        step_seconds=step_seconds,
        step_seconds_from=measured_by,
        compile_costs=services.recorded_compile_costs(toolchain.key(), spec.target.backend)
        if toolchain
        else None,
    )
