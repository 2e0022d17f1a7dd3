"""`warmup submit` against a running `warmup serve`: the exit codes CI branches on, and the progress it shows.

The server is the real embedded setup in a subprocess; its in-process worker is turned off and the
tests run `warmup worker` processes when they want work done.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from tests.fixtures.factories import one_signature_sft
from tests.support.tiny_model import write_tiny_model


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    data = tmp_path_factory.mktemp("serve")
    port = free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "warmup",
            "serve",
            "--data-dir",
            str(data),
            "--port",
            str(port),
            "--no-worker",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            if httpx.get(f"{url}/readyz").status_code == 200:
                break
        except httpx.TransportError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"warmup serve did not start: {process.stderr.read().decode()[-3000:]}")
        time.sleep(0.3)
    yield url, data
    process.terminate()
    process.wait(timeout=30)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("model"))


def write_spec(path: Path, model: Path | str, **overrides) -> Path:
    spec = one_signature_sft(model)
    spec.update(overrides)
    path.write_text(yaml.safe_dump(spec))
    return path


def submit(
    url: str, spec: Path, *extra: str, timeout: float = 300, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "warmup", "submit", str(spec), "--server", url, *extra],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        cwd=cwd,
    )


def test_invalid_spec_exits_2_with_one_line(server, model_dir, tmp_path):
    url, _ = server
    spec = write_spec(tmp_path / "bad.yaml", model_dir, args={"max_lenght": 5})
    done = submit(url, spec)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith("error: invalid spec: args.max_lenght")
    assert "Traceback" not in done.stderr


def test_relative_paths_are_read_where_submit_runs(server, model_dir, tmp_path):
    """As `trl` reads them, from the job's directory, not the service's; a path missing there is refused by the
    service naming its machine and where it looked."""
    import shutil

    url, _ = server
    job = tmp_path / "job"
    shutil.copytree(model_dir, job / "tiny-qwen")
    spec = write_spec(job / "job.yaml", "./tiny-qwen")
    done = submit(url, Path(spec.name), cwd=job)
    assert done.returncode == 0, done.stderr
    missing = write_spec(job / "missing.yaml", "./no-such-model")
    done = submit(url, Path(missing.name), cwd=job)
    assert done.returncode == 2, done.stderr
    where = f"looked on {socket.gethostname()} at {Path.cwd() / 'no-such-model'}"  # the service's directory
    assert "model directory ./no-such-model does not exist" in done.stderr and where in done.stderr, (
        done.stderr
    )


def test_nothing_to_compile_is_ready_at_once(server, model_dir, tmp_path):
    """Without torch_compile nothing compiles under Inductor: the job is ready as submitted."""
    url, _ = server
    spec = write_spec(
        tmp_path / "eager.yaml",
        model_dir,
        args={"per_device_train_batch_size": 2, "max_length": 32, "pad_to_multiple_of": 32},
    )
    done = submit(url, spec, "--wait")
    assert done.returncode == 0, done.stderr
    assert "ready" in done.stderr


def test_no_worker_means_a_timeout_exit_4(server, model_dir, tmp_path):
    url, _ = server
    spec = write_spec(tmp_path / "timeout.yaml", model_dir)
    done = submit(url, spec, "--wait", "--timeout", "3")
    assert done.returncode == 4, done.stderr
    assert "timed out after 3s: 0/1 ready, 0 running, 1 queued, 0 failed" in done.stderr
    again = submit(url, spec)  # the same job: no --wait prints its id and exits 0
    assert again.returncode == 0 and len(again.stdout.strip()) == 36


def test_a_failed_signature_exits_3_and_names_it(server, model_dir, tmp_path):
    url, data = server
    spec = write_spec(
        tmp_path / "fails.yaml",
        model_dir,
        data={"min_tokens": 10, "max_tokens": 60},
        args={
            "per_device_train_batch_size": 2,
            "max_length": 64,
            "pad_to_multiple_of": 32,
            "torch_compile": True,
            "bf16": False,
        },
    )
    waiting = subprocess.Popen(
        [sys.executable, "-m", "warmup", "submit", str(spec), "--server", url, "--wait", "--timeout", "600"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    # A worker whose rehearsals are cut off after a second: every signature times out, once.
    worker = subprocess.run(
        [
            sys.executable,
            "-m",
            "warmup",
            "worker",
            "--data-dir",
            str(data),
            "--task-timeout",
            "1",
            "--max-attempts",
            "1",
            "--exit-when-idle",
            "--poll-interval",
            "0.5",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    _, stderr = waiting.communicate(timeout=600)
    assert worker.returncode == 3, worker.stdout + worker.stderr
    assert waiting.returncode == 3, stderr
    assert "failed: train 2x" in stderr and "GET /v1/tasks/" in stderr
