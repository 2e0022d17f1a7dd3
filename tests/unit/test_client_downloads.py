"""Downloads: transient failures are retried with backoff, real errors are not, an install is all or
nothing, the token goes to the service only, and progress is reported.

Blobs are served by a real HTTP server in a thread that can misbehave on purpose.
"""

from __future__ import annotations

import hashlib
import http.server
import os
import threading

import pytest

from tests.fixtures.factories import cpu_toolchain
from tests.support.blob_server import FlakyServer, installed, manifest_of
from warmup.client.installing import install
from warmup.client.local import INDEX_NAME
from warmup.client.service import ServiceClient
from warmup.client.sources import HttpBlobSource, StoreBlobSource
from warmup.errors import BlobIntegrityError, ServerError, StoreError
from warmup.manifest import ManifestFile
from warmup.store import LocalBlobStore


@pytest.fixture
def server():
    flaky = FlakyServer()
    yield flaky
    flaky.close()


def test_transient_failures_are_retried_until_the_file_is_right(server, tmp_path):
    busy = server.file("fxgraph/a/entry", os.urandom(5000))
    dropped = server.file("kernels/b.so", os.urandom(300_000))
    server.fail[busy.sha256] = 2  # 503, 503, then 200
    server.cut[dropped.sha256] = 1  # half the body, connection closed, then whole
    result = install(manifest_of([busy, dropped]), tmp_path, HttpBlobSource(None), parallel=2)
    assert result.downloaded == 2
    assert (server.requests[busy.sha256], server.requests[dropped.sha256]) == (3, 2)
    for file in (busy, dropped):
        assert hashlib.sha256((tmp_path / file.path).read_bytes()).hexdigest() == file.sha256


def test_a_file_that_keeps_failing_gives_up_and_installs_nothing(server, tmp_path):
    good = server.file("good.bin", b"good bytes")
    down = server.file("down.bin", b"never served")
    server.fail[down.sha256] = 99
    with pytest.raises(StoreError, match="HTTP 503") as raised:
        install(manifest_of([good, down]), tmp_path / "cache", HttpBlobSource(None), attempts=3)
    assert "nothing was installed" in str(raised.value)
    assert server.requests[down.sha256] == 3
    assert installed(tmp_path / "cache") == set()  # the good file waited in a temp file, then went away
    assert not (tmp_path / "cache" / INDEX_NAME).exists()


def test_a_missing_blob_and_a_corrupt_one_are_not_retried(server, tmp_path):
    ghost = ManifestFile(path="ghost.bin", sha256="0" * 64, size=3, url=f"{server.url}/presigned/{'0' * 64}")
    with pytest.raises(StoreError, match="HTTP 404"):
        install(manifest_of([ghost]), tmp_path / "a", HttpBlobSource(None))
    assert server.requests["0" * 64] == 1
    bad = server.file("bad.bin", b"the real content")
    server.corrupt.add(bad.sha256)
    with pytest.raises(BlobIntegrityError, match="sha256 mismatch"):
        install(manifest_of([bad]), tmp_path / "b", HttpBlobSource(None))
    assert server.requests[bad.sha256] == 1
    assert installed(tmp_path / "a") == installed(tmp_path / "b") == set()


def test_the_token_goes_to_the_service_and_never_to_a_presigned_url(server, tmp_path):
    presigned = server.file("a.bin", b"from the bucket")
    routed = server.file("b.bin", b"from the api", presigned=False)
    source = HttpBlobSource(server.url, {"Authorization": "Bearer wu_secret"})
    install(manifest_of([presigned, routed]), tmp_path, source, parallel=1)
    sent = {h.get("Authorization") for h in server.headers}
    assert sent == {None, "Bearer wu_secret"} and len(server.headers) == 2
    # which request carried it: the service's route, not the presigned URL
    by_path = {path: h.get("Authorization") for path, h in zip(server.paths, server.headers, strict=True)}
    assert by_path == {
        f"/presigned/{presigned.sha256}": None,
        f"/v1/blobs/{routed.sha256}": "Bearer wu_secret",
    }


def test_the_api_client_follows_no_redirect_so_its_token_stays_with_the_service(server):
    class Redirect(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(302)
            self.send_header("Location", f"{server.url}/blobs/elsewhere")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    redirecting = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Redirect)
    # shutdown() waits up to one poll interval (0.5 s by default) for the loop to notice
    threading.Thread(target=redirecting.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        service = ServiceClient(f"http://127.0.0.1:{redirecting.server_address[1]}", token="wu_secret")
        with pytest.raises(ServerError, match="HTTP 302"):
            service.job("j1")
    finally:
        redirecting.shutdown()
        redirecting.server_close()
    assert server.headers == []  # the redirect's target was never asked, with or without the token


def test_progress_counts_files_and_bytes_up_to_the_total(server, tmp_path):
    files = [server.file(f"f{i}.bin", os.urandom(1000 * (i + 1))) for i in range(5)]
    seen = []
    install(manifest_of(files), tmp_path, HttpBlobSource(None), parallel=2, on_progress=seen.append)
    last = seen[-1]
    assert (last.files_done, last.files_total) == (5, 5)
    assert last.bytes_done == last.bytes_total == sum(f.size for f in files)
    assert [p.files_done for p in seen] == sorted(p.files_done for p in seen)


def test_install_from_a_store_streams_and_verifies(tmp_path):
    store = LocalBlobStore(tmp_path / "store")
    sources = []
    for index in range(3):
        path = tmp_path / f"src{index}"
        path.write_bytes(os.urandom(3 * 1024 * 1024 + index))  # several chunks each
        store.put_file(path)
        sources.append(path)
    files = [
        ManifestFile(
            path=f"dir/{p.name}", sha256=hashlib.sha256(p.read_bytes()).hexdigest(), size=p.stat().st_size
        )
        for p in sources
    ]
    result = install(manifest_of(files), tmp_path / "cache", StoreBlobSource(store))
    assert result.downloaded == 3 and installed(tmp_path / "cache") == {f.path for f in files}
    (store.root / "blobs" / files[0].sha256[:2] / files[0].sha256).write_bytes(b"tampered")
    with pytest.raises(BlobIntegrityError):
        install(manifest_of(files), tmp_path / "other", StoreBlobSource(store))
    assert installed(tmp_path / "other") == set()


def test_a_store_without_this_toolchains_manifest_names_the_closest_difference(tmp_path):
    from warmup.client.pulling import bucket_manifest
    from warmup.db.manifests import publish_manifest
    from warmup.errors import NotWarmedError, ToolchainMismatchError

    ours = cpu_toolchain()
    store = LocalBlobStore(tmp_path / "store")
    with pytest.raises(NotWarmedError, match="--wait"):
        bucket_manifest(store, "s" * 64, ours)
    for theirs in (
        ours.model_copy(update={"torch": "2.14.1", "cpu_isa": "avx2"}),
        ours.model_copy(update={"torch": "2.14.1"}),
    ):
        published = manifest_of([]).model_copy(
            update={"toolchain_key": theirs.key(), "toolchain": theirs.model_dump(mode="json")}
        )
        publish_manifest(store, published)
    with pytest.raises(ToolchainMismatchError) as raised:
        bucket_manifest(store, "s" * 64, ours)
    assert raised.value.differences == {"torch": ("2.13.0+cpu", "2.14.1")}
    publish_manifest(store, manifest_of([]).model_copy(update={"toolchain_key": ours.key()}))
    assert bucket_manifest(store, "s" * 64, ours).toolchain_key == ours.key()


def test_downloads_go_through_the_proxy_the_environment_names(server, tmp_path, monkeypatch):
    from warmup.client.service import proxies as _proxies

    monkeypatch.setenv("HTTP_PROXY", server.url)  # the test server answers as a proxy would
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    _proxies.cache_clear()
    try:
        file = server.file("a.bin", b"through the proxy")
        file = file.model_copy(
            update={"url": f"http://blobs.invalid/presigned/{file.sha256}"}
        )  # no such host
        install(manifest_of([file]), tmp_path, HttpBlobSource(None))
        assert (tmp_path / "a.bin").read_bytes() == b"through the proxy"
    finally:
        _proxies.cache_clear()


def test_a_kept_alive_connection_the_server_closed_is_opened_again_at_once(tmp_path):
    """A server that closes each connection after one answer, without saying so: the next download on the
    kept-alive connection fails, and is sent again at once on a new one, not counted as a failed attempt."""
    blobs = {hashlib.sha256(data).hexdigest(): data for data in (b"first blob", b"second blob")}
    connections: list[int] = []

    class OneAnswerEach(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as far as the client can tell

        def setup(self) -> None:
            super().setup()
            connections.append(1)

        def do_GET(self) -> None:
            data = blobs[self.path.rsplit("/", 1)[-1]]
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            self.close_connection = True  # closed after the answer, without a Connection: close

        def log_message(self, *args: object) -> None:
            pass

    closing = http.server.ThreadingHTTPServer(("127.0.0.1", 0), OneAnswerEach)
    threading.Thread(target=closing.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    url = f"http://127.0.0.1:{closing.server_address[1]}"
    files = [
        ManifestFile(path=f"f{i}.bin", sha256=sha, size=len(data), url=f"{url}/presigned/{sha}")
        for i, (sha, data) in enumerate(blobs.items())
    ]
    try:
        result = install(manifest_of(files), tmp_path, HttpBlobSource(None), parallel=1, attempts=1)
    finally:
        closing.shutdown()
        closing.server_close()
    assert result.downloaded == 2 and len(connections) == 2
    assert {(tmp_path / f.path).read_bytes() for f in files} == set(blobs.values())
