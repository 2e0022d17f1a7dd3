"""POST /v1/manifests: what a pod installs for (spec, its toolchain), or why it cannot yet.

Pods ask for the same manifest over and over (every pod of every job start), so a complete
manifest is answered from memory: the request body's hash finds the (spec, toolchain) it named, and
that finds the serialized manifest, without parsing or planning the spec again.
"""

from __future__ import annotations

import hashlib
import json

from fastapi import APIRouter, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from warmup.api.deps import ReadAccess, ServicesDep
from warmup.api.schemas import ManifestRequest
from warmup.api.services import Services
from warmup.db.manifests import build_manifest
from warmup.db.records import Keyed
from warmup.errors import NotWarmedError, PartlyWarmedError, ToolchainMismatchError
from warmup.manifest import Manifest
from warmup.signature import Signature
from warmup.toolchain.model import Toolchain

router = APIRouter(prefix="/v1", tags=["manifests"])

_REQUEST_BODY = {
    "required": True,
    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ManifestRequest"}}},
}


@router.post(
    "/manifests",
    response_model=Manifest,
    dependencies=[ReadAccess],
    summary="The files a training pod installs",
    openapi_extra={"requestBody": _REQUEST_BODY},
    responses={
        404: {"description": "not_warmed: no entry of this spec under this toolchain"},
        409: {
            "description": "partly_warmed (lists the missing signatures) or toolchain_mismatch (names fields)"
        },
    },
)
async def get_manifest(request: Request, services: ServicesDep) -> Response:
    raw = await request.body()
    if services.damage.due():
        await run_in_threadpool(services.damage.check)
    body_key = hashlib.sha256(raw).digest()
    keys = services.manifest_requests.get(body_key)
    if keys is not None:
        cached = services.manifests.get(keys)
        if cached is not None:
            return Response(cached, media_type="application/json")
    try:
        body = ManifestRequest.model_validate_json(raw)
    except ValidationError as error:
        raise RequestValidationError(
            [{**e, "loc": ("body", *e["loc"])} for e in error.errors(include_url=False)]
        ) from None
    payload, computed_keys = await run_in_threadpool(_manifest, body, services)
    services.manifest_requests.put(body_key, computed_keys)
    return Response(payload, media_type="application/json")


def _manifest(body: ManifestRequest, services: Services) -> tuple[bytes, tuple[str, str]]:
    keys = (body.spec.key(), body.toolchain.key())
    # The pods of a job start together: on a miss, one request builds the manifest, the others wait.
    with services.manifests.computing(keys):
        cached = services.manifests.get(keys)
        if cached is not None:
            return cached, keys
        return _build(body, services, keys), keys


def _build(body: ManifestRequest, services: Services, keys: tuple[str, str]) -> bytes:
    damage_seen = services.damage.generation  # entries read before the store check removed some: not kept
    plan = services.plan(body.spec)
    labels = {s.key(): s.shape_label for s in plan.signatures}
    job_id = services.repository.find_job(*keys)
    status = services.repository.job_status(job_id) if job_id is not None else None
    if status is not None:  # the plan's signatures, and the misses training runs reported once warm
        signature_keys = status.manifest_keys()
        labels |= {s.key: Signature.model_validate(s.signature).shape_label for s in status.signatures}
    else:  # never submitted for this toolchain: entries from other specs may still cover it
        signature_keys = [s.key() for s in plan.signatures if s.compile != "eager"]
    manifest = build_manifest(
        services.repository,
        services.store,
        spec_key=keys[0],
        toolchain=Keyed.of(body.toolchain),
        signature_keys=signature_keys,
        plan_size=len(plan.signatures),
        presign_expiry_s=services.settings.presign_expiry_s,
    )
    if manifest.missing and not manifest.signatures:
        _raise_mismatch_or_not_warmed(services, body.toolchain, signature_keys)
    if manifest.missing and not body.allow_partial:
        raise PartlyWarmedError([labels.get(k, k[:12]) for k in manifest.missing])
    payload = json.dumps(manifest.model_dump(mode="json")).encode()
    if not manifest.missing and (status is None or not status.reported_pending()):
        # else it grows once a reported signature is warm
        services.damage.keep(damage_seen, lambda: services.manifests.put(keys, payload))
    return payload


def _raise_mismatch_or_not_warmed(services: Services, toolchain: Toolchain, keys: list[str]) -> None:
    # Our own toolchain is left out: a worker may commit its first entry between the manifest's build and
    # this query, and a "mismatch" with ourselves would be an error with no difference to name.
    others = services.repository.toolchains_with_entries(keys)
    others.pop(toolchain.key(), None)
    if others:
        closest = max(others, key=lambda key: others[key])
        found = services.repository.get_toolchain(closest)
        if found is not None:
            raise ToolchainMismatchError(toolchain.diff(Toolchain.model_validate(found.data)))
    raise NotWarmedError(
        "this spec has no warmed cache for this toolchain yet: submit it (`warmup submit SPEC`) "
        "and pull with --wait"
    )
