"""The callback never breaks the run it watches, however it is attached (issue 35, trap 0): passed in
`callbacks=[...]`, added with `trainer.add_callback(...)` to a built trainer (its planning once reset
accelerate's state under the live trainer, and train() failed at once), and under `warmup exec`.

Each way is a real SFT run (tests/support/pod_train.py) in a fresh process, without compile (torch_compile off:
what is under test is that training runs and the callback sees it; tests/e2e/test_pull_pod.py trains a warmed
cache through `add_callback` with 0 fresh compiles).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.jobs import write_spec
from warmup.db.manifests import publish_manifest
from warmup.job.spec import load_spec
from warmup.manifest import Manifest
from warmup.planner.planning import plan_spec
from warmup.store import LocalBlobStore
from warmup.toolchain.probes import current_toolchain

POD_TRAIN = Path(__file__).resolve().parents[1] / "support" / "pod_train.py"


@pytest.mark.parametrize(
    ("attach", "under_exec"),
    [
        ("constructor", []),
        ("add_callback", []),
        ("add_callback", ["exec"]),
        ("add_callback", ["exec", "--strict"]),
    ],
    ids=[
        "callbacks=[...]",
        "add_callback",
        "add_callback under warmup exec",
        "add_callback under exec --strict",
    ],
)
def test_the_callback_attached_each_way_trains_and_reports(
    tiny_model_dir, user_weights_dir, tmp_path, attach, under_exec
):
    spec_path = write_spec(
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
    spec = load_spec(spec_path)
    planned = {(s.phase, s.batch, s.seq_len): s.key() for s in plan_spec(spec).signatures}
    assert set(planned) == {("train", 2, 32), ("train", 2, 64)}
    out = tmp_path / "out.json"
    train = [sys.executable, POD_TRAIN, "--weights", user_weights_dir, "--out", out, "--attach", attach]
    train += ["--min-tokens", 10, "--split", 30, "--max-tokens", 60, "--steps", 3]
    env = {key: value for key, value in os.environ.items() if not key.startswith("WARMUP_")}
    if under_exec:
        toolchain = current_toolchain("inductor", "cpu")
        bucket = tmp_path / "bucket"
        publish_manifest(  # the bucket's complete cache of this spec: every signature runs eager, no files
            LocalBlobStore(bucket),
            Manifest(
                spec_key=spec.key(),
                toolchain_key=toolchain.key(),
                toolchain=toolchain.model_dump(mode="json"),
                backend="inductor",
                device="cpu",
                plan_size=len(planned),
                signatures=sorted(planned.values()),
                files=[],
            ),
        )
        command = [sys.executable, "-m", "warmup", "exec", spec_path, "--from", bucket]
        command += ["--dest", tmp_path / "cache", *under_exec[1:], "--", *train]
    else:
        env["WARMUP_SPEC"] = spec.canonical_json()
        command = train
    done = subprocess.run([str(c) for c in command], env=env, capture_output=True, text=True, timeout=600)

    assert done.returncode == 0, done.stderr[-4000:]
    assert "AcceleratorState" not in done.stderr
    result = json.loads(out.read_text())
    assert {tuple(s) for s in result["shapes"]} == {(2, 32), (2, 64)}  # train() ran every step
    report = result["report"]
    assert report["details"]["status"] == "completed" and report["details"]["steps"] == 3
    assert set(report["details"]["shapes"]) == {"train 2x32", "train 2x64"}  # its hooks saw the steps
    assert sorted(report["met"]) == sorted(planned.values()) and report["missed"] == []
    assert report["fresh_compiles"] == 0
    assert "args" not in report["details"]  # the run's arguments are the spec's
    # one callback reports: under --strict, exec's own stands aside for the one the script added
    assert done.stderr.count("trl-warmup: completed: met") == 1, done.stderr[-4000:]
