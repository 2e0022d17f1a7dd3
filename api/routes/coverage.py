"""POST /v1/coverage: a training run reports what it met and what still compiled.

A report is evidence, not a command: the signatures it missed join the spec's job as reported ones, never
as planned ones, so they never change the job's state nor hold up a pod whose planned signatures are warm.
Each the spec's own trainer can produce becomes a task (the next pull installs it); one it cannot (a batch
larger than any the spec's trainer makes: the run's arguments were not the spec's) is recorded with its
reason, once, and gets no task.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from warmup.api.deps import ReadAccess, ServicesDep
from warmup.api.schemas import CoverageRequest, CoverageResponse
from warmup.db.records import Keyed
from warmup.errors import SpecError
from warmup.signature import Plan, Signature

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
    unwarmable = {
        s.key(): why for s in body.missed if (why := unwarmable_reason(plan, s, body.details)) is not None
    }
    result = services.queue.record_coverage(
        job_id,
        met=body.met,
        missed=[Keyed.of(s) for s in body.missed],
        fresh_compiles=body.fresh_compiles,
        details=body.details,
        unwarmable=unwarmable,
    )
    if result.enqueued:  # the job grew: a cached complete manifest no longer is
        services.manifests.pop((spec_key, toolchain.key))
    return CoverageResponse(
        job_id=job_id, report_id=result.report_id, enqueued=result.enqueued, unwarmable=result.unwarmable
    )


def unwarmable_reason(plan: Plan, missed: Signature, details: dict[str, Any]) -> str | None:
    """Why the spec's trainer cannot produce `missed`, or None where a rehearsal of the spec may. The plan
    lists the full batches of each phase (a last, partial batch is smaller): a larger one needs other
    arguments than the spec's, and warming it from the spec would fail at every attempt."""
    batches = [s.batch for s in plan.signatures if s.phase == missed.phase]
    if not batches or missed.batch <= max(batches):
        return None
    given = details.get("args")  # the callback's: {name: {"spec": ..., "run": ...}}
    args: dict[str, Any] = given if isinstance(given, dict) else {}
    named = [
        f"{name} {values.get('run')!r} (the spec: {values.get('spec')!r})"
        for name, values in sorted(args.items())
        if isinstance(values, dict)
    ]
    ran = f"; the run's arguments differ from the spec's: {', '.join(named)}" if named else ""
    return (
        f"the spec's trainer makes {missed.phase} batches of at most {max(batches)} rows, this one has "
        f"{missed.batch}{ran}: run with the spec's arguments, or submit a spec of the run's to warm them"
    )
