"""Liveness and readiness."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from warmup.api.deps import ServicesDep
from warmup.api.errors import DATABASE_RETRY_AFTER_S

router = APIRouter(tags=["health"])


@router.get("/healthz", summary="The process is up (whether or not the database answers)")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz", summary="The database and the blob store answer")
def readyz(services: ServicesDep) -> JSONResponse:
    problems = [p for p in (services.database_ready(), services.store_ready()) if p]
    if problems:
        return JSONResponse(
            {"status": "unavailable", "problems": problems},
            status_code=503,
            headers={"Retry-After": str(DATABASE_RETRY_AFTER_S)},
        )
    return JSONResponse({"status": "ready"})
