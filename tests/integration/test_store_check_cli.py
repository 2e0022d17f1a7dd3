"""`warmup store check` from outside the process, against the real service on PostgreSQL and SeaweedFS S3:
a stored blob flipped and another deleted are found, `/readyz` and pulls say so until `warmup submit
--wait` has them warmed again, and a pull then succeeds. The API runs in uvicorn in a thread; workers are
played by the queue (no compiles); the commands run in subprocesses, as an operator and a pod run them."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import httpx
import pytest

from tests.support.live_server import serve
from tests.support.pods import play_worker
from tests.support.tiny_model import write_tiny_model
from tests.unit.test_store import overwrite
from warmup.api.services import REVOCATION_CHECK_S, Services
from warmup.db.records import Keyed
from warmup.job.spec import load_spec
from warmup.planner.planning import plan_spec
from warmup.settings import Settings
from warmup.toolchain.probes import current_toolchain

pytestmark = pytest.mark.timeout(600)
PREFIX = "warmup"


def warmup(*args: object, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "warmup", *(str(a) for a in args)]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout)


def test_damage_is_found_shown_and_rewarmed(pg_url, s3_bucket, tmp_path):
    model = write_tiny_model(tmp_path / "model")
    spec_file = tmp_path / "job.json"
    spec_file.write_text(
        json.dumps(
            {
                "trainer": "sft",
                "model": str(model),
                "args": {
                    "per_device_train_batch_size": 2,
                    "max_length": 64,
                    "pad_to_multiple_of": 32,
                    "torch_compile": True,
                },
                "data": {"num_train_examples": 8, "min_tokens": 10, "max_tokens": 60},
                "target": {"backend": "inductor", "device": "cpu"},
            }
        )
    )
    store_url = f"s3://{s3_bucket}/{PREFIX}"
    settings = Settings(data_dir=tmp_path / "service", database_url=pg_url, store_url=store_url, auth="off")
    services = Services.start(settings)
    toolchain = current_toolchain("inductor", "cpu")
    spec = load_spec(spec_file)
    services.queue.submit_job(
        Keyed.of(spec), Keyed.of(toolchain), [Keyed.of(s) for s in plan_spec(spec).signatures]
    )
    assert play_worker(services, toolchain.key(), tmp_path / "scratch") == 2
    location = ("--database-url", pg_url, "--store", store_url)
    try:
        with serve(services) as url:
            first = warmup("pull", spec_file, "--server", url, "--dest", tmp_path / "pod-1")
            assert first.returncode == 0, first.stderr
            files = services.repository.entries_for(
                [s.key() for s in plan_spec(spec).signatures], toolchain.key(), touch=False
            )
            flipped, deleted = (entry.files[0] for entry in files.values())
            with services.store.open(flipped.sha256) as stored:
                data = bytearray(stored.read())
            data[len(data) // 2] ^= 0x01
            overwrite(services.store, flipped.sha256, bytes(data))
            services.store.delete(deleted.sha256)

            check = warmup("store", "check", *location)
            assert check.returncode == 3, check.stdout + check.stderr
            assert f"damaged: blob {flipped.sha256}: its bytes have sha256" in check.stdout
            assert f"damaged: blob {deleted.sha256}: missing from the store" in check.stdout
            assert "2 damaged; removed their copies, the 2 entries that listed them" in check.stdout
            assert "submit those jobs again" in check.stderr
            time.sleep(REVOCATION_CHECK_S)  # the API's manifests in memory are forgotten by then

            ready = httpx.get(f"{url}/readyz").json()
            assert ready["status"] == "degraded" and "2 blobs found damaged" in ready["problems"][0]
            refused = warmup("pull", spec_file, "--server", url, "--dest", tmp_path / "pod-2")
            # Both signatures lost their entry: the pod is told to submit, not handed a bad copy.
            assert refused.returncode == 3 and "submit it" in refused.stderr, refused.stderr

            waiting = subprocess.Popen(
                [sys.executable, "-m", "warmup", "submit", spec_file, "--server", url, "--wait"],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            rewarmed = 0
            while waiting.poll() is None:  # the submission re-queues the two; a worker takes them
                rewarmed += play_worker(services, toolchain.key(), tmp_path / "scratch")
                time.sleep(0.2)
            _out, err = waiting.communicate()
            assert waiting.returncode == 0 and rewarmed == 2, err
            assert "ready" in err
            assert httpx.get(f"{url}/readyz").json() == {"status": "ready"}

            again = warmup("pull", spec_file, "--server", url, "--dest", tmp_path / "pod-2")
            assert again.returncode == 0, again.stderr
            clean = warmup("store", "check", *location)
            assert (
                clean.returncode == 0 and "checked 6 blobs" in clean.stdout and "none damaged" in clean.stdout
            )
    finally:
        services.close()
