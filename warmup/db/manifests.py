"""Build a manifest from the entries of (signatures, toolchain), and publish it into the bucket.

The API builds manifests for pods; workers publish them into the bucket once a job is complete
(after its blobs), so that pods with bucket credentials can pull while the API is down.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from warmup.db.records import Keyed
from warmup.db.repository import Repository
from warmup.errors import UnsafeArtifactError
from warmup.manifest import Manifest, ManifestFile, manifest_object_key
from warmup.store import BlobStore

__all__ = ["build_manifest", "manifest_object_key", "publish_manifest"]

# Named by the hash of their C++ source, but g++ embeds the build directory in them: the same kernel
# built by two rehearsals (a kernel shared by two shapes) has one path and two valid contents.
BUILD_DIR_DEPENDENT = (".so",)


def build_manifest(
    repository: Repository,
    store: BlobStore | None,
    *,
    spec_key: str,
    toolchain: Keyed,
    signature_keys: Sequence[str],
    plan_size: int,
    presign_expiry_s: int | None = None,
) -> Manifest:
    """The union of the entries' files; `missing` lists signatures without an entry.

    With `presign_expiry_s` and a store that presigns (S3), each file gets a download URL;
    otherwise pods fetch blobs from the API's blob route (or from the bucket with `--from`).
    """
    entries = repository.entries_for(signature_keys, toolchain.key)
    files: dict[str, ManifestFile] = {}
    for key in signature_keys:
        entry = entries.get(key)
        if entry is None:
            continue
        for ref in entry.files:
            known = files.get(ref.path)
            if known is not None:
                if known.sha256 != ref.sha256 and not ref.path.endswith(BUILD_DIR_DEPENDENT):
                    # Inductor and TorchNeuron name their files by content hash: this cannot happen
                    # unless a cache was tampered with. Refuse rather than install either.
                    raise UnsafeArtifactError(
                        f"two entries disagree on the content of {ref.path!r}; re-warm the spec"
                    )
                continue  # a kernel two runs built: either build serves (the first entry's is kept)
            url = store.presigned_url(ref.sha256, presign_expiry_s) if store and presign_expiry_s else None
            files[ref.path] = ManifestFile(path=ref.path, sha256=ref.sha256, size=ref.size, url=url)
    return Manifest(
        spec_key=spec_key,
        toolchain_key=toolchain.key,
        toolchain=toolchain.data,
        backend=toolchain.data["backend"],
        device=toolchain.data["device"],
        plan_size=plan_size,
        signatures=[key for key in signature_keys if key in entries],
        missing=[key for key in signature_keys if key not in entries],
        files=sorted(files.values(), key=lambda f: f.path),
    )


def publish_manifest(store: BlobStore, manifest: Manifest) -> None:
    """Write a complete manifest into the bucket, without URLs (pods pulling from the bucket read blobs
    directly). Call only after every blob it names is in the store."""
    body = manifest.without_urls()
    store.put_object(
        manifest_object_key(manifest.spec_key, manifest.toolchain_key),
        json.dumps(body.model_dump(mode="json"), sort_keys=True).encode(),
    )
