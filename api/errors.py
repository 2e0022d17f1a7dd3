"""Map the project's errors to HTTP answers: every error body is {"detail": {"error": code, "message": ...}}.

Clients (warmup.client.api_error) turn the code back into the same WarmupError.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DBAPIError
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from warmup.db.outage import is_unavailable, reason
from warmup.errors import (
    AuthError,
    BlobNotFoundError,
    JobNotFoundError,
    ModelConfigError,
    NotWarmedError,
    PartlyWarmedError,
    SpecError,
    StoreError,
    StoreUnreachableError,
    ToolchainMismatchError,
    UnsafeArtifactError,
    WarmupError,
)

log = logging.getLogger("warmup.api")

# What a client is told to wait while the database is unavailable: a restart takes a few seconds.
DATABASE_RETRY_AFTER_S = 5
# While it is, one warning per this many seconds, not one per request.
DATABASE_LOG_EVERY_S = 10.0


def error_body(code: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"detail": {"error": code, "message": message, **extra}}


def _answer(error: WarmupError) -> tuple[int, dict[str, Any]]:
    if isinstance(error, SpecError):
        problems = [{"loc": p.loc, "msg": p.msg} for p in error.problems]
        return 422, error_body("invalid_spec", str(error), problems=problems)
    if isinstance(error, ModelConfigError):
        return 422, error_body(
            "invalid_spec", str(error), problems=[{"loc": "spec.model", "msg": str(error)}]
        )
    if isinstance(error, JobNotFoundError):
        return 404, error_body("not_found", str(error))
    if isinstance(error, BlobNotFoundError):
        return 404, error_body("blob_not_found", str(error))
    if isinstance(error, NotWarmedError):
        return 404, error_body("not_warmed", str(error))
    if isinstance(error, PartlyWarmedError):
        return 409, error_body("partly_warmed", str(error), missing=error.missing)
    if isinstance(error, ToolchainMismatchError):
        differences = {k: [ours, theirs] for k, (ours, theirs) in error.differences.items()}
        return 409, error_body("toolchain_mismatch", str(error), differences=differences)
    if isinstance(error, AuthError):
        return error.status or 401, error_body(
            "unauthorized" if error.status != 403 else "forbidden", str(error)
        )
    if isinstance(error, UnsafeArtifactError):
        return 422, error_body("unsafe_artifact", str(error))
    if isinstance(error, StoreUnreachableError):
        return 503, error_body("store_unreachable", str(error))
    if isinstance(error, StoreError):
        return 502, error_body("store_error", str(error))
    return 400, error_body("bad_request", str(error))


async def warmup_error_handler(request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, WarmupError)
    status, body = _answer(error)
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse(body, status_code=status, headers=headers)


async def validation_error_handler(request: Request, error: Exception) -> JSONResponse:
    """FastAPI's own request validation, in the same shape as a SpecError: field path and reason."""
    assert isinstance(error, RequestValidationError)
    problems = []
    for item in error.errors():
        loc = ".".join(str(part) for part in item["loc"] if part != "body") or "body"
        problems.append({"loc": loc, "msg": str(item["msg"]).removeprefix("Value error, ")})
    message = "invalid request: " + "; ".join(f"{p['loc']}: {p['msg']}" for p in problems)
    return JSONResponse(error_body("invalid_spec", message, problems=problems), status_code=422)


async def database_error_handler(request: Request, error: Exception) -> JSONResponse:
    """The database is restarting or unreachable: 503 with Retry-After, so clients retry (a bug in a
    statement, say an integrity error, stays a 500)."""
    if not is_unavailable(error):
        raise error
    # The driver's message can name hosts and users: it goes to the log, not to the client.
    state, now = request.app.state, time.monotonic()
    if now - getattr(state, "database_unavailable_logged_at", -DATABASE_LOG_EVERY_S) >= DATABASE_LOG_EVERY_S:
        state.database_unavailable_logged_at = now
        log.warning("database unavailable (%s): answering 503 until it is back", reason(error))
    body = error_body(
        "database_unavailable",
        f"the database is unavailable (restarting or unreachable); retry in {DATABASE_RETRY_AFTER_S}s",
    )
    return JSONResponse(body, status_code=503, headers={"Retry-After": str(DATABASE_RETRY_AFTER_S)})


async def http_error_handler(request: Request, error: Exception) -> JSONResponse:
    """Starlette's own errors (no such route, wrong method, a body that is not JSON) in the same shape."""
    assert isinstance(error, HTTPException)
    message = str(error.detail)
    if error.__cause__ is not None:  # FastAPI's "error parsing the body" hides why: say it
        message += f": {type(error.__cause__).__name__}: {str(error.__cause__)[:200]}"
    code = "not_found" if error.status_code == 404 else "bad_request"
    return JSONResponse(error_body(code, message), status_code=error.status_code, headers=error.headers)


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(WarmupError, warmup_error_handler)
    app.add_exception_handler(DBAPIError, database_error_handler)
    app.add_exception_handler(RequestValidationError, validation_error_handler)
    app.add_exception_handler(HTTPException, http_error_handler)


class BodySizeLimit:
    """Answer 413 to request bodies over `limit` bytes, whether or not they declare Content-Length."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await self._too_large(send)
            return
        seen = 0

        async def limited_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise _BodyTooLarge
            return message

        try:
            await self.app(scope, limited_receive, send)
        except _BodyTooLarge:
            await self._too_large(send)

    async def _too_large(self, send: Send) -> None:
        response = JSONResponse(
            error_body("body_too_large", f"request body larger than {self.limit} bytes"), status_code=413
        )
        await response({"type": "http"}, _empty_receive, send)


class _BodyTooLarge(Exception):
    pass


async def _empty_receive() -> Message:
    return {"type": "http.disconnect"}
