"""GET /v1/blobs/{sha256}: blob bytes, for stores that do not presign URLs (the local directory)."""

from __future__ import annotations

from fastapi import APIRouter, Path
from fastapi.responses import StreamingResponse

from api.deps import ReadAccess, ServicesDep
from warmup.manifest import SHA256_PATTERN

router = APIRouter(prefix="/v1", tags=["blobs"])
CHUNK = 1 << 20


@router.get("/blobs/{sha256}", dependencies=[ReadAccess], summary="A blob's bytes")
def get_blob(services: ServicesDep, sha256: str = Path(pattern=SHA256_PATTERN)) -> StreamingResponse:
    handle = services.store.open(sha256)  # BlobNotFoundError -> 404

    def chunks():
        with handle:
            while chunk := handle.read(CHUNK):
                yield chunk

    return StreamingResponse(chunks(), media_type="application/octet-stream")
