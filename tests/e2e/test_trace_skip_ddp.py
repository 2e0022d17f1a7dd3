"""The trace skip in a DDP job of two processes: one rehearsal serves every rank.

The warm-up rehearses the job with 2 processes (torchrun, DDP, one thread per rank as torchrun gives each); every
rank splits the backbone off the compiled DDP model and records its calls; rank 0 compiles, saves and checks an
artifact per call, and rank 1 checks each on its own call before any is kept (warmup/trace_skip/capture.py). Two
training runs under `torchrun --nproc-per-node=2`, in fresh processes over that cache, then assert on every rank:
- served: every backbone call runs its artifact (none traced), no FX/AOT miss, no new file;
- every artifact refused (damaged in transit): each rank traces the same split backbone (inside DDP's forward, as
  the warm-up did), and Inductor's FX and AOTAutograd caches serve it: no miss, no new file.
"""

from __future__ import annotations

from tests.support.jobs import (
    no_fresh_compiles,
    only_empty_locks_appeared,
    run_job_under_torchrun,
    warm_as_job_of,
    write_spec,
)
from warmup.artifacts import list_paths
from warmup.trace_skip.artifacts import SPLIT_MARKER, TRACE_DIR

RANKS = 2
BATCHES = {"low": 10, "split": 31, "high": 32}  # train_job.py's lengths: one width, 32


def test_a_ddp_job_of_two_processes_runs_its_backbone_untraced_on_every_rank(
    tiny_model_dir, user_weights_dir, tmp_path, monkeypatch
):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # what each rank of the job runs (and the toolchain says)
    spec = write_spec(
        tmp_path / "sft-ddp.yaml",
        "sft",
        tiny_model_dir,
        {"per_device_train_batch_size": 2, "max_length": 32, "pad_to_multiple_of": 32},
        {"min_tokens": 10, "max_tokens": 32},
    )
    cache = tmp_path / "cache"
    report = warm_as_job_of(spec, RANKS, cache)
    assert report.processes == RANKS
    (result,) = report.results
    assert result.trace_lost == "", result.trace_lost
    artifacts = sorted((cache / TRACE_DIR).glob("*.aot"))
    assert artifacts and (cache / TRACE_DIR / SPLIT_MARKER).is_file()
    before = list_paths(cache)

    for rank, ranked in enumerate(
        run_job_under_torchrun(
            spec, user_weights_dir, cache, tmp_path / "served.json", ranks=RANKS, steps=2, **BATCHES
        )
    ):
        skip = ranked["trace_skip"]
        assert skip["hits"] > 0 and skip["misses"] == 0, (rank, skip)
        assert skip["loaded"] == len(artifacts) and skip["refused"] == {}, (rank, skip)
        assert no_fresh_compiles(ranked), (rank, ranked["fresh_compiles"])
        assert {tuple(shape) for shape in ranked["shapes"]} == {(2, 32)}, rank
    assert only_empty_locks_appeared(cache, before) == []

    for path in artifacts:  # damaged in transit: every rank refuses each as it loads
        path.write_bytes(b"not a compiled function")
    for rank, ranked in enumerate(
        run_job_under_torchrun(
            spec, user_weights_dir, cache, tmp_path / "refused.json", ranks=RANKS, steps=2, **BATCHES
        )
    ):
        skip = ranked["trace_skip"]
        assert skip["hits"] == 0 and skip["misses"] > 0, (rank, skip)
        assert sum(skip["refused"].values()) == len(artifacts), (rank, skip)
        assert no_fresh_compiles(ranked), (rank, ranked["fresh_compiles"])
        counters = ranked["counters"]
        assert counters["inductor"].get("fxgraph_cache_hit", 0) > 0, (rank, counters)
        assert counters["aot_autograd"].get("autograd_cache_hit", 0) > 0, (rank, counters)
    assert only_empty_locks_appeared(cache, before) == []
