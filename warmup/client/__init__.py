"""The pod's client of the service: the HTTP API, and `pull`, which installs a verified, prewarmed cache.

Pod-side code: needs only the base install (pydantic), never fastapi, sqlalchemy, httpx or boto3 at
import (pulling straight from S3 with `source="s3://..."` imports boto3 when it runs). HTTP is the
standard library's: `urllib.request` for the few API calls (proxies from the environment, no
redirects followed), `http.client` with one kept-alive connection per download thread for blobs. A
pull is a short process on a pod's critical path, and httpx's import and client set-up alone cost
about 0.1 s of a 0.5 s pull (benchmarks/bench_pull.py).

The modules, each using only those above it:
- `service`: `ServiceClient` (the API), the transport under it, API errors back to WarmupErrors;
- `sources`: where blob bytes come from (`HttpBlobSource`: presigned URLs or the API's blob route;
  `StoreBlobSource`: the bucket itself);
- `local`: what a pull keeps in the cache directory (the index of verified files, the manifests it
  installed);
- `installing`: `install`, in four steps (check, plan, download, commit): all files or none;
- `pulling`: `pull`, the manifest of (spec, toolchain) from the service or the bucket, then install;
- `background`: `warmup exec`'s install beside the training command's start, and the training
  process's wait for it.
"""

from warmup.client.installing import (
    DOWNLOAD_ATTEMPTS,
    InstallPlan,
    ProgressCallback,
    PullProgress,
    PullResult,
    install,
)
from warmup.client.local import INDEX_NAME, LOCAL_MANIFESTS_DIR, TEMP_DIR_NAME, read_local_manifest
from warmup.client.pulling import PRESIGN_S, PendingInstall, PullOptions, bucket_manifest, prepare_pull, pull
from warmup.client.service import (
    DEFAULT_TIMEOUT_S,
    MAX_MANIFEST_BYTES,
    Answer,
    ServiceClient,
    TransportError,
    api_error,
    fetch_answer,
    signature_label,
)
from warmup.client.sources import BlobSource, HttpBlobSource, StoreBlobSource, TransientDownloadError

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "DOWNLOAD_ATTEMPTS",
    "INDEX_NAME",
    "LOCAL_MANIFESTS_DIR",
    "MAX_MANIFEST_BYTES",
    "PRESIGN_S",
    "TEMP_DIR_NAME",
    "Answer",
    "BlobSource",
    "HttpBlobSource",
    "InstallPlan",
    "PendingInstall",
    "ProgressCallback",
    "PullOptions",
    "PullProgress",
    "PullResult",
    "ServiceClient",
    "StoreBlobSource",
    "TransientDownloadError",
    "TransportError",
    "api_error",
    "bucket_manifest",
    "fetch_answer",
    "install",
    "prepare_pull",
    "pull",
    "read_local_manifest",
    "signature_label",
]
