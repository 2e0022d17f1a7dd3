"""How long `warmup serve` (the embedded default, its in-process worker included) is away when it is
restarted: SIGTERM, then a new process on the same data directory, until `/readyz` answers 200. The
clients' retry budget (warmup/retry.py) is sized from it.

    python benchmarks/bench_restart.py [--restarts 3]

Prints the first start and each restart's time away.
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


def ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


def start(data: Path, port: int) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "warmup", "serve", "--data-dir", str(data), "--port", str(port)]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while not ready(port):
        if process.poll() is not None:
            raise SystemExit(f"warmup serve exited with {process.returncode}")
        time.sleep(0.05)
    return process


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--restarts", type=int, default=3)
    args = parser.parse_args()
    data = Path(tempfile.mkdtemp(prefix="bench-restart-"))
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    try:
        started = time.monotonic()
        process = start(data, port)
        print(f"first start: {time.monotonic() - started:.1f} s", flush=True)
        for n in range(args.restarts):
            started = time.monotonic()
            process.send_signal(signal.SIGTERM)
            process.wait()
            process = start(data, port)
            print(f"restart {n + 1}: away {time.monotonic() - started:.1f} s", flush=True)
        process.send_signal(signal.SIGTERM)
        process.wait()
    finally:
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    main()
