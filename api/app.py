"""The FastAPI application: `create_app(settings)` builds everything; nothing happens at import time."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from api.errors import BodySizeLimit, install_error_handlers
from api.routes import blobs, coverage, health, manifests, plans, warmups
from api.services import Services
from api.settings import Settings
from warmup import __version__


def create_app(settings: Settings | None = None, *, services: Services | None = None) -> FastAPI:
    """The service. `services` lets a caller that already started them (tests, `warmup serve`) share them."""
    settings = settings or (services.settings if services else Settings())

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        owned = services is None
        app.state.services = services or Services.start(settings)
        try:
            yield
        finally:
            if owned:
                app.state.services.close()

    app = FastAPI(
        title="trl-warmup",
        version=__version__,
        summary="Pre-warmed compile caches for TRL training jobs (Trainium / TorchNeuron and torch.compile).",
        lifespan=lifespan,
    )
    if services is not None:
        app.state.services = services
    install_error_handlers(app)
    for module in (health, plans, warmups, manifests, blobs, coverage):
        app.include_router(module.router)
    app.add_middleware(BodySizeLimit, limit=settings.max_body_bytes)
    return app
