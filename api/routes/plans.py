"""POST /v1/plans: plan a spec, no side effects."""

from __future__ import annotations

from fastapi import APIRouter

from warmup.api.deps import ReadAccess, ServicesDep
from warmup.api.schemas import PlannedSignature, PlanRequest, PlanResponse
from warmup.planner.planning import estimate_seconds

router = APIRouter(prefix="/v1", tags=["plans"])


@router.post(
    "/plans", response_model=PlanResponse, dependencies=[ReadAccess], summary="List a job's signatures"
)
def create_plan(body: PlanRequest, services: ServicesDep) -> PlanResponse:
    plan = services.plan(body.spec)
    return PlanResponse(
        spec_key=body.spec.key(),
        signatures=[PlannedSignature(**s.model_dump(), signature_key=s.key()) for s in plan.signatures],
        warnings=plan.warnings,
        notes=plan.notes,
        estimate_seconds={
            backend: sum(estimate_seconds(s, backend) for s in plan.signatures)
            for backend in ("neuron", "inductor")
        },
    )
