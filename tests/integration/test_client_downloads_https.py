"""HTTPS downloads verify the server's certificate (a certificate made with `openssl`; the other download
tests, over plain HTTP, are tests/unit/test_client_downloads.py)."""

from __future__ import annotations

import pytest

from tests.support.blob_server import FlakyServer, manifest_of
from warmup.client.installing import install
from warmup.client.sources import HttpBlobSource
from warmup.errors import StoreError


@pytest.fixture
def server():
    flaky = FlakyServer()
    yield flaky
    flaky.close()


def test_https_downloads_verify_the_certificate(server, tmp_path, monkeypatch):
    import ssl
    import subprocess

    from warmup.client.service import tls_context as _tls_context

    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", key, "-out", cert],
        check=True, capture_output=True,
    )  # fmt: skip
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.httpd.socket = context.wrap_socket(server.httpd.socket, server_side=True)
    file = server.file("a.bin", b"over tls")
    file = file.model_copy(update={"url": file.url.replace("http://", "https://")})
    _tls_context.cache_clear()
    try:
        with pytest.raises(StoreError, match=r"not trusted.*SSL_CERT_FILE"):
            install(manifest_of([file]), tmp_path / "untrusted", HttpBlobSource(None))
        monkeypatch.setenv("SSL_CERT_FILE", str(cert))
        _tls_context.cache_clear()
        install(manifest_of([file]), tmp_path / "trusted", HttpBlobSource(None))
        assert (tmp_path / "trusted" / "a.bin").read_bytes() == b"over tls"
    finally:
        _tls_context.cache_clear()
