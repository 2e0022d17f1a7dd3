"""Load: 200 concurrent pods pulling the same warmed cache and 50 concurrent submissions, on a fresh server.

Prints errors (target: 0), p50/p95/p99 latencies of the manifest requests, of whole pulls and of the
submissions, throughput and the server's CPU time. The scenario is tests/support/load.py (the
reliability test tests/reliability/test_load.py runs the same one and asserts its outcomes):

- the real service, `warmup serve --no-worker` (uvicorn, one process), started fresh for the burst;
- a throwaway database in the PostgreSQL at 127.0.0.1:5432 (or `--database sqlite`: the embedded
  default's SQLite file);
- blobs in a local directory, served by the API's blob route (default), or `--store s3`: a bucket of
  a SeaweedFS server started here, the manifest handing out presigned URLs;
- a warmed cache of one 8-signature SFT spec (30 files a signature by default), recorded through the
  queue as workers record it;
- pods as threads in a few processes, each pod its own `warmup.client.pull` with its own HTTP client,
  connections and cache directory; submissions as threads of this process, each its own client.

    python benchmarks/bench_load.py [--pods 200] [--submissions 50] [--duplicates 10]
        [--store local|s3] [--database postgres|sqlite] [--files-per-signature 30]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.fixtures.services import PostgresServer
from tests.support.load import LoadConfig, installed_mismatches, run_load
from tests.support.seaweed import seaweedfs
from tests.support.tiny_model import write_tiny_model


@contextlib.contextmanager
def database(kind: str, work: Path) -> Iterator[str]:
    if kind == "sqlite":
        yield f"sqlite:///{work / 'warmup.db'}"
        return
    server = PostgresServer("127.0.0.1", 5432)
    name = f"warmup_bench_load_{uuid.uuid4().hex[:8]}"
    url = server.create_database(name)
    try:
        yield url
    finally:
        server.drop_database(name)


@contextlib.contextmanager
def store(kind: str, work: Path) -> Iterator[tuple[str, dict[str, str]]]:
    if kind == "local":
        yield str(work / "blobs"), {}
        return
    with seaweedfs(work / "seaweed") as s3:
        s3.client().create_bucket(Bucket="load")
        os.environ.update(s3.env())  # this process publishes the cache into the bucket too
        yield "s3://load/warmup", s3.env()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=200)
    parser.add_argument("--submissions", type=int, default=50, help="distinct specs submitted at once")
    parser.add_argument(
        "--duplicates", type=int, default=10, help="repeats of those specs, in the same burst"
    )
    parser.add_argument("--store", choices=["local", "s3"], default="local")
    parser.add_argument("--database", choices=["postgres", "sqlite"], default="postgres")
    parser.add_argument("--files-per-signature", type=int, default=30)
    parser.add_argument("--pod-processes", type=int, default=4)
    parser.add_argument("--parallel", type=int, default=4, help="download threads per pod")
    parser.add_argument("--log-level", default="warning", help="the server's log level")
    ns = parser.parse_args()
    config = LoadConfig(
        pods=ns.pods,
        submissions=ns.submissions,
        duplicates=ns.duplicates,
        files_per_signature=ns.files_per_signature,
        pod_processes=ns.pod_processes,
        pod_parallel=ns.parallel,
        log_level=ns.log_level,
    )
    work = Path(tempfile.mkdtemp(prefix="bench-load-"))
    try:
        model = write_tiny_model(work / "model")
        with database(ns.database, work) as database_url, store(ns.store, work) as (store_url, env):
            result = run_load(
                config, work=work, model=model, database_url=database_url, store_url=store_url, env=env
            )
        broken = [
            p.pod for p in result.pods if not p.error and installed_mismatches(Path(p.dest), result.expected)
        ]
        print(f"\nload: database {ns.database}, store {ns.store}, server: one uvicorn process")
        print(result.table())
        print(f"pods whose installed cache differs from the published one: {len(broken)}")
        for error in result.errors[:10]:
            print(f"  error: {error}")
        return 1 if result.errors or broken else 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
