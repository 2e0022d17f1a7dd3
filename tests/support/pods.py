"""Helpers of the pull tests: a worker played by the queue, the worker's manifest publishing, and a
hostile server.

`play_worker` does what a worker does after compiling (reserve, upload, complete), with files laid
out as an Inductor cache lays them out, so the pull tests need no compile. `publish` writes a job's
manifest into the store with the same functions the worker uses.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from api.services import Services
from warmup.db.manifests import build_manifest, publish_manifest
from warmup.db.records import FileRef, Keyed
from warmup.planner import plan_spec
from warmup.spec import Spec
from warmup.toolchain import Toolchain


def play_worker(
    services: Services, toolchain_key: str, scratch: Path, *, tasks: int | None = None, size: int = 3000
) -> int:
    """Claim tasks and complete each with three files (FX entry, AOT entry, kernel); returns how many."""
    scratch.mkdir(parents=True, exist_ok=True)
    done = 0
    while tasks is None or done < tasks:
        task = services.queue.claim("test-worker", toolchain_key, lease_s=60)
        if task is None:
            break
        key = task.signature_key
        refs = []
        for relative in (
            f"fxgraph/{key[:2]}/f{key[:20]}/entry",
            f"aotautograd/a{key[:20]}/entry",
            f"{key[:2]}/c{key[:20]}.so",
        ):
            path = scratch / hashlib.sha256(relative.encode()).hexdigest()
            path.write_bytes((relative.encode() + b"\n") * (size // (len(relative) + 1) + 1))
            sha = hashlib.sha256(path.read_bytes()).hexdigest()
            refs.append((path, FileRef(path=relative, sha256=sha, size=path.stat().st_size)))
        services.queue.reserve_blobs([ref for _, ref in refs])
        for path, ref in refs:
            services.store.put_file(path, ref.sha256)
        services.queue.complete(task.id, "test-worker", [ref for _, ref in refs], compile_seconds=1.5)
        done += 1
    return done


def publish(services: Services, spec: Spec, toolchain: Toolchain) -> None:
    """Publish the job's complete manifest into the store, as the worker does when a job is ready."""
    job_id = services.repository.find_job(spec.key(), toolchain.key())
    status = services.repository.job_status(job_id)
    assert status is not None and status.state == "ready", status
    manifest = build_manifest(
        services.repository,
        None,
        spec_key=spec.key(),
        toolchain=Keyed.of(toolchain),
        signature_keys=[s.key for s in status.signatures],
        plan_size=len(plan_spec(spec).signatures),
    )
    publish_manifest(services.store, manifest)


def hostile_manifest(spec: Spec, toolchain: Toolchain, path: str, blob: bytes) -> dict[str, Any]:
    """A manifest for (spec, toolchain) whose one file would land at `path`."""
    return {
        "spec_key": spec.key(),
        "toolchain_key": toolchain.key(),
        "toolchain": toolchain.model_dump(mode="json"),
        "backend": toolchain.backend,
        "device": toolchain.device,
        "plan_size": 1,
        "signatures": ["0" * 64],
        "missing": [],
        "files": [{"path": path, "sha256": hashlib.sha256(blob).hexdigest(), "size": len(blob), "url": None}],
    }


@contextmanager
def hostile_server(manifest: dict[str, Any], blob: bytes) -> Iterator[Any]:
    """A server that answers every manifest request with `manifest` and every blob with `blob`:
    what a compromised or buggy service could send. Counts the blob requests it gets."""
    counts = {"blobs": 0}

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _send(self, body: bytes, kind: str) -> None:
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self._send(json.dumps(manifest).encode(), "application/json")

        def do_GET(self) -> None:
            counts["blobs"] += 1
            self._send(blob, "application/octet-stream")

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        server.url = f"http://127.0.0.1:{server.server_address[1]}"  # type: ignore[attr-defined]
        server.counts = counts  # type: ignore[attr-defined]
        yield server
    finally:
        server.shutdown()
