"""POST /v1/manifests: what a pod installs for (spec, its toolchain), or why it cannot yet."""

from __future__ import annotations

import json

from fastapi import APIRouter
from fastapi.responses import Response

from api.deps import ReadAccess, ServicesDep
from api.schemas import ManifestRequest
from warmup.db.manifests import build_manifest
from warmup.db.records import Keyed
from warmup.errors import NotWarmedError, PartlyWarmedError, ToolchainMismatchError
from warmup.manifest import Manifest
from warmup.signature import Signature
from warmup.toolchain import Toolchain

router = APIRouter(prefix="/v1", tags=["manifests"])


@router.post(
    "/manifests",
    response_model=Manifest,
    dependencies=[ReadAccess],
    summary="The files a training pod installs",
    responses={
        404: {"description": "not_warmed: no entry of this spec under this toolchain"},
        409: {
            "description": "partly_warmed (lists the missing signatures) or toolchain_mismatch (names fields)"
        },
    },
)
def get_manifest(body: ManifestRequest, services: ServicesDep) -> Response:
    spec_key, toolchain_key = body.spec.key(), body.toolchain.key()
    cached = services.manifests.get((spec_key, toolchain_key))
    if cached is not None:
        return Response(cached, media_type="application/json")

    plan = services.plan(body.spec)
    labels = {s.key(): s.shape_label for s in plan.signatures}
    job_id = services.repository.find_job(spec_key, toolchain_key)
    if job_id is not None:  # the job's signatures include the misses training runs reported
        status = services.repository.job_status(job_id)
        keys = [s.key for s in status.signatures] if status else []
        labels |= (
            {s.key: Signature.model_validate(s.signature).shape_label for s in status.signatures}
            if status
            else {}
        )
    else:  # never submitted for this toolchain: entries from other specs may still cover it
        keys = [s.key() for s in plan.signatures if s.compile != "eager"]
    manifest = build_manifest(
        services.repository,
        services.store,
        spec_key=spec_key,
        toolchain=Keyed.of(body.toolchain),
        signature_keys=keys,
        plan_size=len(plan.signatures),
        presign_expiry_s=services.settings.presign_expiry_s,
    )
    if manifest.missing and not manifest.signatures:
        _raise_mismatch_or_not_warmed(services, body.toolchain, keys)
    if manifest.missing and not body.allow_partial:
        raise PartlyWarmedError([labels.get(k, k[:12]) for k in manifest.missing])
    payload = json.dumps(manifest.model_dump(mode="json")).encode()
    if not manifest.missing:
        services.manifests.put((spec_key, toolchain_key), payload)
    return Response(payload, media_type="application/json")


def _raise_mismatch_or_not_warmed(services: ServicesDep, toolchain: Toolchain, keys: list[str]) -> None:
    others = services.repository.toolchains_with_entries(keys)
    if others:
        closest = max(others, key=lambda key: others[key])
        found = services.repository.get_toolchain(closest)
        if found is not None:
            raise ToolchainMismatchError(toolchain.diff(Toolchain.model_validate(found.data)))
    raise NotWarmedError(
        "this spec has no warmed cache for this toolchain yet: submit it (`warmup submit SPEC`) "
        "and pull with --wait"
    )
