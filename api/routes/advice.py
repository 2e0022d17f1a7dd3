"""POST /v1/advice: which padding makes a job fastest on its dataset, no side effects."""

from __future__ import annotations

from collections.abc import Callable

from fastapi import APIRouter

from api.deps import ReadAccess, ServicesDep
from api.schemas import AdviceRequest
from warmup.advise import Advice, advise, lengths_from_histogram
from warmup.planner.estimate import CompileCosts, typical_seconds
from warmup.signature import Signature
from warmup.toolchain import Toolchain

router = APIRouter(prefix="/v1", tags=["advice"])


@router.post(
    "/advice",
    response_model=Advice,
    dependencies=[ReadAccess],
    summary="Compare padding settings of a job: compiles against padding waste, whole-job time",
)
def create_advice(body: AdviceRequest, services: ServicesDep) -> Advice:
    spec = body.spec
    if body.dataset is not None:
        lengths = body.dataset.lengths("the request's dataset")
    else:
        lengths = lengths_from_histogram(spec.trainer, spec.data.length_histogram)
    toolchain = body.toolchain
    if body.pool is not None:
        toolchain = services.pool_toolchain(body.pool, spec.target.world_size)
    return advise(
        spec,
        lengths,
        multiples=body.multiples,
        max_truncated=body.max_truncated,
        completion_tokens=body.completion_tokens,
        step_seconds=body.step_seconds,
        compile_costs=_recorded(services, toolchain, spec.target.backend) if toolchain else None,
    )


def _recorded(
    services: ServicesDep, toolchain: Toolchain, backend: str
) -> Callable[[list[Signature]], CompileCosts]:
    """Compile seconds the service recorded under the toolchain, for the signatures the options plan."""

    def costs(signatures: list[Signature]) -> CompileCosts:
        key = toolchain.key()
        keys = list(dict.fromkeys(s.key() for s in signatures))
        models = {s.model for s in signatures}
        samples = [sample for sample in services.repository.compile_samples(key) if sample[0] in models]
        return CompileCosts(backend, services.repository.compile_seconds(keys, key), typical_seconds(samples))

    return costs
