"""A blob server in a thread of the test's own process, with faults on demand, for the pod's downloads;
and the manifests and installed files those tests look at."""

from __future__ import annotations

import hashlib
import http.server
import threading
from pathlib import Path

from warmup.manifest import Manifest, ManifestFile


class FlakyServer:
    """Serves /blobs/<sha256>. `fail[sha]` = how many of the first requests get a 503; `cut[sha]` = how
    many of the first requests get half the body and a closed connection; `corrupt` serves wrong bytes."""

    def __init__(self) -> None:
        self.blobs: dict[str, bytes] = {}
        self.fail: dict[str, int] = {}
        self.cut: dict[str, int] = {}
        self.corrupt: set[str] = set()
        self.requests: dict[str, int] = {}
        self.headers: list[dict[str, str]] = []
        self.paths: list[str] = []  # each request's path, in the order of `headers`
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                sha = self.path.rsplit("/", 1)[-1]
                server.headers.append(dict(self.headers))
                server.paths.append(self.path)
                seen = server.requests[sha] = server.requests.get(sha, 0) + 1
                body = server.blobs.get(sha)
                if body is None:
                    return self._answer(404, b"")
                if seen <= server.fail.get(sha, 0):
                    return self._answer(503, b"busy")
                if sha in server.corrupt:
                    body = bytes(len(body))
                if seen <= server.cut.get(sha, 0):
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body[: len(body) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    return None
                return self._answer(200, body)

            def _answer(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        # shutdown() waits up to one poll interval (0.5 s by default) for the loop to notice
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def file(self, path: str, data: bytes, *, presigned: bool = True) -> ManifestFile:
        sha = hashlib.sha256(data).hexdigest()
        self.blobs[sha] = data
        url = f"{self.url}/presigned/{sha}" if presigned else None
        return ManifestFile(path=path, sha256=sha, size=len(data), url=url)

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()  # shutdown() stops the loop; the listening socket needs closing too


def manifest_of(files: list[ManifestFile]) -> Manifest:
    return Manifest(
        spec_key="s" * 64,
        toolchain_key="t" * 64,
        toolchain={},
        backend="inductor",
        device="cpu",
        plan_size=1,
        signatures=["a"],
        files=files,
    )


def installed(dest: Path) -> set[str]:
    if not dest.exists():
        return set()
    return {
        p.relative_to(dest).as_posix()
        for p in dest.rglob("*")
        if p.is_file()
        and not p.name.startswith(".warmup")
        and not p.relative_to(dest).as_posix().startswith(".warmup")
    }
