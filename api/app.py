"""The FastAPI application: `create_app(settings)` builds everything; nothing happens at import time."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi_offline import FastAPIOffline
from pydantic import BaseModel

from warmup import __version__
from warmup.api.errors import BodySizeLimit, install_error_handlers
from warmup.api.routes import advice, blobs, coverage, health, manifests, metrics, plans, status, warmups
from warmup.api.routes.metrics import Metrics, PullCounter
from warmup.api.schemas import ManifestRequest
from warmup.api.services import Services
from warmup.api.stats import Stats
from warmup.settings import Settings


def create_app(settings: Settings | None = None, *, services: Services | None = None) -> FastAPI:
    """The service. `services` lets a caller that already started them (tests, `warmup serve`) share them."""
    settings = settings or (services.settings if services else Settings())

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        owned = services is None
        if owned:
            _attach(app, Services.start(settings))
        try:
            yield
        finally:
            if owned:
                app.state.services.close()

    # /docs and /redoc with their scripts and styles served from the fastapi-offline package, not a CDN: the
    # pages work where the service has no network, as it often has not.
    app = FastAPIOffline(
        title="trl-warmup",
        version=__version__,
        summary="Pre-warmed compile caches for TRL training jobs (Trainium / TorchNeuron and torch.compile).",
        lifespan=lifespan,
    )
    if services is not None:
        _attach(app, services)
    app.state.metrics = Metrics(lambda: app.state.stats)
    install_error_handlers(app)
    for module in (health, plans, advice, warmups, manifests, blobs, coverage, metrics, status):
        app.include_router(module.router)
    app.add_middleware(BodySizeLimit, limit=settings.max_body_bytes)
    app.add_middleware(PullCounter, metrics=app.state.metrics)
    _document_raw_bodies(app, [ManifestRequest])
    return app


def _attach(app: FastAPI, services: Services) -> None:
    app.state.services = services
    app.state.stats = Stats(services.engine)


def _document_raw_bodies(app: FastAPI, models: list[type[BaseModel]]) -> None:
    """Routes that read their body themselves (the manifest fast path) still document its schema."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = build()
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            for model in models:
                document = model.model_json_schema(ref_template="#/components/schemas/{model}")
                components.update(document.pop("$defs", {}))
                components[model.__name__] = document
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
