"""`warmup exec --strict` on a real TRL job: a run that meets a shape the cache does not hold stops at once,
before compiling it, naming the signature and the reason (issue 14, item 3).

The training script is tests/support/pod_train.py, a real SFTTrainer with torch_compile on, run by
`warmup exec` in a fresh process, once with `WarmupCallback()` in the script and once without any:
under --strict, exec's sitecustomize gives every Trainer a strict callback. The pulled cache holds
none of the plan's signatures (its manifest lists them as missing), so the first training step is
refused before anything compiles; nothing slow happens, no compile is needed to prove it.
"""

from __future__ import annotations

import json
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


@pytest.mark.parametrize("script", ["with the callback", "without a callback"])
def test_strict_exec_stops_the_run_at_the_first_unwarmed_shape(
    tiny_model_dir, user_weights_dir, tmp_path, script
):
    spec_path = write_spec(
        tmp_path / "sft.yaml",
        "sft",
        tiny_model_dir,
        {"per_device_train_batch_size": 2, "max_length": 64, "pad_to_multiple_of": 32},
        {"num_train_examples": 8, "min_tokens": 10, "max_tokens": 60},
    )
    spec = load_spec(spec_path)
    planned = plan_spec(spec).signatures
    toolchain = current_toolchain("inductor", "cpu")
    bucket = tmp_path / "bucket"
    publish_manifest(  # what the bucket holds for this spec: nothing warm yet
        LocalBlobStore(bucket),
        Manifest(
            spec_key=spec.key(),
            toolchain_key=toolchain.key(),
            toolchain=toolchain.model_dump(mode="json"),
            backend="inductor",
            device="cpu",
            plan_size=len(planned),
            signatures=[],
            missing=[s.key() for s in planned],
            files=[],
        ),
    )
    out = tmp_path / "out.json"
    command = [
        sys.executable,
        "-m",
        "warmup",
        "exec",
        spec_path,
        "--from",
        bucket,
        "--dest",
        tmp_path / "cache",
    ]
    command += ["--strict", "--", sys.executable, POD_TRAIN, "--weights", user_weights_dir, "--out", out]
    command += ["--min-tokens", 10, "--split", 30, "--max-tokens", 60, "--steps", 3]
    if script == "without a callback":
        command.append("--no-callback")
    done = subprocess.run([str(c) for c in command], capture_output=True, text=True, timeout=600)

    assert done.returncode != 0 and not out.exists(), done.stderr[-3000:]  # train() did not finish
    assert "UnwarmedCompileError: strict: train 2x32 was not warmed" in done.stderr, done.stderr[-3000:]
    assert "no entry is warmed" in done.stderr and "--allow-partial" in done.stderr
    report = json.loads((tmp_path / "trainer-out" / "warmup-coverage.json").read_text())
    assert report["details"]["status"] == "refused" and report["details"]["refused"] == "train 2x32"
    assert report["fresh_compiles"] == 0  # stopped before the compile, not after it
    assert [(m["phase"], m["seq_len"]) for m in report["missed"]] == [("train", 32)]
