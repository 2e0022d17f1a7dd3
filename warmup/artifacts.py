"""Artifact files: what an entry is made of, and the helpers to list, hash and copy them.

An entry is a list of files relative to a cache directory, each with its sha256 and size. The
blob store keeps one blob per sha256, so two entries that share a file store it once.

No heavy imports here: the pull client on a training pod reuses this module.

One fact to know when merging entries: on CPU, g++ embeds the build directory in each `.so`, so the
same kernel compiled in two cache directories gives two files with the same relative path and
different bytes. Both are valid; `copy_tree` keeps whichever is already in place.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from warmup.errors import UnsafeArtifactError

_CHUNK = 1 << 20
# The manifest `warmup warm` writes at the top of a cache dir; never an artifact.
MANIFEST_NAME = "trl-warmup.json"


@dataclass(frozen=True, order=True)
class ArtifactFile:
    """One file of an entry: its path inside the cache dir (POSIX, relative), sha256 and size in bytes."""

    path: str
    sha256: str
    size: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ArtifactFile:
        return cls(path=safe_relative_path(data["path"]), sha256=str(data["sha256"]), size=int(data["size"]))


def sha256_file(path: str | os.PathLike[str]) -> str:
    """The sha256 of a file's content, read in chunks (blobs can be gigabytes)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def safe_relative_path(path: str) -> str:
    """`path` if it stays inside its root once joined to it; UnsafeArtifactError otherwise.

    Refuses absolute paths, drive letters, backslashes, empty parts, `.` and `..`.
    """
    if not path or "\\" in path or "\x00" in path:
        raise UnsafeArtifactError(f"artifact path {path!r} is empty or has a backslash or NUL; refusing it")
    pure = PurePosixPath(path)
    if pure.is_absolute() or ":" in pure.parts[0]:
        raise UnsafeArtifactError(
            f"artifact path {path!r} is absolute; entries hold paths relative to the cache dir"
        )
    if any(part in ("", ".", "..") for part in path.split("/")):
        raise UnsafeArtifactError(f"artifact path {path!r} has an empty, '.' or '..' part; refusing it")
    return path


def scan_files(
    root: str | os.PathLike[str], include: Callable[[str], bool] | None = None
) -> list[ArtifactFile]:
    """Every regular file under `root` that `include(relative_path)` accepts, hashed, sorted by path.

    Symbolic links are neither followed nor listed: an entry holds plain files only.
    """
    root = Path(root)
    found: list[ArtifactFile] = []
    if not root.is_dir():
        return found
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames.sort()
        for name in sorted(filenames):
            full = Path(dirpath, name)
            if full.is_symlink() or not full.is_file():
                continue
            relative = full.relative_to(root).as_posix()
            if include is not None and not include(relative):
                continue
            found.append(ArtifactFile(relative, sha256_file(full), full.stat().st_size))
    return sorted(found)


def list_paths(root: str | os.PathLike[str]) -> set[str]:
    """Relative paths of every regular file under `root` (no hashing): cheap snapshots for diffing."""
    root = Path(root)
    paths: set[str] = set()
    if not root.is_dir():
        return paths
    for dirpath, _dirnames, filenames in os.walk(root, followlinks=False):
        for name in filenames:
            full = Path(dirpath, name)
            if not full.is_symlink():
                paths.add(full.relative_to(root).as_posix())
    return paths


def copy_tree(
    source: str | os.PathLike[str], dest: str | os.PathLike[str], files: Iterable[ArtifactFile]
) -> list[str]:
    """Copy `files` from `source` into `dest`, each written to a temp name and renamed into place.

    A file already present in `dest` is kept (see the module docstring about `.so` bytes). Returns the
    relative paths actually copied.
    """
    source, dest = Path(source), Path(dest)
    copied = []
    for item in files:
        relative = safe_relative_path(item.path)
        target = dest / relative
        if target.exists():
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        temp = target.with_name(f".{target.name}.{os.getpid()}.partial")
        shutil.copyfile(source / relative, temp)
        os.replace(temp, target)
        copied.append(relative)
    return copied


def total_size(files: Iterable[ArtifactFile]) -> int:
    return sum(item.size for item in files)
