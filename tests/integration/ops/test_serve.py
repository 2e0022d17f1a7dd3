"""`warmup serve` as the API image runs it: a real process configured from WARMUP_* variables that
answers /healthz and /readyz (and the images' health checks), logs one JSON object a line, and never
logs a token or a password.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.fixtures.services import free_port
from tests.integration.ops.test_deploy import DOCKER, exec_form, instructions

ROOT = Path(__file__).resolve().parents[3]
PASSWORD = "Sup3r-S3cret-pw"
pytestmark = pytest.mark.timeout(180)


@dataclass
class Served:
    url: str
    port: int
    env: dict[str, str]
    process: subprocess.Popen[str]
    log: Path

    def stop(self) -> str:
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(timeout=30)
        return self.log.read_text()


@pytest.fixture
def served(pg_url: str, tmp_path: Path) -> Iterator[Served]:
    """`python -m warmup serve --no-worker` on PostgreSQL, with a password in the database URL
    (the test server trusts local connections, so it is accepted and ignored)."""
    port = free_port()
    database_url = pg_url.replace("postgres@", f"postgres:{PASSWORD}@", 1)
    assert PASSWORD in database_url
    env = {
        **os.environ,
        "WARMUP_DATABASE_URL": database_url,
        "WARMUP_STORE_URL": str(tmp_path / "blobs"),
        "WARMUP_DATA_DIR": str(tmp_path / "data"),
        "WARMUP_PORT": str(port),
        "WARMUP_AUTH": "required",
        "WARMUP_LOG_FORMAT": "json",
    }
    log = tmp_path / "serve.log"
    with open(log, "w") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "warmup", "serve", "--no-worker"],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while True:
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:  # it answers before it is ready
                break
        except httpx.TransportError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"warmup serve did not start:\n{log.read_text()[-4000:]}", pytrace=False)
        time.sleep(0.3)
    served = Served(url, port, env, process, log)
    yield served
    if process.poll() is None:
        process.kill()
        process.wait(timeout=30)


def test_serve_answers_probes_and_health_checks(served: Served) -> None:
    assert httpx.get(f"{served.url}/healthz").json() == {"status": "ok"}
    assert httpx.get(f"{served.url}/readyz").json() == {"status": "ready"}
    # The image's HEALTHCHECK and the compose API health check, pointed at this port.
    checks = {
        "api.Dockerfile HEALTHCHECK": json.loads(
            instructions("api.Dockerfile", "HEALTHCHECK")[0].split("CMD", 1)[1]
        ),
    }
    import yaml

    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    checks["compose api healthcheck"] = compose["services"]["api"]["healthcheck"]["test"][1:]
    for where, argv in checks.items():
        argv = [arg.replace("127.0.0.1:8000", f"127.0.0.1:{served.port}") for arg in argv]
        assert argv[0] == "python", where
        result = subprocess.run([sys.executable, *argv[1:]], capture_output=True, text=True, timeout=30)
        assert result.returncode == 0, f"{where}: {result.stderr}"
    # A health check fails when nothing answers.
    dead = [sys.executable, *checks["compose api healthcheck"][1:]]
    dead = [arg.replace("127.0.0.1:8000", f"127.0.0.1:{served.port + 1}") for arg in dead]
    assert subprocess.run(dead, capture_output=True, timeout=30).returncode != 0
    assert exec_form("api.Dockerfile", "ENTRYPOINT")[1:] == ["serve", "--host", "0.0.0.0", "--no-worker"]


def test_logs_are_json_and_hold_no_secret(served: Served) -> None:
    made = subprocess.run(
        [sys.executable, "-m", "warmup", "token", "create", "--scope", "read", "--name", "status"],
        cwd=ROOT,
        env=served.env,  # the same WARMUP_DATABASE_URL as the server
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip()
    assert token.startswith("wu_")

    assert httpx.get(f"{served.url}/v1/warmups").status_code == 401  # auth required, from WARMUP_AUTH
    headers = {"Authorization": f"Bearer {token}"}
    assert httpx.get(f"{served.url}/v1/warmups", headers=headers).status_code == 200
    page = httpx.get(f"{served.url}/", params={"token": token})
    assert page.status_code == 200 and "trl-warmup" in page.text
    assert page.headers["referrer-policy"] == "no-referrer" and page.headers["cache-control"] == "no-store"
    assert httpx.get(f"{served.url}/", params={"token": "wu_not-a-real-token-at-all"}).status_code == 401
    assert httpx.get(f"{served.url}/metrics").status_code == 200  # public by default

    output = served.stop()
    assert token not in output and token[3:] not in output
    assert PASSWORD not in output
    assert "wu_not-a-real-token-at-all" not in output
    lines = output.splitlines()
    # The start-up banner names the database, without its password.
    banner = next(line for line in lines if line.startswith("trl-warmup on "))
    assert "postgres:***@127.0.0.1" in banner and f"127.0.0.1:{served.port}" in banner
    records = [json.loads(line) for line in lines if line.startswith("{")]
    assert records and all({"ts", "level", "logger", "msg"} <= set(r) for r in records)
    access = [r["msg"] for r in records if r["logger"] == "uvicorn.access"]
    assert any('"GET /?token=*** HTTP/1.1" 200' in message for message in access), access
    assert any('"GET /v1/warmups HTTP/1.1" 401' in message for message in access), access


def test_worker_entrypoint_runs_from_the_environment(sqlite_url: str, tmp_path: Path) -> None:
    """The compose worker's command line, configured only by WARMUP_* variables as in the stack; with
    nothing queued it registers, says it is ready, and exits (--exit-when-idle)."""
    import yaml

    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    argv = exec_form("worker.Dockerfile", "ENTRYPOINT") + compose["services"]["worker"]["command"]
    env = {
        **os.environ,
        "WARMUP_DATABASE_URL": sqlite_url,
        "WARMUP_STORE_URL": str(tmp_path / "blobs"),
        "WARMUP_LOG_FORMAT": "json",
    }
    result = subprocess.run(
        [sys.executable, "-m", "warmup", *argv[1:], "--exit-when-idle"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    ready = [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
    assert any(r["logger"] == "warmup.worker" and "ready for inductor/cpu" in r["msg"] for r in ready), ready
    helps = subprocess.run(
        [sys.executable, "-m", "warmup", "worker", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert helps.returncode == 0 and "--concurrency" in helps.stdout


# `warmup serve` with its worker's toolchain held back until the test lets it through (the gate file).
GATED_SERVE = """
import sys, time
from pathlib import Path

import warmup.worker.loop as loop

gate, computing = Path(sys.argv[1]), loop.host_toolchain


def gated(*args, **kwargs):
    while not gate.exists():
        time.sleep(0.05)
    return computing(*args, **kwargs)


loop.host_toolchain = gated
from warmup.cli import main

sys.exit(main(sys.argv[2:]))
"""


def test_serve_answers_while_its_worker_still_computes_its_toolchain(tmp_path: Path) -> None:
    """The embedded default listens at once: /healthz answers and /readyz says what it still does, until
    the worker has its toolchain; then /readyz is ready and the worker registered."""
    port, gate = free_port(), tmp_path / "gate"
    log = tmp_path / "serve.log"
    serve = ["serve", "--data-dir", str(tmp_path / "data"), "--port", str(port)]
    with open(log, "w") as out:
        process = subprocess.Popen(
            [sys.executable, "-c", GATED_SERVE, str(gate), *serve],
            cwd=ROOT,
            env={**os.environ, "WARMUP_AUTH": "off"},
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                readiness = httpx.get(f"{url}/readyz", timeout=5)
                if readiness.json()["problems"] == ["starting: computing the worker's toolchain"]:
                    break
                assert readiness.json()["problems"] == ["starting: importing TRL and torch"]
            except httpx.TransportError:
                pass
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()[-4000:]
            time.sleep(0.2)
        assert readiness.status_code == 503 and readiness.json()["status"] == "starting"
        assert httpx.get(f"{url}/healthz").json() == {"status": "ok"}
        assert httpx.get(f"{url}/v1/warmups").json() == []  # the API answers too
        assert "warmup_workers{" not in httpx.get(f"{url}/metrics").text  # no worker registered yet
        gate.touch()
        while httpx.get(f"{url}/readyz", timeout=5).status_code != 200:
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()[-4000:]
            time.sleep(0.2)
        while "warmup_workers{" not in httpx.get(f"{url}/metrics").text:  # it registers as its loop starts
            assert time.monotonic() < deadline, log.read_text()[-4000:]
            time.sleep(0.2)
        assert httpx.get(f"{url}/readyz").json() == {"status": "ready"}
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)


def test_serve_whose_worker_cannot_compute_its_toolchain_stops_and_says_why(tmp_path: Path) -> None:
    """The worker's toolchain is computed once the service listens: when that fails, the service stops and
    the command fails with the error, as it did when the toolchain came first."""
    broken = (
        "import sys\n"
        "import warmup.worker.loop as loop\n"
        "from warmup.errors import BackendUnavailableError\n"
        "def no_toolchain(*args, **kwargs):\n"
        "    raise BackendUnavailableError('no compiler here (the test says so)')\n"
        "loop.host_toolchain = no_toolchain\n"
        "from warmup.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    serve = ["serve", "--data-dir", str(tmp_path / "data"), "--port", str(free_port())]
    done = subprocess.run(
        [sys.executable, "-c", broken, *serve], cwd=ROOT, capture_output=True, text=True, timeout=150
    )
    assert done.returncode != 0
    assert "error: no compiler here (the test says so)" in done.stderr
