"""Test-only fault injection for real `warmup worker` processes (never shipped, never imported).

tests/reliability/test_worker_faults.py puts this directory first on a worker's PYTHONPATH, so every
Python process of that worker (the worker itself, the rehearsal supervisor, its forked runs) runs
this module at start-up. Each fault is switched on by an environment variable and talks to the test
through files in WARMUP_FAULT_DIR: the hook touches a marker when it reaches its point, and waits
there for a "go" file that the test may never write (it sends SIGKILL or SIGSTOP instead). The
product code stays free of test hooks; these only wrap it from outside.

  WARMUP_FAULT_ARTIFACTS=1       the worker's rehearsal, after the real one ran (eager signatures:
                                 instant), gives each entry three artifact files: two whose bytes
                                 depend only on the signature (as a deterministic compiler's would,
                                 so every worker uploads the same blobs) and one unique to the process
  WARMUP_FAULT_HOLD_REHEARSAL=1  the rehearsal touches `rehearsing` and waits for `go-rehearsal`
  WARMUP_FAULT_HOLD_UPLOAD=N     the Nth blob upload of the process, once its bytes are written to
                                 the store's temp file and before they are synced and renamed,
                                 touches `uploading` and waits for `go-upload`
  WARMUP_FAULT_HOLD_HEARTBEAT=1  the heartbeat thread, right after its UPDATE of the task ran inside
                                 its transaction (row locked, not committed), touches `heartbeat`
                                 and waits for `go-heartbeat`
  WARMUP_FAULT_FAIL_MANIFEST=N   the first N manifests the worker writes into the store fail with
                                 ENOSPC (a full disk), after the task that completed the job is done
  WARMUP_FAULT_CRASH_COMPILE=SIG a rehearsal run (the supervisor's forked child) dies the moment
                                 Inductor starts compiling: SEGV (a real NULL dereference) or ABRT;
                                 "SEGV,ABRT" takes them in turn, one per attempt, counted in the dir
  WARMUP_FAULT_CRASH_SUPERVISOR=1 the rehearsal supervisor dies by SIGSEGV as it starts
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

FAULT_DIR = Path(os.environ.get("WARMUP_FAULT_DIR", "/nonexistent"))


def _cmdline() -> list[str]:
    try:
        return Path("/proc/self/cmdline").read_bytes().decode().split("\0")
    except OSError:
        return []


def _touch(name: str) -> None:
    (FAULT_DIR / name).write_text(str(os.getpid()))


def _wait_for(name: str) -> None:
    while not (FAULT_DIR / name).exists():
        time.sleep(0.05)


def _wrap_rehearse() -> None:
    import hashlib

    import warmup.rehearsal.runner as rehearsal
    from warmup.backends.registry import get_backend

    real = rehearsal.rehearse

    def rehearse(spec, signatures, cache_root, **options):  # type: ignore[no-untyped-def]
        results = real(spec, signatures, cache_root, **options)
        if os.environ.get("WARMUP_FAULT_HOLD_REHEARSAL"):
            _touch("rehearsing")
            _wait_for("go-rehearsal")
        if not os.environ.get("WARMUP_FAULT_ARTIFACTS"):
            return results
        for result in results:
            if result.status != "ok" or result.files:
                continue
            cache = Path(cache_root) / "fake-cache" / result.key[:16]
            for name in ("graph.bin", "kernel.so"):
                seed = hashlib.sha256(f"{result.key}/{name}".encode()).digest()
                (cache / name).parent.mkdir(parents=True, exist_ok=True)
                (cache / name).write_bytes(seed * 8192)  # 256 KiB
            (cache / "build-log.txt").write_text(f"built by pid {os.getpid()} at {time.time()}\n")
            result.files = get_backend("inductor", "cpu").collect(cache)
            result.cache_dir = cache
        return results

    rehearsal.rehearse = rehearse


def _hold_upload(count: int) -> None:
    """Wrap os.fsync: the store syncs a blob's temp file (`.tmp-*` under `blobs/`) before renaming it."""
    real_fsync = os.fsync
    seen = [0]

    def fsync(fd: int) -> None:
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            target = ""
        if "/blobs/" in target and "/.tmp-" in target:
            seen[0] += 1
            if seen[0] == count:
                _touch("uploading")
                _wait_for("go-upload")
        real_fsync(fd)

    os.fsync = fsync


def _fail_manifests(count: int) -> None:
    import errno

    from warmup.store import LocalBlobStore

    real_put_object = LocalBlobStore.put_object
    failed = [0]

    def put_object(self, key: str, data: bytes) -> None:  # type: ignore[no-untyped-def]
        if failed[0] < count:
            failed[0] += 1
            _touch(f"manifest-failed-{failed[0]}")
            raise OSError(errno.ENOSPC, "No space left on device (injected)", key)
        real_put_object(self, key, data)

    LocalBlobStore.put_object = put_object  # type: ignore[method-assign]


def _hold_heartbeat() -> None:
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    def after_cursor_execute(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
        if threading.current_thread().name.startswith("heartbeat-") and statement.lstrip().upper().startswith(
            "UPDATE TASKS"
        ):
            _touch("heartbeat")
            _wait_for("go-heartbeat")

    event.listen(Engine, "after_cursor_execute", after_cursor_execute)


def _crash_compile(signals: list[str]) -> None:
    """In each run the supervisor forks, make Inductor's entry point crash the process."""

    def crash() -> None:
        import ctypes
        import signal

        attempts = len(list(FAULT_DIR.glob("crash-*")))
        which = signals[attempts % len(signals)]
        _touch(f"crash-{attempts}-{which}")
        if which == "ABRT":
            os.abort()
        if which == "SEGV":
            ctypes.string_at(0)  # a real NULL dereference
        os.kill(os.getpid(), getattr(signal, f"SIG{which}"))

    def in_child() -> None:
        compile_fx = sys.modules.get("torch._inductor.compile_fx")
        if compile_fx is None:
            return

        def crashing(*args, **kwargs):  # type: ignore[no-untyped-def]
            crash()

        compile_fx.compile_fx = crashing

    os.register_at_fork(after_in_child=in_child)


def _install() -> None:
    command = _cmdline()
    is_worker = "warmup" in command and "worker" in command
    is_supervisor = "warmup.rehearsal.zygote" in command
    if is_worker:
        if os.environ.get("WARMUP_FAULT_ARTIFACTS") or os.environ.get("WARMUP_FAULT_HOLD_REHEARSAL"):
            _wrap_rehearse()
        if os.environ.get("WARMUP_FAULT_HOLD_UPLOAD"):
            _hold_upload(int(os.environ["WARMUP_FAULT_HOLD_UPLOAD"]))
        if os.environ.get("WARMUP_FAULT_FAIL_MANIFEST"):
            _fail_manifests(int(os.environ["WARMUP_FAULT_FAIL_MANIFEST"]))
        if os.environ.get("WARMUP_FAULT_HOLD_HEARTBEAT"):
            _hold_heartbeat()
    if is_supervisor:
        if os.environ.get("WARMUP_FAULT_CRASH_SUPERVISOR"):
            import signal

            _touch(f"supervisor-crash-{time.time_ns()}")
            os.kill(os.getpid(), signal.SIGSEGV)
        if os.environ.get("WARMUP_FAULT_CRASH_COMPILE"):
            _crash_compile(os.environ["WARMUP_FAULT_CRASH_COMPILE"].split(","))


_install()
