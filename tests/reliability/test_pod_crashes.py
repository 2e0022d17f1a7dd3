"""Pulls killed with SIGKILL, a disk sized for the cache, and clients across a service restart.

A pull runs in a process of its own (`warmup.pull` with a given toolchain: no torch) against a real
HTTP server in this process, and is killed at a random moment of its life, 20 times into one directory;
then one pull must leave nothing of the killed ones behind: no `.warmup-tmp`, every file verified, the
directory holding exactly the cache and the client's own state. On a tmpfs sized for the cache, one
killed pull must not lock the pod out. A pull (the same process) and `warmup submit --wait` run while the
real `warmup serve` (embedded setup) is stopped and started again, and succeed.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.fixtures.factories import cpu_toolchain, one_signature_sft
from tests.reliability.ledger import Row, record
from tests.support.pods import HostileService, hostile_service, play_worker
from tests.support.tiny_model import write_tiny_model
from warmup.api.services import Services
from warmup.client.local import INDEX_NAME, LOCAL_MANIFESTS_DIR, TEMP_DIR_NAME
from warmup.job.spec import Spec, load_spec
from warmup.settings import Settings

SPEC = Spec.model_validate(
    {
        "trainer": "sft",
        "model": "tiny",
        "args": {"max_length": 64},
        "target": {"backend": "inductor", "device": "cpu"},
    }
)
TOOLCHAIN = cpu_toolchain()
KILLS = 20
PULL = """
import json, sys
from warmup.client.pulling import pull
spec, dest, url, toolchain = sys.argv[1:5]
result = pull(json.loads(spec), dest, server=url, toolchain=json.loads(toolchain), parallel=4)
print(json.dumps({"downloaded": result.downloaded, "removed": list(result.removed_leftovers)}))
"""


def a_cache(seed: int, files: int = 160) -> dict[str, bytes]:
    """An Inductor-like cache of `files` files, 16-160 KB each (about 14 MB)."""
    rng = random.Random(seed)
    return {
        f"fxgraph/{n % 16:02x}/f{n:04d}/entry": rng.randbytes(rng.randint(16, 160) * 1024)
        for n in range(files)
    }


def manifest_of(cache: dict[str, bytes]) -> dict[str, Any]:
    return {
        "spec_key": SPEC.key(),
        "toolchain_key": TOOLCHAIN.key(),
        "toolchain": TOOLCHAIN.model_dump(mode="json"),
        "backend": "inductor",
        "device": "cpu",
        "plan_size": 1,
        "signatures": ["0" * 64],
        "missing": [],
        "files": [
            {"path": path, "sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "url": None}
            for path, data in cache.items()
        ],
    }


@pytest.fixture
def served() -> Iterator[tuple[str, dict[str, bytes]]]:
    cache = a_cache(37)
    state = HostileService(
        manifest_of(cache),
        blobs={hashlib.sha256(data).hexdigest(): data for data in cache.values()},
        blob_delay_s=0.05,  # a download of a few seconds, 4 at a time
    )
    with hostile_service(state) as running:
        yield running.url, cache


def start_pull(
    url: str, dest: Path, spec: Spec = SPEC, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    """`warmup.pull` in a process of its own, with the toolchain given (no torch to import)."""
    return subprocess.Popen(
        [sys.executable, "-c", PULL, spec.model_dump_json(), str(dest), url, TOOLCHAIN.model_dump_json()],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def finish(pull: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = pull.communicate(timeout=300)
    assert pull.returncode == 0, err
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def wait_for_staging(pull: subprocess.Popen[str], dest: Path) -> float:
    """When the pull's staging folder appeared (or the pull ended first)."""
    deadline = time.monotonic() + 120
    while not any((dest / TEMP_DIR_NAME).glob("*")) and pull.poll() is None:
        assert time.monotonic() < deadline, "the pull never staged a file"
        time.sleep(0.005)
    return time.monotonic()


def staged_bytes(dest: Path) -> int:
    total = 0
    for folder, _, names in os.walk(dest / TEMP_DIR_NAME):
        for name in names:
            try:
                total += os.stat(os.path.join(folder, name)).st_size
            except FileNotFoundError:  # a download that failed and went away
                continue
    return total


def assert_exactly_the_cache(dest: Path, cache: dict[str, bytes]) -> None:
    """No `.warmup-tmp`; every file of the cache in place and intact; nothing else but the client's state."""
    assert not (dest / TEMP_DIR_NAME).exists()
    found = {str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file()}
    state = {
        INDEX_NAME,
        f"{LOCAL_MANIFESTS_DIR}/{SPEC.key()}.json",
        f"{LOCAL_MANIFESTS_DIR}/{SPEC.key()}.spec.json",
    }
    assert found == set(cache) | state
    for path, data in cache.items():
        assert (dest / path).read_bytes() == data, path
    in_use = sum((dest / path).stat().st_size for path in found - state)
    assert in_use == sum(len(data) for data in cache.values())


def test_twenty_pulls_killed_at_random_moments_mark_no_partial_cache_installed_and_the_next_pull_cleans_up(
    served, tmp_path: Path
) -> None:
    url, cache = served
    timing = tmp_path / "timing"
    started = time.monotonic()
    pull = start_pull(url, timing)
    staging_at = wait_for_staging(pull, timing) - started
    finish(pull)
    lifetime = time.monotonic() - started  # of a whole pull, from its process's start
    rng = random.Random(2037)

    dest = tmp_path / "cache"
    left_behind = 0
    for round_ in range(KILLS):
        pull = start_pull(url, dest)
        if round_ % 2:  # a moment of its download
            wait_for_staging(pull, dest)
            time.sleep(rng.uniform(0, 0.9 * (lifetime - staging_at)))
        else:  # any moment of its life
            time.sleep(rng.uniform(0, 0.9 * lifetime))
        pull.send_signal(signal.SIGKILL)
        pull.wait()
        left_behind += (dest / TEMP_DIR_NAME).exists()
        assert not (dest / LOCAL_MANIFESTS_DIR / f"{SPEC.key()}.json").exists() or all(
            (dest / path).read_bytes() == data for path, data in cache.items()
        ), "a killed pull left a partial cache marked installed"
    assert left_behind, "no kill landed while a pull was staging files: the test proved nothing"

    finish(start_pull(url, dest))
    assert_exactly_the_cache(dest, cache)
    record(Row(scenario=f"pod: {KILLS} pulls killed with SIGKILL into one directory", faults_injected=KILLS))


@pytest.fixture
def small_volume(tmp_path: Path, served) -> Iterator[Path]:
    """A tmpfs sized for the cache: its files rounded up to pages, and 1 MiB for folders and state."""
    _, cache = served
    pages = sum(-(-len(data) // 4096) * 4096 for data in cache.values())
    mount = tmp_path / "volume"
    mount.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={pages + (1 << 20)}", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
    )
    assert mounted.returncode == 0, f"this test mounts a tmpfs (it needs root): {mounted.stderr}"
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def test_a_pull_killed_on_a_volume_sized_for_the_cache_does_not_lock_the_pod_out(
    served, small_volume: Path
) -> None:
    url, cache = served
    dest = small_volume / "cache"
    total = sum(len(data) for data in cache.values())
    pull = start_pull(url, dest)
    deadline = time.monotonic() + 120
    while staged_bytes(dest) < total // 2:
        assert pull.poll() is None, "the pull ended before half the cache was staged"
        assert time.monotonic() < deadline
        time.sleep(0.002)
    pull.send_signal(signal.SIGKILL)
    pull.wait()
    leftover = staged_bytes(dest)
    assert leftover >= total // 2  # the cache would not fit beside it

    result = finish(start_pull(url, dest))
    assert result["downloaded"] == len(cache) and result["removed"][1] == leftover
    assert_exactly_the_cache(dest, cache)
    record(Row(scenario="pod: a pull killed on a volume sized for the cache", faults_injected=1))


# --- a service restart ------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_serve(data: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
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
            stdout=out,
            stderr=out,
        )
    deadline = time.monotonic() + 120
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz").status_code == 200:
                return process
        except httpx.TransportError:
            pass
        assert process.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.1)


def test_a_pull_and_submit_wait_live_through_a_service_restart(tmp_path: Path) -> None:
    """`submit --wait` polls while the service stops; a pull starts while it is down; the service comes
    back (the job warmed meanwhile) and both succeed.

    The default budget (60 s) is twice a restart of `warmup serve` measured on the development machine
    (docs/performance.md); under the suite's load a restart here can take longer, so the clients get
    WARMUP_RETRY_S=300: what this proves is that they wait for the service and carry on."""
    data, port, log = tmp_path / "data", free_port(), tmp_path / "serve.log"
    url = f"http://127.0.0.1:{port}"
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(one_signature_sft(write_tiny_model(tmp_path / "model"))))
    toolchain_path = tmp_path / "toolchain.json"
    toolchain_path.write_text(TOOLCHAIN.model_dump_json())
    env = {**os.environ, "WARMUP_RETRY_S": "300"}
    serve = start_serve(data, port, log)
    waiting = subprocess.Popen(
        [sys.executable, "-m", "warmup", "submit", str(spec_path), "--server", url, "--toolchain",
         str(toolchain_path), "--wait", "--timeout", "600"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    pull: subprocess.Popen[str] | None = None
    try:
        deadline = time.monotonic() + 120
        while not httpx.get(f"{url}/v1/warmups").json():
            assert waiting.poll() is None and time.monotonic() < deadline, waiting.stderr
            time.sleep(0.2)
        services = Services.start(Settings(data_dir=data))
        time.sleep(2.5)  # a poll or two of the running job
        serve.send_signal(signal.SIGTERM)
        serve.wait(timeout=60)
        down = time.monotonic()
        try:  # the job is warmed while the service is away
            assert play_worker(services, TOOLCHAIN.key(), tmp_path / "scratch") == 1
        finally:
            services.close()
        pull = start_pull(url, tmp_path / "cache", load_spec(spec_path), env)
        time.sleep(1)  # both clients meet a refused connection
        serve = start_serve(data, port, log)
        restart_s = time.monotonic() - down
        assert restart_s > 1  # the clients met a refused connection, at least once each

        _, submitted = waiting.communicate(timeout=300)
        assert waiting.returncode == 0, submitted
        assert "ready" in submitted
        assert finish(pull)["downloaded"] == 3  # play_worker's three files
    finally:
        for process in (waiting, pull, serve):
            if process is not None and process.poll() is None:
                process.terminate()
                process.wait(timeout=60)
    record(
        Row(
            scenario=f"pod: pull and submit --wait across a restart ({restart_s:.0f}s down)",
            faults_injected=1,
        )
    )
