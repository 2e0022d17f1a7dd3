"""The trace skip in mixed precision: TRL's default `bf16` on a CPU (`use_cpu: true`), which accelerate runs under
CPU autocast, as a user's `trl sft --config` without `bf16: false` does (the getting-started job). Dynamo guards on
the autocast state, so the rehearsal compiles and checks each call in the regions it met; the training process then
runs every backbone call from its artifact, nothing traced and nothing compiled. One warm of one shape, one
one-step training run."""

from __future__ import annotations

import sys

from tests.support.jobs import no_fresh_compiles, only_empty_locks_appeared, run, run_job, write_spec
from warmup.artifacts import list_paths
from warmup.trace_skip.artifacts import TRACE_DIR


def test_a_job_in_cpu_mixed_precision_is_served_untraced(tiny_model_dir, user_weights_dir, tmp_path):
    spec = write_spec(
        tmp_path / "sft.yaml",
        "sft",
        tiny_model_dir,
        {"per_device_train_batch_size": 2, "max_length": 32, "pad_to_multiple_of": 32, "bf16": True},
        {"num_train_examples": 4, "min_tokens": 20, "max_tokens": 32},
    )
    cache = tmp_path / "cache"
    warm = run([sys.executable, "-m", "warmup", "warm", spec, "--cache-dir", cache])
    assert warm.returncode == 0, warm.stderr[-5000:]
    records = sorted((cache / TRACE_DIR).glob("*.json"))
    assert any("autocast=cpu:bfloat16" in path.read_text() for path in records), (
        warm.stdout + warm.stderr[-3000:]
    )
    before = list_paths(cache)

    report = run_job(
        spec, user_weights_dir, cache, tmp_path / "train.json", low=20, split=32, high=32, steps=1
    )
    assert no_fresh_compiles(report), (report["fresh_compiles"], report["counters"])
    assert only_empty_locks_appeared(cache, before) == []
    skip = report["trace_skip"]
    assert skip["hits"] > 0 and skip["misses"] == 0, (
        skip
    )  # under autocast, every backbone call from its artifact
    assert report["counters"].get("frames", {}).get("total", 0) == 0, report["counters"]
