"""What a pull keeps in the pod's cache directory besides the cache itself: the index of files whose
digest a pull checked (a second pull is a stat per file), the manifest each pull installed (the
training process reads it), and the staging folder downloads wait in. Written atomically, never
through a symlink.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from warmup.client.service import CHUNK
from warmup.errors import WarmupError
from warmup.manifest import Manifest, ManifestFile, parse_manifest

if TYPE_CHECKING:
    from warmup.job.spec import Spec

INDEX_NAME = ".warmup-index.json"
TEMP_DIR_NAME = ".warmup-tmp"
# What each pull installed, by spec key: the training process (the callback, `warmup exec`) reads it.
LOCAL_MANIFESTS_DIR = ".warmup-manifests"
SPEC_SUFFIX = ".spec.json"  # beside each manifest there, the spec it was pulled for

# sha256, size, mtime_ns, inode, ctime_ns: as git's index, a file is taken as unchanged while all four
# stat fields match; `touch -r` restores an mtime but not a ctime.
IndexEntry = tuple[str, int, int, int, int]


def read_local_manifest(cache_dir: str | Path, spec_key: str) -> Manifest | None:
    """The manifest the last pull of `spec_key` installed into `cache_dir`, or None."""
    path = Path(cache_dir) / LOCAL_MANIFESTS_DIR / f"{spec_key}.json"
    try:
        return parse_manifest(json.loads(path.read_text()))
    except (OSError, ValueError, WarmupError):
        return None


def save_local_manifest(dest: Path, manifest: Manifest, spec: Spec | None = None) -> None:
    """Write the manifest a pull installed (and its spec, which `find_installed` matches on)."""
    folder = dest / LOCAL_MANIFESTS_DIR
    folder.mkdir(exist_ok=True)
    if spec is not None:
        write_replacing(folder / f"{manifest.spec_key}{SPEC_SUFFIX}", spec.canonical_json())
    write_replacing(
        folder / f"{manifest.spec_key}.json", json.dumps(manifest.without_urls().model_dump(mode="json"))
    )


def find_installed(cache_dir: str | Path, spec: Spec) -> tuple[Manifest, Spec] | None:
    """The manifest a pull of `spec` installed into `cache_dir`, with its spec; else the newest one
    installed for the same job with other data facts (pulled with `--dataset` or `--sample`, which the
    command at hand may not repeat: the facts only choose which shapes were warmed). None if neither."""
    from warmup.job.spec import Spec

    manifest = read_local_manifest(cache_dir, spec.key())
    if manifest is not None:
        return manifest, spec
    folder = Path(cache_dir) / LOCAL_MANIFESTS_DIR
    found: list[tuple[int, Manifest, Spec]] = []
    for path in folder.glob(f"*{SPEC_SUFFIX}") if folder.is_dir() else ():
        try:
            other = Spec.model_validate_json(path.read_bytes())
        except (OSError, ValueError):
            continue
        if other.model_copy(update={"data": spec.data}).key() != spec.key():
            continue
        manifest = read_local_manifest(cache_dir, other.key())
        if manifest is not None:
            found.append((path.stat().st_mtime_ns, manifest, other))
    if not found:
        return None
    _, manifest, other = max(found, key=lambda item: item[0])
    return manifest, other


def write_replacing(path: Path, text: str) -> None:
    """Write `path` atomically through a new temp file: never through a symlink planted at a fixed name."""
    handle, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(handle, "w") as out:
            os.fchmod(out.fileno(), 0o644)
            out.write(text)
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise


@dataclass
class LocalIndex:
    """What this directory holds, as last checked: path -> (sha256, size, mtime_ns, inode, ctime_ns),
    recorded when the file's digest was checked. `unchanged` trusts it; `verified` hashes."""

    files: dict[str, IndexEntry]
    changed: bool = False

    @classmethod
    def load(cls, dest: Path) -> LocalIndex:
        try:
            data = json.loads((dest / INDEX_NAME).read_text())
            raw = data.get("files", {})
        except (OSError, ValueError, AttributeError):
            return cls(files={})
        files: dict[str, IndexEntry] = {}
        for path, entry in raw.items() if isinstance(raw, dict) else ():
            # A damaged entry, or one of an older index without inode and ctime: that file is hashed again.
            if isinstance(entry, list) and len(entry) == 5:
                with contextlib.suppress(TypeError, ValueError):
                    sha, size, mtime, inode, ctime = entry
                    files[str(path)] = (str(sha), int(size), int(mtime), int(inode), int(ctime))
        return cls(files=files)

    def unchanged(self, dest: Path, file: ManifestFile) -> bool | None:
        """True when the file's stat matches the entry recorded when its digest was checked; False when
        it is missing or not the size it should be; None when only its digest can tell."""
        stat = _regular_file_stat(dest / file.path)
        if stat is None or stat.st_size != file.size:
            return False
        if self.files.get(file.path) == (file.sha256, *_stat_fields(stat)):
            return True
        return None

    def verified(self, dest: Path, file: ManifestFile, *, trust_index: bool = True) -> bool:
        """Whether `dest` holds the file intact: by the index when `trust_index` and its stat is unchanged,
        else by its sha256 (then recorded)."""
        unchanged = self.unchanged(dest, file)
        if unchanged is False:
            return False
        if unchanged and trust_index:
            return True
        target = dest / file.path
        before = target.lstat()
        if sha256_of(target) != file.sha256:
            return False
        if _stat_fields(before) == _stat_fields(target.lstat()):  # not changed while it was read
            self.files[file.path] = (file.sha256, *_stat_fields(before))
            self.changed = True
        return True

    def record(self, dest: Path, file: ManifestFile) -> None:
        """`file` was just renamed into place, its digest checked as it downloaded."""
        self.files[file.path] = (file.sha256, *_stat_fields((dest / file.path).lstat()))
        self.changed = True

    def save(self, dest: Path) -> None:
        write_replacing(dest / INDEX_NAME, json.dumps({"files": {k: list(v) for k, v in self.files.items()}}))


def _regular_file_stat(path: Path) -> os.stat_result | None:
    try:
        stat = path.lstat()
    except OSError:
        return None
    return stat if os.path.isfile(path) and not path.is_symlink() else None


def _stat_fields(stat: os.stat_result) -> tuple[int, int, int, int]:
    return stat.st_size, stat.st_mtime_ns, stat.st_ino, stat.st_ctime_ns


class Staging:
    """This pull's own folder in `DEST/.warmup-tmp`, where its downloads wait until they are renamed
    into place, held by an flock for as long as the pull's process lives.

    A pull killed at any moment leaves its folder behind, unlocked (the kernel drops a dead process's
    locks). Opening a staging folder removes every unlocked one, and any loose file (an older client's),
    under an exclusive lock on `.warmup-tmp` itself, which is also held while a folder is made and
    locked: a pull running into the same directory is never swept.
    """

    def __init__(self, root: Path, path: Path, handle: int, removed: tuple[int, int]) -> None:
        self.root = root
        self.path = path
        self._handle = handle
        self.removed = removed  # files and bytes killed pulls left, removed when this one opened

    @classmethod
    def open(cls, dest: Path) -> Staging:
        root = dest / TEMP_DIR_NAME
        with _locked(root):
            removed = _sweep(root)
            path = Path(tempfile.mkdtemp(dir=root, prefix=f"{os.getpid()}-"))
            handle = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
            fcntl.flock(handle, fcntl.LOCK_EX)
        return cls(root, path, handle, removed)

    def close(self) -> None:
        """Remove this pull's folder, and `.warmup-tmp` when no other pull uses it."""
        with _locked(self.root, make=False):
            shutil.rmtree(self.path, ignore_errors=True)
            os.close(self._handle)
            with contextlib.suppress(OSError):  # another pull's folder is in it
                self.root.rmdir()


def sweep_staging(dest: Path) -> tuple[int, int]:
    """Remove what killed pulls left in `DEST/.warmup-tmp` (and the folder, when no pull uses it);
    returns the files and bytes removed. Nothing to do when the folder does not exist."""
    root = dest / TEMP_DIR_NAME
    if not root.is_dir() or root.is_symlink():
        return 0, 0
    with _locked(root, make=False):
        removed = _sweep(root)
        with contextlib.suppress(OSError):
            root.rmdir()
    return removed


@contextlib.contextmanager
def _locked(root: Path, *, make: bool = True) -> Iterator[bool]:
    """Hold an exclusive flock on the folder `root` (made first when `make`). A pull that finds it empty
    removes it, so the folder locked must still be the one at `root`, else it is made and locked again."""
    while True:
        if make:
            with contextlib.suppress(FileExistsError):
                os.mkdir(root)
        try:
            handle = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except FileNotFoundError:
            if not make:
                yield False
                return
            continue
        try:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                current = os.stat(root, follow_symlinks=False).st_ino
            except FileNotFoundError:
                current = -1
            if current == os.fstat(handle).st_ino:
                yield True
                return
        finally:
            os.close(handle)  # releases the lock


def _sweep(root: Path) -> tuple[int, int]:
    """Under the lock on `root`: remove the folders whose pull is dead (their flock is free) and any
    loose file; returns the files and bytes removed."""
    files = size = 0
    for entry in os.scandir(root):
        if entry.is_dir(follow_symlinks=False):
            try:
                handle = os.open(entry.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
            except OSError:
                continue
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(handle)
                continue  # a live pull's
            try:
                for folder, _, names in os.walk(entry.path):
                    for name in names:
                        with contextlib.suppress(OSError):
                            size += os.lstat(os.path.join(folder, name)).st_size
                            files += 1
                shutil.rmtree(entry.path, ignore_errors=True)
            finally:
                os.close(handle)
        else:
            with contextlib.suppress(OSError):
                size += entry.stat(follow_symlinks=False).st_size
                os.unlink(entry.path)
                files += 1
    return files, size


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()
