"""What a pull keeps in the pod's cache directory besides the cache itself: the index of files already
verified (a second pull is a stat per file), the manifest each pull installed (the training process
reads it), and the temp folder downloads are staged in. Written atomically, never through a symlink.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from warmup.client.service import CHUNK
from warmup.errors import WarmupError
from warmup.manifest import Manifest, ManifestFile, parse_manifest

INDEX_NAME = ".warmup-index.json"
TEMP_DIR_NAME = ".warmup-tmp"
# What each pull installed, by spec key: the training process (the callback, `warmup exec`) reads it.
LOCAL_MANIFESTS_DIR = ".warmup-manifests"

IndexEntry = tuple[str, int, int]  # sha256, size, mtime_ns


def read_local_manifest(cache_dir: str | Path, spec_key: str) -> Manifest | None:
    """The manifest the last pull of `spec_key` installed into `cache_dir`, or None."""
    path = Path(cache_dir) / LOCAL_MANIFESTS_DIR / f"{spec_key}.json"
    try:
        return parse_manifest(json.loads(path.read_text()))
    except (OSError, ValueError, WarmupError):
        return None


def save_local_manifest(dest: Path, manifest: Manifest) -> None:
    folder = dest / LOCAL_MANIFESTS_DIR
    folder.mkdir(exist_ok=True)
    write_replacing(
        folder / f"{manifest.spec_key}.json", json.dumps(manifest.without_urls().model_dump(mode="json"))
    )


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
    """What this directory already holds, verified: path -> (sha256, size, mtime_ns)."""

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
            if isinstance(entry, list) and len(entry) == 3:
                with contextlib.suppress(TypeError, ValueError):  # a damaged entry: that file is hashed again
                    files[str(path)] = (str(entry[0]), int(entry[1]), int(entry[2]))
        return cls(files=files)

    def verified(self, dest: Path, file: ManifestFile) -> bool:
        target = dest / file.path
        try:
            stat = target.lstat()
        except OSError:
            return False
        if not target.is_file() or target.is_symlink() or stat.st_size != file.size:
            return False
        known = self.files.get(file.path)
        if known == (file.sha256, stat.st_size, stat.st_mtime_ns):
            return True
        if sha256_of(target) == file.sha256:  # present but unknown to the index: verify once
            self.files[file.path] = (file.sha256, stat.st_size, stat.st_mtime_ns)
            self.changed = True
            return True
        return False

    def record(self, dest: Path, file: ManifestFile) -> None:
        stat = (dest / file.path).lstat()
        self.files[file.path] = (file.sha256, stat.st_size, stat.st_mtime_ns)
        self.changed = True

    def save(self, dest: Path) -> None:
        write_replacing(dest / INDEX_NAME, json.dumps({"files": {k: list(v) for k, v in self.files.items()}}))


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()
