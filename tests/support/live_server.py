"""The API served by a real uvicorn in a thread, on a free port (clients talk real HTTP to it)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import uvicorn

from warmup.api.app import create_app
from warmup.api.services import Services


def _free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def serve(services: Services, host: str = "127.0.0.1") -> Iterator[str]:
    """Serve `services` on `host`; yields the base URL, stops the server on exit."""
    config = uvicorn.Config(
        create_app(services=services), host=host, port=_free_port(host), log_level="warning", lifespan="on"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    try:
        yield f"http://{host}:{config.port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
