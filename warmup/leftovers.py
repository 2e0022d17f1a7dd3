"""What a killed process leaves behind, told apart from what a live one is still writing.

A writer holds an exclusive `flock` on the temp file or folder it works in for as long as it works
there; the kernel drops the lock when the process dies, however it dies. So a leftover is a path whose
lock can be taken: `remove_abandoned` takes it (never waiting) and removes the path while holding it,
and leaves alone every path a live process holds, on this host or another sharing the directory
(Linux's NFS client maps flock to byte-range locks the server enforces).

Between creating a path and locking it a writer holds nothing; a cleaner may remove it in that moment.
`hold` then finds the path unlinked and the writer makes another (`locked_temp_file`, `locked_temp_dir`).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path


def hold(fd: int) -> bool:
    """Lock what `fd` opens for this process; False if it was removed before the lock was taken (make
    another)."""
    fcntl.flock(fd, fcntl.LOCK_EX)
    return os.fstat(fd).st_nlink > 0


def locked_temp_file(directory: Path, prefix: str) -> tuple[int, Path]:
    """`tempfile.mkstemp`, its file locked until the descriptor is closed."""
    while True:
        fd, name = tempfile.mkstemp(dir=directory, prefix=prefix)
        if hold(fd):
            return fd, Path(name)
        os.close(fd)


def locked_temp_dir(directory: Path | None, prefix: str) -> tuple[int, Path]:
    """`tempfile.mkdtemp`, the folder locked until the returned descriptor is closed."""
    while True:
        path = Path(tempfile.mkdtemp(dir=directory, prefix=prefix))
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        if hold(fd):
            return fd, path
        os.close(fd)


@dataclass
class Removed:
    """What `remove_abandoned` removed: the paths and their bytes."""

    paths: list[Path] = field(default_factory=list)
    bytes: int = 0

    def describe(self, what: str) -> str:
        names = ", ".join(p.name for p in self.paths[:5]) + (" ..." if len(self.paths) > 5 else "")
        return f"removed {len(self.paths)} {what} left by killed processes ({self.bytes} bytes): {names}"


def remove_abandoned(paths: Iterable[Path]) -> Removed:
    """Remove each file or folder no live process holds (see the module's docstring)."""
    removed = Removed()
    for path in paths:
        try:
            flags = os.O_RDONLY | (os.O_DIRECTORY if path.is_dir() else 0)
            fd = os.open(path, flags | os.O_NOFOLLOW)
        except OSError:  # gone meanwhile, or a link: not ours to follow
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # a live writer's
            size = _size(path)
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
            removed.paths.append(path)
            removed.bytes += size
        finally:
            os.close(fd)
    return removed


def _size(path: Path) -> int:
    if not path.is_dir():
        return path.stat().st_size
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                continue
    return total


__all__ = ["Removed", "hold", "locked_temp_dir", "locked_temp_file", "remove_abandoned"]
