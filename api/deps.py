"""Typed dependencies: the app's services, and bearer-token auth by scope."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, Request
from starlette.concurrency import run_in_threadpool

from warmup.api.services import Services
from warmup.db.tokens import grants
from warmup.errors import AuthError


async def get_services(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


ServicesDep = Annotated[Services, Depends(get_services)]


def authorize(services: Services, token: str | None, scope: str, *others: str) -> None:
    """Raise AuthError unless auth is off or `token` is live and grants `scope` (or one of `others`)."""
    if not services.settings.auth_required:
        return
    if not token:
        raise AuthError(
            "missing bearer token: pass 'Authorization: Bearer <token>' (WARMUP_TOKEN)", status=401
        )
    scopes = services.token_scopes(token)
    if scopes is None:
        raise AuthError("unknown or revoked token", status=401)
    if not any(grants(scopes, needed) for needed in (scope, *others)):
        wanted = " or ".join(repr(needed) for needed in (scope, *others))
        raise AuthError(
            f"this token lacks the {wanted} scope (it has: {', '.join(sorted(scopes))})", status=403
        )


def bearer_token(request: Request) -> str | None:
    kind, _, token = request.headers.get("authorization", "").partition(" ")
    return token.strip() or None if kind.lower() == "bearer" else None


def require(scope: str, *others: str) -> Any:
    """A dependency that lets the request through when auth is off or its token grants `scope` (or one
    of `others`)."""

    # async, so that a request whose token is cached never waits for a threadpool slot
    async def check(request: Request, services: ServicesDep) -> None:
        token = bearer_token(request)
        if (
            services.settings.auth_required
            and token
            and (services.verified_tokens.get(token) is None or services.revocations.due())
        ):
            await run_in_threadpool(services.token_scopes, token)  # a database read: off the event loop
        authorize(services, token, scope, *others)

    return Depends(check)


ReadAccess = require("read")
SubmitAccess = require("submit")
AdminAccess = require("admin")
# One job's progress by its id: what `warmup submit --wait` polls. A submit token reads the job its
# submission answered with (the same spec is the same job, so submitting it again would show as much);
# listing jobs, coverage reports and task logs stay `read`.
JobAccess = require("read", "submit")
