"""What checking an installed cache costs: by the index (a stat per file) against by sha256 (every byte
read and hashed), the check `warmup exec`'s offline fallback makes before it trains.

A cache of random bytes is written into a temp directory and recorded in the client's index as a pull
would leave it; then `install` checks it, alternating, `--rounds` times each way (nothing to download:
the source fails any request). The files were just written, so they are in the page cache: the
figures are the hashing and the syscalls, not a cold disk's reads.

    python benchmarks/bench_verify.py [--size-gb 1.5] [--files 2000] [--rounds 3]

Prints each way's median seconds and the hash's GB/s.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from warmup.client.installing import install
from warmup.manifest import Manifest, ManifestFile


class Nowhere:
    """A blob source that fails: the check must find every file in place."""

    def open(self, file: Any) -> Any:
        raise RuntimeError(f"{file.path} was not in place")


def write_cache(root: Path, size: int, files: int) -> list[ManifestFile]:
    """`files` files of random bytes, `size` bytes in all: a few large ones (as Neuron's NEFFs and
    Inductor's kernels) and many small ones (its FX and AOT entries)."""
    entries = []
    large = size * 9 // 10 // max(1, files // 20)
    for n in range(files):
        length = large if n % 20 == 0 else max(1, size // 10 // files)
        path = f"{n % 64:02x}/f{n:05d}/entry"
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        data = os.urandom(length)
        (root / path).write_bytes(data)
        entries.append(ManifestFile(path=path, sha256=hashlib.sha256(data).hexdigest(), size=length))
    return entries


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-gb", type=float, default=1.5)
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-verify-"))
    try:
        files = write_cache(root, int(args.size_gb * 1e9), args.files)
        manifest = Manifest(
            spec_key="s", toolchain_key="t", toolchain={}, backend="inductor", device="cpu",
            plan_size=1, signatures=["a"], files=files,
        )  # fmt: skip
        total = sum(f.size for f in files)
        install(manifest, root, Nowhere(), trust_index=False)  # the index a pull leaves
        times: dict[str, list[float]] = {"index": [], "sha256": []}
        for _ in range(args.rounds):
            for way, trust in (("index", True), ("sha256", False)):
                started = time.perf_counter()
                result = install(manifest, root, Nowhere(), trust_index=trust)
                times[way].append(time.perf_counter() - started)
                assert result.skipped == len(files) and result.hashed == (0 if trust else len(files))
        index, digest = (statistics.median(times[way]) for way in ("index", "sha256"))
        print(f"{len(files)} files, {total / 1e9:.2f} GB, {os.cpu_count()} CPUs, median of {args.rounds}:")
        print(f"  by the index (stat per file): {index:.3f} s")
        print(f"  by sha256 (every byte):       {digest:.2f} s ({total / 1e9 / digest:.2f} GB/s)")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
