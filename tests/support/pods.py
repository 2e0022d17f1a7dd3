"""Helpers of the pull tests: a worker played by the queue, the worker's manifest publishing, and a
hostile service.

`play_worker` does what a worker does after compiling (reserve, upload, complete), with files laid
out as an Inductor cache lays them out, so the pull tests need no compile. `publish` writes a job's
manifest into the store with the same functions the worker uses.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from warmup.api.services import Services
from warmup.db.manifests import build_manifest, publish_manifest
from warmup.db.records import FileRef, Keyed
from warmup.job.spec import Spec
from warmup.planner.planning import plan_spec
from warmup.toolchain.model import Toolchain


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


@dataclass
class HostileService:
    """What a compromised or buggy service answers: `manifest` (raw bytes or an object) to every manifest
    request, and blobs by sha256, some of them lies (other bytes) or endless (`endless_bytes` of zeros
    for a blob the manifest says is small). Counts the blob requests and the bytes sent for them."""

    manifest: bytes | dict[str, Any]
    blobs: dict[str, bytes] = field(default_factory=dict)
    lies: dict[str, bytes] = field(default_factory=dict)
    endless: set[str] = field(default_factory=set)
    endless_bytes: int = 64 << 20
    blob_requests: int = 0
    bytes_sent: int = 0
    url: str = ""
    hold_until: Path | None = None  # blobs are answered once this file exists (a slow download)
    blob_delay_s: float = 0.0  # each blob answered this late (a pull that lasts long enough to be killed)


@contextmanager
def hostile_service(state: HostileService) -> Iterator[HostileService]:
    """Serve `state` on a local port (its `url`) until the block ends."""

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
            raw = state.manifest
            self._send(raw if isinstance(raw, bytes) else json.dumps(raw).encode(), "application/json")

        def do_GET(self) -> None:
            state.blob_requests += 1
            time.sleep(state.blob_delay_s)
            deadline = time.monotonic() + 120
            while (
                state.hold_until is not None and not state.hold_until.exists() and time.monotonic() < deadline
            ):
                time.sleep(0.05)
            key = self.path.rsplit("/", 1)[-1]
            if key in state.endless:  # the client must stop reading, not fill the disk
                self._send_endless()
                return
            body = state.lies.get(key, state.blobs.get(key))
            if body is None:
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self._send(body, "application/octet-stream")

        def _send_endless(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(state.endless_bytes))
            self.end_headers()
            chunk = b"\0" * (1 << 16)
            try:
                for _ in range(state.endless_bytes // len(chunk)):
                    self.wfile.write(chunk)
                    state.bytes_sent += len(chunk)
            except OSError:
                pass  # the client hung up: what we want
            self.close_connection = True

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    # shutdown() waits up to one poll interval (0.5 s by default) for the loop to notice
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        state.url = f"http://127.0.0.1:{server.server_address[1]}"
        yield state
    finally:
        server.shutdown()
        server.server_close()
