"""`warmup store check` on a local store: reading every blob back against `--quick` (sizes only).

Fills an embedded data directory (SQLite, local blobs) with one job whose entries list `--blobs` blobs of
`--mib` MiB each (random bytes, so nothing compresses), then runs the whole command in fresh processes,
the two ways alternating for `--rounds` rounds, and prints each one's wall time, the read-back's MiB/s and
the ratio. The page cache holds what fits: the read-back is measured warm after its first round, as a
store on a busy disk is not; run with more data than RAM for a cold disk's figure.

    python benchmarks/bench_store_check.py [--blobs 128] [--mib 4] [--rounds 3]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.fixtures import factories
from warmup.db.engine import make_engine
from warmup.db.migrate import upgrade
from warmup.db.queue import TaskQueue
from warmup.db.records import FileRef
from warmup.store import LocalBlobStore

FILES_PER_ENTRY = 2


def fill(data: Path, blobs: int, mib: int) -> int:
    """One job whose entries list `blobs` blobs; returns the bytes stored."""
    url = f"sqlite:///{data / 'warmup.db'}"
    upgrade(url)
    engine = make_engine(url)
    queue, store = TaskQueue(engine), LocalBlobStore(data / "blobs")
    entries = blobs // FILES_PER_ENTRY
    toolchain = factories.toolchain()
    queue.submit_job(factories.spec(), toolchain, factories.signatures(entries))
    scratch = data / "scratch"
    scratch.mkdir()
    for _ in range(entries):
        task = queue.claim("bench", toolchain.key, lease_s=600)
        assert task is not None
        refs = []
        for index in range(FILES_PER_ENTRY):
            path = scratch / f"{task.id}-{index}"
            path.write_bytes(os.urandom(mib * 1024 * 1024))
            sha = hashlib.sha256(path.read_bytes()).hexdigest()
            refs.append(
                FileRef(path=f"{task.signature_key[:8]}/{index}", sha256=sha, size=path.stat().st_size)
            )
            store.put_file(path, sha)
            path.unlink()
        queue.complete(task.id, "bench", refs, compile_seconds=1.0)
    engine.dispose()
    return entries * FILES_PER_ENTRY * mib * 1024 * 1024


def run(data: Path, *extra: str) -> float:
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "warmup", "store", "check", "--data-dir", str(data), *extra],
        capture_output=True,
        text=True,
    )
    took = time.perf_counter() - started
    if done.returncode != 0 or "none damaged" not in done.stdout:
        raise SystemExit(f"store check failed: {done.stdout}{done.stderr}")
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blobs", type=int, default=128)
    parser.add_argument("--mib", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    ns = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-store-check-") as folder:
        data = Path(folder)
        size = fill(data, ns.blobs, ns.mib)
        full, quick = [], []
        for _ in range(ns.rounds):
            full.append(run(data))
            quick.append(run(data, "--quick"))
    mib = size / 1024 / 1024
    full_s, quick_s = statistics.median(full), statistics.median(quick)
    print(f"store: {ns.blobs} blobs, {mib:.0f} MiB (local directory, SQLite); median of {ns.rounds} rounds")
    print(f"  read back   {full_s:6.2f} s  ({mib / full_s:.0f} MiB/s, the command's start included)")
    print(f"  --quick     {quick_s:6.2f} s")
    print(f"  ratio read back / quick: {full_s / quick_s:.2f}")


if __name__ == "__main__":
    main()
