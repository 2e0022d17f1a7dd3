"""GET /v1/blobs/{sha256}: blob bytes, for stores that do not presign URLs (the local directory)."""

from __future__ import annotations

from collections.abc import Iterator

from fastapi import APIRouter, Path
from fastapi.responses import Response, StreamingResponse

from warmup.api.deps import ReadAccess, ServicesDep
from warmup.manifest import SHA256_PATTERN

router = APIRouter(prefix="/v1", tags=["blobs"])
CHUNK = 1 << 20
MEDIA_TYPE = "application/octet-stream"


@router.get("/blobs/{sha256}", dependencies=[ReadAccess], summary="A blob's bytes")
def get_blob(services: ServicesDep, sha256: str = Path(pattern=SHA256_PATTERN)) -> Response:
    handle = services.store.open(sha256)  # BlobNotFoundError -> 404
    try:
        first = handle.read(CHUNK)
        rest = handle.read(CHUNK) if first else b""
    except BaseException:
        handle.close()
        raise
    if not rest:
        # Most cache files are a few kB: answered whole, in this one worker thread, rather than
        # streamed (a streamed body costs a thread-pool round trip per chunk and one more for the end).
        handle.close()
        return Response(first, media_type=MEDIA_TYPE)

    def chunks() -> Iterator[bytes]:
        with handle:
            yield first
            yield rest
            while chunk := handle.read(CHUNK):
                yield chunk

    return StreamingResponse(chunks(), media_type=MEDIA_TYPE)
