"""`install`: download and verify every file of a manifest into a directory, all files or none.

In four steps, each a function of its own:
1. check: every path of the manifest is refused before anything is written if it would land outside
   the destination, go through a symlink, or clash with another path or with the client's own files;
2. plan: which files are already there and intact (by the index's stat fields, or by their sha256),
   which must be downloaded, and whether they fit on the disk once what killed pulls left is removed;
3. download: plain threads take files from one queue, each into a temp file in this install's own
   staging folder (warmup.client.local.Staging), checking size and sha256 as it streams and retrying
   transient failures with backoff (warmup/retry.py);
4. commit: only when every file is verified are they renamed into place, the index and the local
   manifest written. A failed install removes what it staged and the folders it made.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from warmup.client.local import (
    INDEX_NAME,
    LOCAL_MANIFESTS_DIR,
    TEMP_DIR_NAME,
    LocalIndex,
    Staging,
    save_local_manifest,
    sweep_staging,
)
from warmup.client.sources import BlobSource, TransientDownloadError, retryable
from warmup.errors import BlobIntegrityError, StoreError, UnsafeArtifactError, WarmupError
from warmup.manifest import Manifest, ManifestFile, check_relative_path
from warmup.retry import RESTART, RETRY_VARIABLE, Backoff, retry_budget_s, retrying

if TYPE_CHECKING:
    from hashlib import _Hash

    from warmup.job.spec import Spec


@dataclass(frozen=True)
class PullProgress:
    """Where an install stands: files done (skipped ones count as done) and bytes downloaded so far."""

    files_done: int
    files_total: int
    bytes_done: int
    bytes_total: int  # of the files that need downloading
    elapsed_s: float


ProgressCallback = Callable[[PullProgress], None]


@dataclass
class PullResult:
    manifest: Manifest
    dest: Path
    source: str = ""
    downloaded: int = 0
    skipped: int = 0
    bytes_downloaded: int = 0
    seconds: float = 0.0
    failures: list[tuple[str, BaseException]] = field(default_factory=list)
    hashed: int = 0  # of the `skipped` files already in place, those whose sha256 this install checked
    # What pulls killed earlier had left in DEST/.warmup-tmp, removed by this one: files, bytes.
    removed_leftovers: tuple[int, int] = (0, 0)
    # How `pull` found the toolchain: given, remembered, exact, predicted, computed (warmup/toolchain/memo.py).
    toolchain_source: str = ""

    @property
    def env(self) -> dict[str, str]:
        return self.manifest.environment(str(self.dest))


@dataclass
class InstallPlan:
    """What an install will do: the manifest's files (each path once), those still to download, and
    the index of what the destination already holds."""

    dest: Path
    created: bool  # the install made `dest`: a failed one removes it again
    files: list[ManifestFile]
    todo: list[ManifestFile]
    index: LocalIndex
    hashed: int = 0  # files already in place whose sha256 the plan checked and found right

    @property
    def bytes_total(self) -> int:
        return sum(file.size for file in self.todo)


def install(
    manifest: Manifest,
    dest: str | Path,
    source: BlobSource,
    *,
    parallel: int = 16,
    on_progress: ProgressCallback | None = None,
    attempts: int | None = None,
    trust_index: bool = True,
    spec: Spec | None = None,
) -> PullResult:
    """Download and verify every file of `manifest` into `dest`; skip files already there and intact
    (by the index when `trust_index` and their stat is unchanged, else by their sha256).

    All paths are checked before anything is written. Files are downloaded into this install's own
    staging folder and renamed into place only once every one of them is verified: a failed install
    leaves `dest` as it was, but for what killed pulls had left in `DEST/.warmup-tmp`, removed first.
    `spec`, the manifest's, is kept beside it (the offline fallback of `warmup exec` matches on it).
    """
    started = time.monotonic()
    target = Path(dest).resolve()
    files = check_paths(manifest, target)
    plan = plan_install(target, files, trust_index=trust_index, parallel=parallel)
    result = PullResult(
        manifest=manifest, dest=target, skipped=len(files) - len(plan.todo), hashed=plan.hashed
    )
    made: list[Path] = []  # folders this install created: removed again if it fails
    installed = False
    try:
        if plan.todo:
            installed = _download_and_commit(plan, manifest, spec, source, result, made, parallel=parallel,
                                             attempts=attempts, on_progress=on_progress, started=started)  # fmt: skip
        else:
            result.removed_leftovers = sweep_staging(target)
            commit(plan, manifest, {}, spec)
            installed = True
    finally:
        _clean_up(plan, made, installed=installed)
    result.seconds = time.monotonic() - started
    if result.failures:
        raise _failure(result.failures, len(plan.todo), attempts)
    if on_progress:
        on_progress(_progress(len(files), len(files), result.bytes_downloaded, plan, started))
    return result


def _download_and_commit(
    plan: InstallPlan,
    manifest: Manifest,
    spec: Spec | None,
    source: BlobSource,
    result: PullResult,
    made: list[Path],
    **options: Any,
) -> bool:
    """In a staging folder of its own (which first removes what killed pulls left): check that the files
    fit, download them, and rename them into place once all are verified. Whether they were installed."""
    staging = Staging.open(plan.dest)
    staged: dict[str, Path] = {}
    try:
        result.removed_leftovers = staging.removed
        _refuse_more_than_fits(plan.dest, plan.bytes_total)
        # Before the downloads start: with them running, each mkdir would wait for the GIL.
        _make_folders(plan.dest, plan.todo, made)
        staged = download(plan, staging.path, source, result, **options)
        if result.failures:
            return False
        commit(plan, manifest, staged, spec)
        return True
    finally:
        for leftover in staged.values():
            leftover.unlink(missing_ok=True)
        staging.close()


# --- 1. check -------------------------------------------------------------------------------------


def check_paths(manifest: Manifest, dest: Path) -> list[ManifestFile]:
    """The manifest's files, each path once, once every path is known safe to write in `dest`: refuses a
    hostile manifest (paths outside `dest`, through symlinks, clashing) before anything is written."""
    exists = dest.exists()
    for file in manifest.files:
        check_relative_path(file.path)
        if exists:  # a new directory holds nothing a path could run into
            _refuse_symlinks(dest, file.path)
    files = _unique_paths(manifest.files)
    _refuse_own_state_links(dest)
    return files


def _unique_paths(files: list[ManifestFile]) -> list[ManifestFile]:
    """The files by path; refuses a path listed twice with different contents, or as a file and a folder."""
    by_path: dict[str, ManifestFile] = {}
    for file in files:
        other = by_path.setdefault(file.path, file)
        if other.sha256 != file.sha256 or other.size != file.size:
            raise UnsafeArtifactError(f"manifest lists {file.path!r} twice with different contents")
    folders = {parent for path in by_path for parent in _parents(path)}
    clash = sorted(folders & set(by_path))
    if clash:
        raise UnsafeArtifactError(
            f"manifest lists {clash[0]!r} both as a file and as a folder of other files"
        )
    return list(by_path.values())


def _parents(path: str) -> list[str]:
    parts = path.split("/")
    return ["/".join(parts[:end]) for end in range(1, len(parts))]


def _refuse_symlinks(dest: Path, relative: str) -> None:
    """Refuse a path whose existing parts inside dest include a symlink (it could point anywhere), or a
    file where a folder must be, or a folder where the file goes: installing would fail half-way."""
    current = dest
    parts = relative.split("/")
    for depth, part in enumerate(parts, start=1):
        current = current / part
        if current.is_symlink():
            raise UnsafeArtifactError(
                f"{relative!r} goes through a symlink in {dest}; refusing to write there"
            )
        if not current.exists():
            return
        if depth < len(parts) and not current.is_dir():
            raise UnsafeArtifactError(
                f"{relative!r}: {current} is a file, not a folder; refusing to replace it"
            )
        if depth == len(parts) and not current.is_file():
            raise UnsafeArtifactError(
                f"{relative!r}: {current} is not a regular file; refusing to replace it"
            )


def _refuse_own_state_links(dest: Path) -> None:
    """The client's own files and folders in dest are never symlinks: they would send its writes elsewhere."""
    for name in (TEMP_DIR_NAME, LOCAL_MANIFESTS_DIR, INDEX_NAME):
        if (dest / name).is_symlink():
            raise UnsafeArtifactError(f"{dest / name} is a symlink; refusing to write through it")


# --- 2. plan --------------------------------------------------------------------------------------


def plan_install(
    dest: Path, files: list[ManifestFile], *, trust_index: bool = True, parallel: int = 16
) -> InstallPlan:
    """Create `dest` if needed and work out which files must be downloaded: those not already there and
    intact (by the index when `trust_index` and their stat is unchanged, else by their sha256, hashed on
    `parallel` threads: hashlib lets go of the GIL)."""
    created = not dest.exists()
    dest.mkdir(parents=True, exist_ok=True)
    index = LocalIndex.load(dest)
    todo: list[ManifestFile] = []
    to_hash: list[ManifestFile] = []
    for file in [] if created else files:
        unchanged = index.unchanged(dest, file)
        if unchanged is False:
            todo.append(file)
        elif not (unchanged and trust_index):
            to_hash.append(file)
    if to_hash:
        with ThreadPoolExecutor(max_workers=min(max(1, parallel), len(to_hash))) as pool:
            intact = list(pool.map(lambda file: index.verified(dest, file, trust_index=False), to_hash))
        todo += [file for file, ok in zip(to_hash, intact, strict=True) if not ok]  # altered: replaced
    return InstallPlan(
        dest=dest,
        created=created,
        files=files,
        todo=files if created else todo,
        index=index,
        hashed=sum(intact) if to_hash else 0,
    )


def _refuse_more_than_fits(dest: Path, needed: int) -> None:
    """A manifest whose files do not fit on the disk is refused before the disk is filled (what killed
    pulls left in the staging folder is removed first, so it counts as free)."""
    free = shutil.disk_usage(dest).free
    if needed > free:
        raise UnsafeArtifactError(
            f"the manifest's files need {needed} bytes and {dest} has {free} free; refusing to fill the disk"
        )


def _make_folders(dest: Path, files: list[ManifestFile], made: list[Path]) -> None:
    """Create the folders `files` go into, parents first, recording in `made` those that were new."""
    folders = {folder for file in files for folder in _parents(file.path)}
    for folder in sorted(folders, key=lambda relative: relative.count("/")):
        try:
            os.mkdir(dest / folder)
        except FileExistsError:
            continue
        made.append(dest / folder)


# --- 3. download ----------------------------------------------------------------------------------


def download(
    plan: InstallPlan,
    temp_dir: Path,
    source: BlobSource,
    result: PullResult,
    *,
    parallel: int,
    attempts: int | None,
    on_progress: ProgressCallback | None,
    started: float,
) -> dict[str, Path]:
    """Download the plan's files into verified temp files in `temp_dir`; returns them by path. Failures are recorded
    in `result.failures`: after the first, the threads stop once their current file is done."""
    lock = threading.Lock()
    streamed = 0
    done = len(plan.files) - len(plan.todo)
    staged: dict[str, Path] = {}
    queue = iter(plan.todo)
    stop = threading.Event()  # set when a file has failed, or the install was interrupted

    def count(size: int) -> None:
        nonlocal streamed
        with lock:
            streamed += size

    def worker() -> None:
        """One download thread: takes the next file until none is left or the install stops."""
        nonlocal done
        while not stop.is_set():
            with lock:
                file = next(queue, None)
            if file is None:
                return
            try:
                staged_path = _download_one(temp_dir, file, source, count, attempts)
            except BaseException as error:
                with lock:  # one failure fails the install: the others stop after their current file
                    result.failures.append((file.path, error))
                stop.set()
                return
            with lock:
                staged[file.path] = staged_path
                result.downloaded += 1
                result.bytes_downloaded += file.size
                done += 1
                if on_progress:
                    on_progress(_progress(done, len(plan.files), streamed, plan, started))

    # Plain threads taking files from one queue: a future per file would wake this thread for
    # each, and with hundreds of small files every wake-up competes for the GIL.
    threads = [
        threading.Thread(target=worker, name=f"warmup-pull-{n}", daemon=True)
        for n in range(min(max(1, parallel), len(plan.todo)))
    ]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    except BaseException:  # interrupted: let the threads finish their current file, then clean up
        stop.set()
        for thread in threads:
            if thread.is_alive():
                thread.join()
        for leftover in staged.values():
            leftover.unlink(missing_ok=True)
        raise
    return staged


def _progress(done: int, total: int, streamed: int, plan: InstallPlan, started: float) -> PullProgress:
    return PullProgress(done, total, streamed, plan.bytes_total, time.monotonic() - started)


def _download_one(
    temp_dir: Path, file: ManifestFile, source: BlobSource, count: Callable[[int], None], attempts: int | None
) -> Path:
    """Download one blob into a verified temp file in `temp_dir`; transient failures are retried (for as
    long as the service takes to restart, or `attempts` times)."""

    def once() -> Path:
        handle, name = tempfile.mkstemp(dir=temp_dir, prefix=file.sha256[:12])
        try:
            with os.fdopen(handle, "wb") as out:
                os.fchmod(out.fileno(), 0o644)  # the training container may run as another user
                digest = hashlib.sha256()
                size = _copy_stream(file, source, out, digest, count)
            if size != file.size:
                raise BlobIntegrityError(f"size {size} != expected {file.size} for blob {file.sha256[:12]}")
            if digest.hexdigest() != file.sha256:
                raise BlobIntegrityError(
                    f"sha256 mismatch for {file.path} (blob {file.sha256[:12]} is corrupt in the store)"
                )
            return Path(name)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(name)
            raise

    return retrying(once, transient=retryable, backoff=_backoff(attempts))


def _backoff(attempts: int | None) -> Backoff:
    return RESTART if attempts is None else Backoff(attempts=attempts)


def _copy_stream(
    file: ManifestFile, source: BlobSource, out: IO[bytes], digest: _Hash, count: Callable[[int], None]
) -> int:
    size = 0
    with source.open(file) as chunks:
        for chunk in chunks:
            size += len(chunk)
            if size > file.size:
                raise BlobIntegrityError(
                    f"blob {file.sha256[:12]} is larger than the {file.size} bytes expected"
                )
            digest.update(chunk)
            out.write(chunk)
            count(len(chunk))
    return size


def _failure(failures: list[tuple[str, BaseException]], todo: int, attempts: int | None) -> WarmupError:
    """The error a failed install raises: the first failure's kind (a WarmupError's own, else StoreError)."""
    path, error = failures[0]
    kind = type(error) if isinstance(error, WarmupError) else StoreError
    remedy = ""
    if kind is TransientDownloadError or retryable(error):
        kind = StoreError
        tried = f"{attempts} times" if attempts else f"for up to {retry_budget_s():.0f}s, {RETRY_VARIABLE}"
        remedy = f" (tried {tried}: check that the blob store is up and reachable from here, then pull again)"
    return kind(
        f"{len(failures)} of {todo} file(s) failed, nothing was installed; first: {path}: {error}{remedy}"
    )


# --- 4. commit ------------------------------------------------------------------------------------


def commit(plan: InstallPlan, manifest: Manifest, staged: dict[str, Path], spec: Spec | None = None) -> None:
    """Every file is verified: rename each into place, then record them in the index and write the
    local manifest (what the training process reads)."""
    for file in plan.todo:
        os.replace(staged.pop(file.path), plan.dest / file.path)
        plan.index.record(plan.dest, file)
    save_local_manifest(plan.dest, manifest, spec)


def _clean_up(plan: InstallPlan, made: list[Path], *, installed: bool) -> None:
    """Save the index of a successful install; remove what a failed one made (folders, `dest` if it made
    it)."""
    if plan.index.changed and installed:  # a failed install leaves dest as it was
        plan.index.save(plan.dest)
    if not installed:
        for folder in reversed(made):
            with contextlib.suppress(OSError):
                folder.rmdir()
        if plan.created:
            with contextlib.suppress(OSError):
                plan.dest.rmdir()
