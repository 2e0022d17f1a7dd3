"""The manifest: what a training pod installs for (spec, toolchain).

The service builds it from the entries of the spec's signatures under the pod's toolchain; the pull
client downloads its files, checks each sha256, and installs them under a local cache directory.
It is also written into the bucket (after its blobs), so pods can pull when the API is down.

This module is part of the pod-side client: pydantic only.
"""

from __future__ import annotations

import posixpath
import re
import unicodedata
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, field_validator

from warmup.errors import UnsafeArtifactError

SHA256_PATTERN = r"^[0-9a-f]{64}$"
_SHA256 = re.compile(SHA256_PATTERN)
_PRINTABLE_ASCII = re.compile(r"[\x20-\x7e]*")
_CONTROL_OR_BACKSLASH = re.compile(r"[\x00-\x1f\\]")
MAX_PATH_LENGTH = 1024
MAX_NAME_BYTES = 255  # one path component, as Linux filesystems store it
# Names the pull client keeps its own state under, in the cache directory: never a manifest's to write.
RESERVED_PREFIX = ".warmup-"
MANIFESTS_PREFIX = "manifests"


def manifest_object_key(spec_key: str, toolchain_key: str) -> str:
    """Where a complete manifest lives in the bucket (relative to the store's prefix)."""
    return f"{MANIFESTS_PREFIX}/{spec_key}/{toolchain_key}.json"


def check_relative_path(path: str) -> str:
    """Return `path` if it is a safe relative POSIX path inside a directory, else raise UnsafeArtifactError.

    Refused: absolute paths, `..` components, backslashes, empty or `.` components, NUL and control
    characters, and over-long paths. Symlinks are refused where files are written (see client).
    """
    if not isinstance(path, str) or not path:
        raise UnsafeArtifactError(f"artifact path {path!r} is empty")
    if len(path) > MAX_PATH_LENGTH:
        raise UnsafeArtifactError(f"artifact path is longer than {MAX_PATH_LENGTH} characters")
    if _CONTROL_OR_BACKSLASH.search(path):
        raise UnsafeArtifactError(f"artifact path {path!r} has a control character or a backslash")
    if path.startswith("/") or re.match(r"^[A-Za-z]:", path):
        raise UnsafeArtifactError(f"artifact path {path!r} is absolute")
    parts = path.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise UnsafeArtifactError(f"artifact path {path!r} has an empty, '.' or '..' component")
    if posixpath.normpath(path) != path:
        raise UnsafeArtifactError(f"artifact path {path!r} is not normalised")
    if not _PRINTABLE_ASCII.fullmatch(path):  # printable ASCII (nearly every path) needs no Unicode check
        _check_unicode(path, parts)
    if any(len(part.encode()) > MAX_NAME_BYTES for part in parts):
        raise UnsafeArtifactError(
            f"artifact path {path!r:.80} has a component longer than {MAX_NAME_BYTES} bytes"
        )
    if parts[0].startswith(RESERVED_PREFIX):
        raise UnsafeArtifactError(f"artifact path {path!r} is where the pull client keeps its own state")
    return path


def _check_unicode(path: str, parts: list[str]) -> None:
    """A path is written as its NFC UTF-8 bytes, without invisible or unencodable characters, and no
    component may turn into '.', '..' or a separator where names are normalised (NFKC)."""
    if any(unicodedata.category(c) in ("Cc", "Cf", "Cs", "Co", "Cn") for c in path):
        raise UnsafeArtifactError(
            f"artifact path {path!r} has an invisible, private or unencodable character"
        )
    if unicodedata.normalize("NFC", path) != path:
        raise UnsafeArtifactError(f"artifact path {path!r} is not in Unicode normal form C")
    for part in parts:
        folded = unicodedata.normalize("NFKC", part)
        if folded in (".", "..") or "/" in folded or "\\" in folded:
            raise UnsafeArtifactError(f"artifact path {path!r} has a component that normalises to {folded!r}")


class ManifestFile(BaseModel):
    """One file to install: where it goes (relative to the cache dir), its content hash and size."""

    model_config = ConfigDict(frozen=True)

    path: str
    sha256: str = Field(pattern=SHA256_PATTERN)
    size: NonNegativeInt
    url: str | None = Field(None, description="Presigned GET URL; None: fetch from the API's blob route.")

    @field_validator("path")
    @classmethod
    def _safe_path(cls, value: str) -> str:
        try:
            return check_relative_path(value)
        except UnsafeArtifactError as error:
            raise ValueError(str(error)) from None


class Manifest(BaseModel):
    """Everything a pod needs to hit the warmed cache of one spec under one toolchain."""

    spec_key: str
    toolchain_key: str
    toolchain: dict[str, Any]
    backend: str
    device: str
    plan_size: NonNegativeInt = Field(
        description="Signatures the training process compiles: sizes Dynamo's recompile limit."
    )
    signatures: list[str] = Field(description="Keys of the signatures whose entries are included.")
    missing: list[str] = Field(default_factory=list, description="Planned signatures with no entry yet.")
    files: list[ManifestFile]

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def without_urls(self) -> Manifest:
        """The manifest as stored in the bucket and on the pod: presigned URLs expire, so drop them."""
        return self.model_copy(update={"files": [f.model_copy(update={"url": None}) for f in self.files]})

    def environment(self, cache_dir: str) -> dict[str, str]:
        """The environment a training process needs to hit this cache in `cache_dir`.

        Computed on the pod by the backend itself: parts of it (the CPU ISA and thread count in
        Inductor's key tag) describe the machine the training runs on, which the toolchain check
        has already proved equal to the warm-up worker's.
        """
        from warmup.backends.registry import get_backend

        return get_backend(self.backend, self.device).env(cache_dir, self.plan_size)


def is_sha256(value: str) -> bool:
    return bool(_SHA256.match(value))


def parse_manifest(data: Any) -> Manifest:
    """Validate a manifest from the network or a bucket; a hostile path is an UnsafeArtifactError."""
    from pydantic import ValidationError

    try:
        return Manifest.model_validate(data)
    except ValidationError as error:
        messages = [e["msg"].removeprefix("Value error, ") for e in error.errors(include_url=False)]
        unsafe = [m for m in messages if m.startswith("artifact path")]
        if unsafe:
            raise UnsafeArtifactError(f"refusing manifest: {unsafe[0]}") from None
        raise UnsafeArtifactError(f"refusing malformed manifest: {'; '.join(messages[:3])}") from None
