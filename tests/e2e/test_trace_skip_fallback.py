"""The trace skip over non-reentrant gradient checkpointing, and a process that does not load its artifacts.

The job checkpoints its layers as most public recipes do (`gradient_checkpointing_kwargs: {use_reentrant: false}`,
also transformers' default): the warm-up keeps the backbone's trace, and a training process runs it untraced.
The warm-up splits the backbone off the compiled model (warmup/trace_skip/), so its caches hold the backbone's
graphs, not the whole model's. A training process over that cache splits the same way whether it loads the
artifacts or not: with WARMUP_TRACE_SKIP=0 and with every artifact refused (damaged files), Dynamo traces the
backbone it splits off, and Inductor's FX and AOTAutograd caches serve every graph; no file appears.
One warm of one shape, then three one-step training runs that hit the cache.
"""

from __future__ import annotations

import sys

import pytest

from tests.support.jobs import no_fresh_compiles, only_empty_locks_appeared, run, run_job, write_spec
from warmup.artifacts import list_paths
from warmup.trace_skip.artifacts import SPLIT_MARKER, TRACE_DIR
from warmup.trace_skip.split import ENV_VAR


def test_checkpointed_layers_skip_the_trace_and_the_switch_and_a_refused_artifact_meet_the_warmed_graphs(
    tiny_model_dir, user_weights_dir, tmp_path, monkeypatch: pytest.MonkeyPatch
):
    spec = write_spec(
        tmp_path / "sft.yaml",
        "sft",
        tiny_model_dir,
        {
            "per_device_train_batch_size": 2,
            "max_length": 32,
            "pad_to_multiple_of": 32,
            "gradient_checkpointing": True,
            "gradient_checkpointing_kwargs": {"use_reentrant": False},
        },
        {"num_train_examples": 4, "min_tokens": 20, "max_tokens": 32},
    )
    cache = tmp_path / "cache"
    warm = run([sys.executable, "-m", "warmup", "warm", spec, "--cache-dir", cache])
    assert warm.returncode == 0, warm.stderr[-5000:]
    artifacts = sorted((cache / TRACE_DIR).glob("*.aot"))
    assert artifacts and (cache / TRACE_DIR / SPLIT_MARKER).is_file(), warm.stdout + warm.stderr[-3000:]
    assert "trace skip: lost" not in warm.stdout, warm.stdout  # the checkpointed backbone's trace is kept
    before = list_paths(cache)

    def train(name: str, *, traced: bool = True) -> dict:
        report = run_job(
            spec, user_weights_dir, cache, tmp_path / f"{name}.json", low=20, split=32, high=32, steps=1
        )
        assert no_fresh_compiles(report), (name, report["fresh_compiles"], report["counters"])
        assert only_empty_locks_appeared(cache, before) == [], name
        assert report["shapes"] == [[2, 32]], name
        skip = report["trace_skip"]
        if not traced:  # every backbone call ran its artifact, and Dynamo traced nothing
            assert skip["hits"] > 0 and skip["misses"] == 0, (name, skip)
            assert report["counters"].get("frames", {}).get("total", 0) == 0, (name, report["counters"])
            return skip
        # served by the caches, not a run that compiled nothing: Dynamo traced, the FX and AOT caches hit
        assert report["counters"]["inductor"].get("fxgraph_cache_hit", 0) > 0, (name, report["counters"])
        assert report["counters"]["aot_autograd"].get("autograd_cache_hit", 0) > 0, (name, report["counters"])
        assert skip["hits"] == 0 and skip["misses"] > 0, (name, skip)
        return skip

    served = train("served", traced=False)
    assert served["loaded"] == len(artifacts) and served["refused"] == {}

    monkeypatch.setenv(ENV_VAR, "0")
    off = train("off")
    assert off["off"] == f"{ENV_VAR}=0" and off["loaded"] == 0

    monkeypatch.delenv(ENV_VAR)
    for path in artifacts:  # damaged in transit: each is refused as it loads
        path.write_bytes(b"not a compiled function")
    refused = train("refused")
    assert refused["off"] is None and refused["loaded"] == 0
    assert sum(refused["refused"].values()) == len(artifacts), refused
    assert all(reason.startswith("not loadable") for reason in refused["refused"]), refused
