"""Typed dependencies: the app's services, and bearer-token auth by scope."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from starlette.concurrency import run_in_threadpool

from api.services import Services
from warmup.db.tokens import grants
from warmup.errors import AuthError


async def get_services(request: Request) -> Services:
    return request.app.state.services


ServicesDep = Annotated[Services, Depends(get_services)]


def require(scope: str):
    """A dependency that lets the request through when auth is off or its token grants `scope`."""

    # async, so that a request with a cached token never waits for a threadpool slot
    async def check(request: Request, services: ServicesDep) -> None:
        if not services.settings.auth_required:
            return
        header = request.headers.get("authorization", "")
        kind, _, token = header.partition(" ")
        if kind.lower() != "bearer" or not token:
            raise AuthError(
                "missing bearer token: pass 'Authorization: Bearer <token>' (WARMUP_TOKEN)", status=401
            )
        token = token.strip()
        scopes = services.verified_tokens.get(token)
        if scopes is None:
            scopes = await run_in_threadpool(services.token_scopes, token)
        if scopes is None:
            raise AuthError("unknown or revoked token", status=401)
        if not grants(scopes, scope):
            raise AuthError(
                f"this token lacks the {scope!r} scope (it has: {', '.join(sorted(scopes))})", status=403
            )

    return Depends(check)


ReadAccess = require("read")
SubmitAccess = require("submit")
AdminAccess = require("admin")
