"""Manifest serving under load: POST /v1/manifests for a 100-signature spec, 50 concurrent clients.

Target: p99 under 20 ms against PostgreSQL on this machine, no errors; prints the p99 against the
20 ms budget as a ratio, and the throughput.

Sets up a scratch PostgreSQL database (default: the local server at 127.0.0.1:5432, user postgres),
fills it with a job whose 100 signatures have entries (3 files each), starts `warmup serve` in a
subprocess and loads it with `wrk` (a C load generator, so that the client does not eat the
server's CPU: `apt-get install wrk`).

    python benchmarks/bench_manifests.py [--database-url postgresql://...] [--store s3://bucket/prefix]
        [--connections 50] [--duration 20]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx
import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.tiny_model import write_tiny_model
from warmup.db.engine import make_engine
from warmup.db.migrate import upgrade
from warmup.db.queue import TaskQueue
from warmup.db.records import FileRef, Keyed
from warmup.job.spec import load_spec
from warmup.planner.planning import plan_spec
from warmup.store import open_store
from warmup.toolchain.probes import current_toolchain

BUDGET_S = 0.020


def scratch_database(admin_url: str) -> str:
    name = f"warmup_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_url, autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    return re.sub(r"/[^/]*$", f"/{name}", admin_url)


def fill(database_url: str, store_url: str, spec_doc: dict, work: Path) -> tuple[dict, dict]:
    spec = load_spec(spec_doc)
    plan = plan_spec(spec)
    toolchain = current_toolchain("inductor", "cpu")
    engine = make_engine(database_url)
    queue, store = TaskQueue(engine), open_store(store_url)
    queue.submit_job(Keyed.of(spec), Keyed.of(toolchain), [Keyed.of(s) for s in plan.signatures])
    while (task := queue.claim("bench", toolchain.key(), 60)) is not None:
        refs = []
        for name in ("fxgraph", "aotautograd", "kernel.so"):
            path = work / f"{task.id}-{name}"
            path.write_bytes(f"{name} {task.signature_key}".encode() * 64)
            sha = hashlib.sha256(path.read_bytes()).hexdigest()
            refs.append(FileRef(path=f"{name}/{sha[:2]}/{sha}", sha256=sha, size=path.stat().st_size))
            store.put_file(path, sha)
        queue.complete(task.id, "bench", refs, compile_seconds=30.0)
    engine.dispose()
    return spec.model_dump(mode="json"), toolchain.model_dump(mode="json")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--database-url",
        default="postgresql://postgres@127.0.0.1:5432/postgres",
        help="admin URL of a PostgreSQL server; a scratch database is created on it",
    )
    parser.add_argument("--store", help="blob store URL (default: a temp directory)")
    parser.add_argument("--connections", type=int, default=50)
    parser.add_argument("--duration", type=int, default=20)
    parser.add_argument("--port", type=int, default=18765)
    ns = parser.parse_args()
    if shutil.which("wrk") is None:
        print("wrk is not installed: apt-get install wrk", file=sys.stderr)
        return 2

    work = Path(tempfile.mkdtemp(prefix="bench-manifests-"))
    model = write_tiny_model(work / "model")
    spec_doc = {
        "trainer": "sft",
        "model": str(model),
        "args": {
            "per_device_train_batch_size": 4,
            "max_length": 3200,
            "pad_to_multiple_of": 32,
            "torch_compile": True,
            "bf16": False,
            "dataloader_drop_last": True,
        },
        "data": {"max_tokens": 3200},
        "target": {"backend": "inductor", "device": "cpu"},
    }
    database_url = scratch_database(ns.database_url)
    store_url = ns.store or str(work / "blobs")
    upgrade(database_url)
    spec, toolchain = fill(database_url, store_url, spec_doc, work)
    signatures = len(plan_spec(load_spec(spec_doc)).signatures)

    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "warmup",
            "serve",
            "--no-worker",
            "--port",
            str(ns.port),
            "--database-url",
            database_url,
            "--store",
            store_url,
            "--data-dir",
            str(work / "data"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{ns.port}"
    body = json.dumps({"spec": spec, "toolchain": toolchain})
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                first = httpx.post(
                    f"{url}/v1/manifests", content=body, headers={"content-type": "application/json"}
                )
                break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.3)
        first.raise_for_status()
        files = len(first.json()["files"])
        script = work / "post.lua"
        script.write_text(
            'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n'
            f"wrk.body = {json.dumps(body)}\n"
        )
        result = subprocess.run(
            [
                "wrk",
                "-t2",
                f"-c{ns.connections}",
                f"-d{ns.duration}s",
                "--latency",
                "-s",
                str(script),
                f"{url}/v1/manifests",
            ],
            capture_output=True,
            text=True,
            check=True,
        )
    finally:
        server.terminate()
        server.wait(timeout=30)
    print(result.stdout)
    p99 = _latency(result.stdout, "99%")
    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", result.stdout).group(1))
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", result.stdout)
    socket_errors = re.search(r"Socket errors: (.*)", result.stdout)
    print(
        f"manifest of {signatures} signatures / {files} files, {ns.connections} clients: "
        f"p50 {_latency(result.stdout, '50%') * 1e3:.1f} ms, p99 {p99 * 1e3:.1f} ms, {rate:.0f} req/s, "
        f"non-2xx {errors.group(1) if errors else 0}, socket errors {socket_errors.group(1) if socket_errors else 0}"
    )
    print(f"budget/p99 = {BUDGET_S / p99:.2f}x (>= 1 meets the 20 ms target)")
    return 0


def _latency(text: str, percentile: str) -> float:
    value, unit = re.search(rf"{re.escape(percentile)}\s+([\d.]+)(us|ms|s)", text).groups()
    return float(value) * {"us": 1e-6, "ms": 1e-3, "s": 1.0}[unit]


if __name__ == "__main__":
    sys.exit(main())
