"""A job of 3 processes, warmed with 2, trains under `torchrun --nproc-per-node=3` compiling nothing.

Every rank of a DDP job compiles the same graphs at any world size above 1 (docs/multi-node.md), so
the rehearsal runs 2 processes, each with the thread count a rank of the job runs (1: torchrun's
default with several processes per node, pinned here as a real job pins it). Each of the 3 training
ranks, in a fresh process over that cache, must miss nothing in Inductor's FX and AOTAutograd caches,
leave no new file, and meet the warmed shape; the trace skip serves every rank's backbone calls (warmup/trace_skip/:
the rehearsal's 2 ranks make and check the artifacts the 3 training ranks load).
"""

from __future__ import annotations

import json

from tests.support.jobs import (
    no_fresh_compiles,
    only_empty_locks_appeared,
    run_job_under_torchrun,
    served_warm,
    warm_as_job_of,
    write_spec,
)
from warmup.artifacts import list_paths


def test_a_three_process_job_warmed_with_two_trains_with_zero_compiles(
    tiny_model_dir, user_weights_dir, tmp_path, monkeypatch
):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # what each rank of the job runs (and the toolchain says)
    spec_path = write_spec(
        tmp_path / "sft-3.yaml",
        "sft",
        tiny_model_dir,
        {"per_device_train_batch_size": 2, "max_length": 32, "pad_to_multiple_of": 32},
        {"min_tokens": 10, "max_tokens": 32},
    )
    cache = tmp_path / "cache"
    report = warm_as_job_of(spec_path, 3, cache)
    assert report.processes == 2
    manifest = json.loads((cache / "trl-warmup.json").read_text())
    assert manifest["toolchain"]["num_threads"] == 1

    before = list_paths(cache)
    reports = run_job_under_torchrun(
        spec_path, user_weights_dir, cache, tmp_path / "job.json", ranks=3, steps=2, low=10, split=31, high=32
    )
    for rank, ranked in enumerate(reports):
        assert no_fresh_compiles(ranked), (rank, ranked["fresh_compiles"])
        assert {tuple(shape) for shape in ranked["shapes"]} == {(2, 32)}
        # the trace skip's artifacts (made and checked by the 2 rehearsal ranks) serve every backbone call
        assert served_warm(ranked) and ranked["trace_skip"]["hits"] > 0, (rank, ranked["trace_skip"])
    assert only_empty_locks_appeared(cache, before) == []
