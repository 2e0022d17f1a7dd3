"""The callback in real TRL runs that go wrong: train() raising still reports, a server that is down
never fails training.

Each test runs tests/support/pod_train.py (a real SFTTrainer) in a fresh process, with the spec and the
server in the environment as `warmup exec` sets them. The model is not compiled here (torch_compile off):
what is under test is when and how the report goes, not the compiles (test_pull_pod.py does those).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.jobs import write_spec
from tests.support.live_server import serve
from warmup.api.services import Services
from warmup.client.service import ServiceClient
from warmup.job.spec import load_spec
from warmup.planner.planning import plan_spec
from warmup.settings import Settings

POD_TRAIN = Path(__file__).resolve().parents[1] / "support" / "pod_train.py"


@pytest.fixture
def spec_path(tiny_model_dir, tmp_path) -> Path:
    return write_spec(
        tmp_path / "sft.yaml",
        "sft",
        tiny_model_dir,
        {
            "per_device_train_batch_size": 2,
            "max_length": 64,
            "pad_to_multiple_of": 32,
            "torch_compile": False,
        },
        {"num_train_examples": 8, "min_tokens": 10, "max_tokens": 60},
    )


def train(
    spec_path: Path, server: str, weights: Path, out: Path, *extra: object
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "WARMUP_SPEC": load_spec(spec_path).canonical_json(), "WARMUP_SERVER": server}
    command = [sys.executable, POD_TRAIN, "--weights", weights, "--out", out, "--min-tokens", 10]
    command += ["--split", 30, "--max-tokens", 60, "--steps", 3, *extra]
    return subprocess.run([str(c) for c in command], env=env, capture_output=True, text=True, timeout=600)


def test_a_run_whose_train_raises_still_reports_what_it_met(
    spec_path, user_weights_dir, sqlite_url, tmp_path
):
    settings = Settings(
        data_dir=tmp_path / "service", database_url=sqlite_url, store_url=str(tmp_path / "blobs"), auth="off"
    )
    services = Services.start(settings)
    try:
        with serve(services) as url:
            done = train(spec_path, url, user_weights_dir, tmp_path / "out.json", "--fail-at-step", 2)
            assert done.returncode != 0 and "the user's training failed at step 2" in done.stderr
            (summary,) = ServiceClient(url).jobs(spec_key=load_spec(spec_path).key())
            (report,) = ServiceClient(url).coverage(summary["id"])
    finally:
        services.close()
    assert report["details"]["status"] == "failed"
    assert "RuntimeError: the user's training failed at step 2" in report["details"]["error"]
    first = plan_spec(load_spec(spec_path)).signatures[0]  # step 1 ran: train 2x32
    assert (first.phase, first.batch, first.seq_len) == ("train", 2, 32)
    assert report["met"] == [first.key()] and report["missed"] == []
    assert report["details"]["shapes"] == {"train 2x32": {"step": 0, "compiled": False}}


def test_a_server_refusing_connections_does_not_fail_training_and_the_report_is_kept_on_disk(
    spec_path, user_weights_dir, tmp_path
):
    done = train(spec_path, "http://127.0.0.1:9", user_weights_dir, tmp_path / "out.json")
    assert done.returncode == 0, done.stderr[-4000:]
    assert "the report could not be posted to http://127.0.0.1:9" in done.stderr
    result = json.loads((tmp_path / "out.json").read_text())
    assert result["response"] is None and result["report"]["details"]["status"] == "completed"
    kept = json.loads((tmp_path / "trainer-out" / "warmup-coverage.json").read_text())  # not lost
    assert kept == result["report"] and set(kept["details"]["shapes"]) == {"train 2x32", "train 2x64"}
