"""What killed processes leave in the work and blob folders goes when `warmup serve` starts; what live ones
hold stays. The writers here are processes that took the same locks the worker and the store take (a
task folder, an upload's temp file) and were killed with SIGKILL, or are still running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest

from tests.fixtures.services import free_port

pytestmark = pytest.mark.timeout(300)

HOLDER = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    from warmup.leftovers import locked_temp_dir, locked_temp_file
    work, blobs = Path(sys.argv[1]), Path(sys.argv[2])
    _, folder = locked_temp_dir(work, "warmup-task-1-")
    (folder / "rehearsal").mkdir()
    (folder / "rehearsal" / "kernel.so").write_bytes(b"k" * 100_000)
    fd, upload = locked_temp_file(blobs, ".tmp-")
    os.write(fd, b"half a blob")
    print(folder, upload, flush=True)
    time.sleep(600)
    """
)


def hold(work: Path, blobs: Path) -> tuple[subprocess.Popen[str], Path, Path]:
    process = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(work), str(blobs)], stdout=subprocess.PIPE, text=True
    )
    assert process.stdout is not None
    folder, upload = process.stdout.readline().split()
    return process, Path(folder), Path(upload)


def test_serve_removes_what_killed_processes_left(tmp_path: Path) -> None:
    data = tmp_path / "data"
    work, blobs = data / "work", data / "blobs" / "blobs"  # the store's root is data/blobs
    work.mkdir(parents=True)
    blobs.mkdir(parents=True)
    killed, killed_folder, killed_upload = hold(work, blobs)
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    live, live_folder, live_upload = hold(work, blobs)
    port, log = free_port(), tmp_path / "serve.log"
    server = subprocess.Popen(
        [sys.executable, "-m", "warmup", "serve", "--data-dir", str(data), "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=log.open("w"),
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        deadline = time.monotonic() + 240
        while killed_folder.exists() or killed_upload.exists():
            assert server.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.3)
        assert httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=30).status_code == 200
        assert live_folder.is_dir() and live_upload.exists()  # a live writer's: kept
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(timeout=60)
        live.kill()
        live.wait()
    stderr = log.read_text()
    assert (
        f"removed 1 upload temp files in {blobs.parent} left by killed processes (11 bytes): {killed_upload.name}"
        in stderr
    )
    assert (
        f"removed 1 task folders in {work} left by killed processes (100000 bytes): {killed_folder.name}"
        in stderr
    )
