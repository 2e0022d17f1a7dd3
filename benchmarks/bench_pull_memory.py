"""Memory: pulling a 2 GB blob streams it; the pulling process stays under 200 MB resident.

A 2 GB blob of random bytes is uploaded into a SeaweedFS bucket started here, with a manifest that
lists it; then fresh processes pull it into an empty directory, and each one's peak resident set
(its VmHWM in /proc) is measured against the same process pulling a 1 KB blob:

- from the bucket (`warmup.client.pull(..., source="s3://...")`: it signs the GET itself and streams it
  over http.client), toolchain given;
- through a presigned URL, as a pull through the API does (`install`, streaming over http.client);
- the whole `warmup pull --from` command, which also imports torch to compute the toolchain.

    python benchmarks/bench_pull_memory.py [--size-gb 2]

Prints each peak and the ratio of the largest transfer peak to the 200 MB budget.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.seaweed import seaweedfs
from tests.support.tiny_model import write_tiny_model
from warmup.db.manifests import publish_manifest
from warmup.job.spec import load_spec
from warmup.manifest import Manifest, ManifestFile
from warmup.store import S3BlobStore, sha256_file
from warmup.toolchain.probes import current_toolchain

BUDGET_MB = 200
BUCKET = "bench"
FROM_BUCKET = """
import json, sys
from warmup.client.pulling import pull
spec, dest, source, toolchain = sys.argv[1:]
r = pull(spec, dest, source=source, toolchain=json.load(open(toolchain)))
print(json.dumps({"bytes": r.bytes_downloaded, "seconds": r.seconds}))
"""
PRESIGNED = """
import json, sys
from warmup.client.installing import install
from warmup.client.sources import HttpBlobSource
from warmup.manifest import parse_manifest
manifest, dest = sys.argv[1:]
r = install(parse_manifest(json.load(open(manifest))), dest, HttpBlobSource(None))
print(json.dumps({"bytes": r.bytes_downloaded, "seconds": r.seconds}))
"""


def peak_rss(command: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(peak resident MB of the process, wall seconds), from its VmHWM in /proc, read every 10 ms.

    Not getrusage's ru_maxrss: Linux keeps that high-water mark across fork and exec, so a child of
    this process (torch imported, several hundred MB) would report this process's size. VmHWM belongs
    to the process's own memory map, which exec replaces; it only rises, so the last reading before
    the process ends is its peak (within 10 ms of growth, and a streaming pull does not grow)."""
    started = time.perf_counter()
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    status, peak_kb = Path(f"/proc/{process.pid}/status"), 0
    while process.poll() is None:
        try:
            for line in status.read_text().splitlines():
                if line.startswith("VmHWM:"):
                    peak_kb = max(peak_kb, int(line.split()[1]))
        except OSError:
            pass
        time.sleep(0.01)
    seconds = time.perf_counter() - started
    if process.returncode != 0:
        raise SystemExit(f"{command[:4]} failed:\n{process.stderr.read().decode()[-4000:]}")
    return peak_kb / 1024, seconds


def random_file(path: Path, size: int) -> None:
    chunk = 16 << 20
    with path.open("wb") as out:
        for start in range(0, size, chunk):
            out.write(os.urandom(min(chunk, size - start)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-gb", type=float, default=2.0)
    ns = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-pull-memory-"))
    spec_path = work / "job.json"
    spec_path.write_text(
        json.dumps(
            {
                "trainer": "sft",
                "model": str(write_tiny_model(work / "model")),
                "args": {"torch_compile": True},
                "target": {"backend": "inductor", "device": "cpu"},
            }
        )
    )
    spec = load_spec(spec_path)
    toolchain = current_toolchain(spec.target.backend, spec.target.device)
    (work / "toolchain.json").write_text(json.dumps(toolchain.model_dump(mode="json")))
    size = int(ns.size_gb * (1 << 30))
    blobs = {"big": work / "big.bin", "tiny": work / "tiny.bin"}
    print(f"writing a {size / 1e9:.2f} GB blob ...", flush=True)
    random_file(blobs["big"], size)
    random_file(blobs["tiny"], 1024)
    hashes = {name: sha256_file(path) for name, path in blobs.items()}

    rows = []
    try:
        with seaweedfs(work / "seaweed") as s3:
            os.environ.update(s3.env())
            env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
            s3.client().create_bucket(Bucket=BUCKET)
            for name, path in blobs.items():
                print(f"uploading {name} ...", flush=True)
                store = S3BlobStore(BUCKET, name, endpoint_url=s3.endpoint_url)
                store.put_file(path, hashes[name][0])
                files = [ManifestFile(path=f"{name}/blob.bin", sha256=hashes[name][0], size=hashes[name][1])]
                manifest = Manifest(
                    spec_key=spec.key(),
                    toolchain_key=toolchain.key(),
                    toolchain=toolchain.model_dump(mode="json"),
                    backend="inductor",
                    device="cpu",
                    plan_size=1,
                    signatures=["0" * 64],
                    files=files,
                )
                publish_manifest(store, manifest)
                presigned = manifest.model_copy(
                    update={
                        "files": [files[0].model_copy(update={"url": store.presigned_url(files[0].sha256)})]
                    }
                )
                (work / f"{name}-presigned.json").write_text(json.dumps(presigned.model_dump(mode="json")))
                source = f"s3://{BUCKET}/{name}"
                commands = {
                    "pull from the bucket (library)": [
                        sys.executable, "-c", FROM_BUCKET, str(spec_path), "{dest}", source, str(work / "toolchain.json"),
                    ],
                    "install from a presigned URL (API path)": [
                        sys.executable, "-c", PRESIGNED, str(work / f"{name}-presigned.json"), "{dest}",
                    ],
                    "warmup pull --from (whole command)": [
                        sys.executable, "-m", "warmup", "pull", str(spec_path), "--from", source, "--dest", "{dest}",
                    ],
                }  # fmt: skip
                for label, command in commands.items():
                    dest = work / "dest"
                    shutil.rmtree(dest, ignore_errors=True)
                    peak, seconds = peak_rss([part.replace("{dest}", str(dest)) for part in command], env)
                    assert sha256_file(dest / f"{name}/blob.bin")[0] == hashes[name][0]
                    rows.append((label, name, peak, seconds))
                    shutil.rmtree(dest, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print(f"\npeak resident memory of the pulling process (blob: {size / 1e9:.2f} GB vs 1 KB)")
    peaks = {(label, name): (peak, seconds) for label, name, peak, seconds in rows}
    for label in dict.fromkeys(label for label, *_ in rows):
        big, seconds = peaks[(label, "big")]
        tiny, _ = peaks[(label, "tiny")]
        print(
            f"  {label:<42} {big:6.0f} MB with the big blob, {tiny:6.0f} MB with the tiny one "
            f"(+{big - tiny:.0f} MB); {size / 1e6 / seconds:.0f} MB/s"
        )
    transfer = max(
        peak for (label, name), (peak, _) in peaks.items() if name == "big" and "command" not in label
    )
    print(
        f"\nratio largest transfer peak / budget: {transfer:.0f} / {BUDGET_MB} MB = {transfer / BUDGET_MB:.2f} (target < 1)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
