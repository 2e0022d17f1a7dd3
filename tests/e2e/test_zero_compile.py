"""The proof: a warmed cache serves a real TRL training run, in a fresh process, with zero fresh compiles.

Each test warms a small plan of a tiny Qwen3-style model on this machine, then runs the user's
trainer with other weights and other, varied-length data over the cache after `warmup.activate`:
Inductor's FX and AOTAutograd caches must never miss, no file may appear in the cache directory (but
the empty lock files Inductor takes to load a kernel), and every warmed shape must actually be met
(so a hit is not a shape the run never tried).

SFT goes through `warmup warm`; GRPO and DPO are warmed with the same API from their planners' plans.
"""

from __future__ import annotations

import json
import sys

from tests.support.jobs import (
    GRPO_STATIC_CACHE_ARGS,
    GRPO_STATIC_CACHE_DATA,
    known_trace_loss,
    no_fresh_compiles,
    only_empty_locks_appeared,
    run,
    run_job,
    served_warm,
    write_spec,
)
from warmup.artifacts import list_paths


def test_sft_warm_then_train_compiles_nothing(tiny_model_dir, user_weights_dir, tmp_path):
    spec = write_spec(
        tmp_path / "sft.yaml",
        "sft",
        tiny_model_dir,
        {"per_device_train_batch_size": 2, "max_length": 64, "pad_to_multiple_of": 32},
        {"num_train_examples": 8, "min_tokens": 20, "max_tokens": 64},
    )
    cache = tmp_path / "cache"
    warm = run([sys.executable, "-m", "warmup", "warm", spec, "--cache-dir", cache])
    assert warm.returncode == 0, warm.stderr[-5000:]
    assert "[1/2]" in warm.stderr and "[2/2]" in warm.stderr and "left" in warm.stderr
    assert "train 2x32" in warm.stdout and "train 2x64" in warm.stdout
    manifest = json.loads((cache / "trl-warmup.json").read_text())
    assert [entry["status"] for entry in manifest["entries"].values()] == ["ok", "ok"]
    assert all(any(f["path"].endswith(".so") for f in e["files"]) for e in manifest["entries"].values())

    before = list_paths(cache)
    report = run_job(
        spec, user_weights_dir, cache, tmp_path / "job.json", low=20, split=32, high=64, steps=4, data_seed=11
    )
    assert no_fresh_compiles(report), report["fresh_compiles"]
    assert only_empty_locks_appeared(cache, before) == []
    assert {tuple(shape) for shape in report["shapes"]} == {(2, 32), (2, 64)}
    if (loss := known_trace_loss()) is None:
        # the trace is skipped too: every backbone call ran its warmed artifact, and Dynamo traced nothing
        assert report["trace_skip"]["hits"] > 0 and report["trace_skip"]["misses"] == 0, report["trace_skip"]
        assert report["counters"].get("frames", {}).get("total", 0) == 0, report["counters"]
    else:
        # a stack whose model torch cannot save: the warm-up said why in its last lines, and the caches served
        # every graph Dynamo traced
        assert "trace skip: lost for 2 of 2 signature(s): trace not kept for" in warm.stderr + warm.stdout
        assert loss in warm.stderr + warm.stdout, warm.stderr[-3000:]
        assert served_warm(report), (report["counters"], report["trace_skip"])

    again = run([sys.executable, "-m", "warmup", "warm", spec, "--cache-dir", cache])
    assert again.returncode == 0 and again.stdout.count("reused") == 2  # nothing to redo


def test_grpo_with_a_static_cache_warm_then_train_compiles_nothing(
    tiny_model_dir, user_weights_dir, tmp_path
):
    from warmup.job.spec import load_spec
    from warmup.planner.planning import plan_spec
    from warmup.rehearsal.local import warm_directory

    spec_path = write_spec(
        tmp_path / "grpo.yaml", "grpo", tiny_model_dir, GRPO_STATIC_CACHE_ARGS, GRPO_STATIC_CACHE_DATA
    )

    signatures = plan_spec(load_spec(spec_path)).signatures
    assert sorted(s.shape_label for s in signatures) == [
        "generate_decode 4x1 cache 39",
        "generate_prefill 4x16 cache 39",
        "generate_prefill 4x32 cache 39",
        "ref 4x32",
        "ref 4x48",
        "train 4x32",
        "train 4x48",
    ]
    cache = tmp_path / "cache"
    report = warm_directory(load_spec(spec_path), cache, signatures=signatures)
    assert report.ok, [
        (r.signature.shape_label, r.status, r.note, r.log_tail[-2000:]) for r in report.results
    ]
    by_phase = {}
    for result in report.results:
        by_phase.setdefault(result.signature.phase, []).append(result)
    assert all(r.files for r in by_phase["train"] + by_phase["ref"])
    # generation runs eager on Inductor (TRL generates with disable_compile=True): empty entries that say why
    assert all(not r.files and "runs eager" in r.note for r in by_phase["generate_prefill"])

    before = list_paths(cache)
    job = run_job(
        spec_path,
        user_weights_dir,
        cache,
        tmp_path / "job.json",
        low=5,
        split=16,
        high=30,
        steps=4,
        plan_size=len(signatures),
        data_seed=5,
    )
    assert no_fresh_compiles(job), job["fresh_compiles"]
    assert only_empty_locks_appeared(cache, before) == []
    # policy (0) and reference (1) forwards over both widths
    assert {tuple(shape) for shape in job["shapes"]} == {(4, 32, 0), (4, 32, 1), (4, 48, 0), (4, 48, 1)}


def test_dpo_warm_then_train_compiles_nothing(tiny_model_dir, user_weights_dir, tmp_path):
    from warmup.job.spec import load_spec
    from warmup.planner.planning import plan_spec
    from warmup.rehearsal.local import warm_directory

    spec_path = write_spec(
        tmp_path / "dpo.yaml",
        "dpo",
        tiny_model_dir,
        {"per_device_train_batch_size": 2, "max_length": 64, "pad_to_multiple_of": 32},
        {"min_tokens": 20, "max_tokens": 64},
    )
    # chosen and rejected rows stack: 2 x 2 rows; the reference model runs on the same batch
    signatures = plan_spec(load_spec(spec_path)).signatures
    assert sorted(s.shape_label for s in signatures) == ["ref 4x32", "ref 4x64", "train 4x32", "train 4x64"]
    cache = tmp_path / "cache"
    report = warm_directory(load_spec(spec_path), cache, signatures=signatures)
    assert report.ok, [
        (r.signature.shape_label, r.status, r.note, r.log_tail[-2000:]) for r in report.results
    ]
    units = {r.unit for r in report.results}
    assert len(units) == 2  # the reference rides with the training step of its shape

    before = list_paths(cache)
    job = run_job(
        spec_path,
        user_weights_dir,
        cache,
        tmp_path / "job.json",
        low=20,
        split=32,
        high=64,
        steps=4,
        plan_size=len(signatures),
        data_seed=3,
    )
    assert no_fresh_compiles(job), job["fresh_compiles"]
    assert only_empty_locks_appeared(cache, before) == []
    assert {tuple(shape) for shape in job["shapes"]} == {(4, 32), (4, 64)}
