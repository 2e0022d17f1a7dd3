"""A SeaweedFS S3 server for the benchmarks, started as the test fixture starts it (tests/fixtures/services.py)."""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.fixtures.services import S3Server, _wait_for_s3, _weed_binary, free_port


@contextmanager
def seaweedfs(root: Path) -> Iterator[S3Server]:
    """`weed server -s3` on free ports with its data under `root`; killed on exit."""
    (root / "data").mkdir(parents=True, exist_ok=True)
    access_key, secret_key = "warmup-bench", uuid.uuid4().hex
    identity = {"name": "bench", "credentials": [{"accessKey": access_key, "secretKey": secret_key}]}
    identity["actions"] = ["Admin", "Read", "Write", "List", "Tagging"]
    (root / "s3.json").write_text(json.dumps({"identities": [identity]}))
    ports = {name: free_port(with_grpc=True) for name in ("master", "volume", "filer", "s3")}
    command = [
        _weed_binary(),
        "server",
        f"-dir={root / 'data'}",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        f"-master.port={ports['master']}",
        f"-volume.port={ports['volume']}",
        f"-filer.port={ports['filer']}",
        "-s3",
        f"-s3.port={ports['s3']}",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        f"-s3.config={root / 's3.json'}",
        "-master.volumeSizeLimitMB=1024",
        "-volume.max=100",
    ]
    log = root / "weed.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=root)
    server = S3Server(f"http://127.0.0.1:{ports['s3']}", access_key, secret_key, log=log)
    try:
        _wait_for_s3(server, process)
        yield server
    finally:
        process.kill()
        process.wait(timeout=30)
