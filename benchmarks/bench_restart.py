"""How long `warmup serve` (the embedded default, its in-process worker included) is away when it is
restarted: SIGTERM, then a new process on the same data directory, until it answers (`/healthz`) and
until it is ready (`/readyz` 200: TRL imported, the worker's toolchain computed). The clients' retry
budget (warmup/retry.py) is sized from it.

    python benchmarks/bench_restart.py [--restarts 3]

Prints the first start and each restart's time away, to the first answer and to ready.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path


def answers(port: int, path: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=1) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


def start(data: Path, port: int, since: float) -> tuple[subprocess.Popen[bytes], str]:
    """A new `warmup serve`, once ready; and how long after `since` it answered, then was ready."""
    command = [sys.executable, "-m", "warmup", "serve", "--data-dir", str(data), "--port", str(port)]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    times = []
    for path in ("/healthz", "/readyz"):
        while not answers(port, path):
            if process.poll() is not None:
                raise SystemExit(f"warmup serve exited with {process.returncode}")
            time.sleep(0.05)
        times.append(time.monotonic() - since)
    return process, f"answers after {times[0]:.1f} s, ready after {times[1]:.1f} s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--restarts", type=int, default=3)
    args = parser.parse_args()
    data = Path(tempfile.mkdtemp(prefix="bench-restart-"))
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    try:
        process, times = start(data, port, time.monotonic())
        print(f"first start: {times}", flush=True)
        for n in range(args.restarts):
            stopped = time.monotonic()
            process.send_signal(signal.SIGTERM)
            process.wait()
            process, times = start(data, port, stopped)
            print(f"restart {n + 1}: {times}", flush=True)
        process.send_signal(signal.SIGTERM)
        process.wait()
    finally:
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    main()
