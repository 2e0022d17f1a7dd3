"""The pod side of pull: parallel download, sha256 checks, atomic install, refusing hostile manifests.

Blobs are served by a real HTTP server in a thread; nothing of the project's own code is mocked. The
table of hostile manifests and blobs (sizes, hashes, symlinks, junk) is tests/reliability/test_hostile_pulls.py.
"""

from __future__ import annotations

import hashlib
import http.server
import os
import threading
from pathlib import Path

import pytest

from warmup.client.installing import install
from warmup.client.sources import HttpBlobSource
from warmup.errors import UnsafeArtifactError
from warmup.manifest import Manifest, ManifestFile, parse_manifest


class BlobServer:
    """Serves /blobs/<sha256> from a dict; `tamper` maps a sha to bytes served instead."""

    def __init__(self) -> None:
        self.blobs: dict[str, bytes] = {}
        self.tamper: dict[str, bytes] = {}
        self.requests = 0
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                server.requests += 1
                sha = self.path.rsplit("/", 1)[-1]
                body = server.tamper.get(sha, server.blobs.get(sha))
                if body is None:
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        # shutdown() waits up to one poll interval (0.5 s by default) for the loop to notice
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def add(self, data: bytes) -> str:
        sha = hashlib.sha256(data).hexdigest()
        self.blobs[sha] = data
        return sha

    def file(self, path: str, data: bytes) -> ManifestFile:
        sha = self.add(data)
        return ManifestFile(path=path, sha256=sha, size=len(data), url=f"{self.url}/blobs/{sha}")


@pytest.fixture
def server():
    blob_server = BlobServer()
    yield blob_server
    blob_server.httpd.shutdown()
    blob_server.httpd.server_close()  # shutdown() stops the loop; the listening socket needs closing too


def manifest_of(files: list[ManifestFile]) -> Manifest:
    return Manifest(
        spec_key="s",
        toolchain_key="t",
        toolchain={},
        backend="inductor",
        device="cpu",
        plan_size=len(files),
        signatures=["a"],
        files=files,
    )


def test_install_then_second_pull_downloads_nothing(server, tmp_path):
    files = [server.file(f"fxgraph/ab/k{i}/entry", os.urandom(1000 + i)) for i in range(40)]
    files.append(server.file("so/kernel.so", b"\x7fELF" + os.urandom(5000)))
    manifest = manifest_of(files)
    dest = tmp_path / "cache"

    first = install(manifest, dest, HttpBlobSource(None), parallel=8)
    assert (first.downloaded, first.skipped) == (41, 0)
    for file in files:
        assert hashlib.sha256((dest / file.path).read_bytes()).hexdigest() == file.sha256

    requests_before = server.requests
    second = install(manifest, dest, HttpBlobSource(None), parallel=8)
    assert (second.downloaded, second.skipped) == (0, 41)
    assert server.requests == requests_before


def test_a_file_changed_on_disk_is_fetched_again(server, tmp_path):
    file = server.file("a/b.bin", b"right content")
    install(manifest_of([file]), tmp_path, HttpBlobSource(None))
    (tmp_path / "a/b.bin").write_bytes(b"wrong content")
    again = install(manifest_of([file]), tmp_path, HttpBlobSource(None))
    assert again.downloaded == 1
    assert (tmp_path / "a/b.bin").read_bytes() == b"right content"


@pytest.mark.parametrize(
    "path",
    [
        "../escape",
        "/etc/passwd",
        "a/../../b",
        "a//b",
        "./a",
        "a\\b",
        "C:/x",
        "a/\x00b",
        "\uff0e\uff0e/x",
        ".warmup-index.json",
    ],
)
def test_hostile_paths_are_refused_before_anything_is_written(server, path, tmp_path):
    sha = server.add(b"payload")
    data = manifest_of([]).model_dump()
    data["files"] = [
        {"path": "innocent.bin", "sha256": sha, "size": 7, "url": f"{server.url}/blobs/{sha}"},
        {"path": path, "sha256": sha, "size": 7, "url": f"{server.url}/blobs/{sha}"},
    ]
    with pytest.raises(UnsafeArtifactError):
        parse_manifest(data)
    # Even a manifest that skipped validation is checked again by install.
    hostile = manifest_of([])
    object.__setattr__(
        hostile, "files", [ManifestFile.model_construct(path=path, sha256=sha, size=7, url=None)]
    )
    with pytest.raises(UnsafeArtifactError):
        install(hostile, tmp_path / "dest", HttpBlobSource(server.url))
    assert not (tmp_path / "dest").exists()
    assert server.requests == 0


def test_missing_blob_fails_cleanly(server, tmp_path):
    ghost = ManifestFile(path="ghost.bin", sha256="0" * 64, size=3, url=f"{server.url}/blobs/{'0' * 64}")
    with pytest.raises(Exception, match="HTTP 404"):
        install(manifest_of([ghost]), tmp_path, HttpBlobSource(None))
    assert not Path(tmp_path / "ghost.bin").exists()
