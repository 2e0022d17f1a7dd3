"""An HTTP proxy that puts faults between our code and a real S3 server, on purpose and repeatably.

Point the store's endpoint (AWS_ENDPOINT_URL) at `proxy.url`: every request goes through it to the
upstream server, with the Host header left as the client sent it (SigV4 signs it, and presigned URLs
name the proxy). Faults are deterministic counters, never random, so a failing run can be replayed:

- `fail_every = n`: request n, 2n, 3n ... fails. Faults take turns between three kinds: a 503
  SlowDown answer (the request never reaches S3), a connection reset halfway through the real
  response, and a reset before any answer after S3 did the work. Three kinds, not two: with two,
  the kind's parity locks onto clients that alternate requests (HEAD then GET), and resets would
  only ever hit the HEADs.
- `latency_s`: every request waits this long before it is forwarded (a slow or far-away S3).
- `cut_first = predicate(method, path)`: the first request it matches is cut after S3 did the work
  (e.g. a CompleteMultipartUpload whose answer is lost).
- `go_down()` / `come_up()`: the port stops listening and open connections are reset (S3 unreachable:
  connection refused), then listens again on the same port.

`requests` counts what reached the proxy and `faults` what it injected; the tests put both in the
ledger. No library installed here does this (toxiproxy, mitmproxy are not), and it is small.
"""

from __future__ import annotations

import http.client
import http.server
import socket
import socketserver
import struct
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

# Headers about one hop, not the request: the proxy frames bodies itself.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "transfer-encoding",
        "te",
        "trailer",
        "upgrade",
        "expect",
    }
)
KINDS = ("503", "reset", "cut")
SLOW_DOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate (injected by the test's fault proxy).</Message></Error>"
)


class FaultProxy:
    def __init__(self, upstream: str, *, fail_every: int = 0, latency_s: float = 0.0) -> None:
        parts = urllib.parse.urlsplit(upstream)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.fail_every = fail_every
        self.latency_s = latency_s
        # One targeted fault: the first request for which this says yes is cut after S3 did the work.
        self.cut_first: Callable[[str, str], bool] | None = None
        self.requests = 0
        self.faults = 0
        self.faults_by_kind = dict.fromkeys(KINDS, 0)
        self.fault_log: list[tuple[str, str]] = []  # (kind, HTTP method) of each fault
        self.latencies_ms: list[float] = []  # of each request through the proxy, as its client saw it
        self._lock = threading.Lock()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self.port = 0
        self.come_up()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def down(self) -> bool:
        return self._server is None

    def reset_counts(self) -> None:
        with self._lock:
            self.requests = self.faults = 0
            self.faults_by_kind = dict.fromkeys(KINDS, 0)
            self.fault_log = []
            self.latencies_ms = []

    def p99_ms(self) -> float | None:
        """The 99th percentile of the request latencies (nearest rank); None before any request."""
        ordered = sorted(self.latencies_ms)
        return round(ordered[max(0, -(-len(ordered) * 99 // 100) - 1)], 1) if ordered else None

    def come_up(self) -> None:
        """Listen (again, on the same port once it had one)."""
        if self._server is not None:
            return
        server = _Server(("127.0.0.1", self.port), _Handler)
        server.proxy = self
        self.port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name="fault-proxy", daemon=True)
        self._thread.start()

    def go_down(self) -> None:
        """Stop listening and reset every open connection: new connections are refused."""
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        for connection in list(server.connections):
            _reset(connection, wake=True)
        if self._thread is not None:
            self._thread.join(timeout=10)

    def close(self) -> None:
        self.go_down()

    def _next_fault(self, method: str, path: str) -> str | None:
        """Count a request; which fault it gets, if any."""
        with self._lock:
            self.requests += 1
            if self.cut_first is not None and self.cut_first(method, path):
                self.cut_first = None
                kind = "cut"
            elif not self.fail_every or self.requests % self.fail_every:
                return None
            else:
                kind = KINDS[self.faults % len(KINDS)]
            self.faults += 1
            self.faults_by_kind[kind] += 1
            self.fault_log.append((kind, method))
            return kind


@contextmanager
def fault_proxy(upstream: str, **options: Any) -> Iterator[FaultProxy]:
    proxy = FaultProxy(upstream, **options)
    try:
        yield proxy
    finally:
        proxy.close()


def _reset(sock: socket.socket, *, wake: bool = False) -> None:
    """Close with RST instead of FIN: the peer sees 'connection reset by peer'. With `wake`, from
    another thread: shutdown() first, or the handler's blocked read would keep the socket open."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        if wake:
            sock.shutdown(socket.SHUT_RDWR)
        sock.close()
    except OSError:
        pass


class _Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True  # come_up() binds the port go_down() just closed
    proxy: FaultProxy

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.connections: set[socket.socket] = set()
        super().__init__(*args, **kwargs)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        self.connections.add(request)
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.connections.discard(request)


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as S3 clients expect
    server: _Server
    upstream: http.client.HTTPConnection | None = None

    def do_GET(self) -> None:
        self._relay()

    do_PUT = do_POST = do_HEAD = do_DELETE = do_GET

    def log_message(self, *args: Any) -> None:
        pass

    def _relay(self) -> None:
        started = time.monotonic()
        try:
            self._relay_one()
        finally:
            self.server.proxy.latencies_ms.append((time.monotonic() - started) * 1000)

    def _relay_one(self) -> None:
        proxy = self.server.proxy
        body = self._read_body()
        if proxy._server is not self.server:  # went down while this request came in
            self.close_connection = True
            _reset(self.connection)
            return
        fault = proxy._next_fault(self.command, self.path)
        if proxy.latency_s:
            time.sleep(proxy.latency_s)
        if fault == "503":
            self._answer(503, "Slow Down", [("Content-Type", "application/xml")], SLOW_DOWN)
            return
        try:
            status, reason, headers, payload = self._forward(body)
        except (OSError, http.client.HTTPException):
            self._drop_upstream()
            self._answer(502, "Bad Gateway", [], b"")
            return
        if fault in ("reset", "cut"):  # halfway through the answer, or before any of it
            raw = self._head(status, reason, headers, payload) + (b"" if self.command == "HEAD" else payload)
            self.wfile.write(raw[: len(raw) // 2] if fault == "reset" else b"")
            self.wfile.flush()
            self.close_connection = True
            _reset(self.connection)
            return
        self._answer(status, reason, headers, payload)

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            parts = []
            while size := int(self.rfile.readline().split(b";")[0].strip(), 16):
                parts.append(self.rfile.read(size))
                self.rfile.readline()
            while self.rfile.readline() not in (b"\r\n", b"\n", b""):  # trailers
                pass
            return b"".join(parts)
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _forward(self, body: bytes) -> tuple[int, str, list[tuple[str, str]], bytes]:
        if self.upstream is None:
            self.upstream = http.client.HTTPConnection(*self.server.proxy.upstream, timeout=120)
        connection = self.upstream
        connection.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
        for name, value in self.headers.items():
            if name.lower() not in HOP_BY_HOP and name.lower() != "content-length":
                connection.putheader(name, value)
        if body or self.command in ("PUT", "POST"):
            connection.putheader("Content-Length", str(len(body)))
        connection.endheaders(body or None)
        response = connection.getresponse()
        payload = response.read()
        if response.will_close:
            self._drop_upstream()
        headers = [(k, v) for k, v in response.getheaders() if k.lower() not in HOP_BY_HOP]
        return response.status, response.reason, headers, payload

    def _drop_upstream(self) -> None:
        if self.upstream is not None:
            self.upstream.close()
            self.upstream = None

    def _head(self, status: int, reason: str, headers: list[tuple[str, str]], payload: bytes) -> bytes:
        lines = [f"HTTP/1.1 {status} {reason}"]
        lines += [f"{k}: {v}" for k, v in headers if k.lower() != "content-length" or self.command == "HEAD"]
        if self.command != "HEAD":
            lines.append(f"Content-Length: {len(payload)}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    def _answer(self, status: int, reason: str, headers: list[tuple[str, str]], payload: bytes) -> None:
        self.wfile.write(self._head(status, reason, headers, payload))
        if self.command != "HEAD":
            self.wfile.write(payload)
        self.wfile.flush()

    def finish(self) -> None:
        self._drop_upstream()
        super().finish()
