"""The pod's client of the service: the HTTP API, and `pull`, which installs a verified, prewarmed cache.

Pod-side code: needs only the base install (pydantic), never fastapi, sqlalchemy, httpx or boto3 at
import (pulling straight from S3 with `source="s3://..."` imports boto3 when it runs). HTTP is the
standard library's: `urllib.request` for the few API calls (proxies from the environment, no
redirects followed), `http.client` with one kept-alive connection per download thread for blobs. A
pull is a short process on a pod's critical path, where httpx's import and client set-up are a
noticeable share (benchmarks/bench_pull.py measures it).

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

Nothing is re-exported here: users import `pull` and `PullResult` from `warmup`; the project's own code
imports from the module that defines a name.
"""
