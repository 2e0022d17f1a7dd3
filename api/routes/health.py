"""Liveness and readiness."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from warmup.api.deps import ServicesDep
from warmup.api.errors import DATABASE_RETRY_AFTER_S

router = APIRouter(tags=["health"])


@router.get("/healthz", summary="The process is up (whether or not the database answers)")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get(
    "/readyz", summary="Started, and the database and the blob store answer; damage the store check found"
)
def readyz(request: Request, services: ServicesDep) -> JSONResponse:
    starting = services.starting
    problems = [f"starting: {starting}"] if starting else []
    problems += [p for p in (services.database_ready(), services.store_ready()) if p]
    if problems:
        return JSONResponse(
            {"status": "starting" if starting else "unavailable", "problems": problems},
            status_code=503,
            headers={"Retry-After": str(DATABASE_RETRY_AFTER_S)},
        )
    damaged, _found = request.app.state.stats.damaged_blobs()
    if damaged:
        # Still 200: the service serves every intact cache, and a probe that failed would take it out of
        # rotation for all of them. The body says so (docs/how-to/repair-store.md).
        return JSONResponse(
            {
                "status": "degraded",
                "problems": [
                    f"store: {damaged} blobs found damaged by `warmup store check`; the jobs that listed "
                    "them are not ready until submitted again"
                ],
            }
        )
    return JSONResponse({"status": "ready"})
