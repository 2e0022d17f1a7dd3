"""Sharded jobs of 3 processes (FSDP2, DeepSpeed ZeRO-2, ZeRO-3), warmed with 2, train compiling nothing; ZeRO-2's
ranks run the backbone from the trace skip's artifacts, tracing nothing.

Each job is TRL's SFT under one of TRL's `accelerate_config` presets (`fsdp2`, `zero2`, `zero3`; 3 processes, fp32 on
this CPU). `warmup warm`'s rehearsal runs the job's own launcher with 2 processes (docs/multi-node.md: no sharding
mode puts a rank, a shard shape or a process group into a compiled graph); then the job trains under
`accelerate launch --num_processes 3` in fresh processes, other weights and data, over that cache. Every rank must
run the job's wrapper (FSDP / DeepSpeed), miss nothing in Inductor's FX and AOTAutograd caches, leave no new file
but Inductor's empty lock files, and meet the warmed shape. FSDP runs on CPU through warmup.rehearsal.cpu_sharding in
the rehearsal and in the training job alike (accelerate 1.15 sets FSDP up only on an accelerator).
"""

from __future__ import annotations

import sys
from importlib import resources
from pathlib import Path

import yaml

from tests.support.jobs import (
    TRAIN_JOB,
    free_port,
    only_empty_locks_appeared,
    rank_reports,
    run,
    warm_as_job_of,
    write_spec,
)
from warmup.artifacts import list_paths
from warmup.trace_skip.artifacts import TRACE_DIR

WORLD = 3


def accelerate_config(tmp_path: Path, preset: str) -> Path:
    """TRL's preset as a file for a job of WORLD processes in fp32 (the presets say 8 processes and bf16)."""
    config = yaml.safe_load(resources.files("trl.accelerate_configs").joinpath(f"{preset}.yaml").read_text())
    config.update(num_processes=WORLD, mixed_precision="no")
    path = tmp_path / f"{preset}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def warmed_job(preset: str, model: Path, tmp_path: Path, **args: object) -> tuple[Path, Path, Path]:
    """The SFT job under `preset`, warmed with `warm_directory` (which rehearses with 2 processes): its spec, its
    accelerate config and the cache."""
    config = accelerate_config(tmp_path, preset)
    spec_path = write_spec(
        tmp_path / f"sft-{preset}.yaml",
        "sft",
        model,
        {
            "per_device_train_batch_size": 2,
            "max_length": 32,
            "pad_to_multiple_of": 32,
            "accelerate_config": str(config),
            **args,
        },
        {"min_tokens": 10, "max_tokens": 32},
    )
    cache = tmp_path / "cache"
    assert warm_as_job_of(spec_path, WORLD, cache).processes == 2
    return spec_path, config, cache


def train(spec_path: Path, config: Path, cache: Path, weights: Path, out: Path) -> list[dict]:
    """The job trained with WORLD processes over `cache`, in fresh processes: every rank's report, each having met the
    warmed shape with nothing new in the cache but empty lock files."""
    before = list_paths(cache)
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", config]
    command += [f"--num_processes={WORLD}", f"--main_process_port={free_port()}", TRAIN_JOB]
    command += ["--spec", spec_path, "--weights", weights, "--cache-dir", cache, "--out", out, "--steps", 2]
    command += ["--min-tokens", 10, "--split", 31, "--max-tokens", 32]
    done = run(command, timeout=1500)
    assert done.returncode == 0, done.stderr[-6000:]
    assert only_empty_locks_appeared(cache, before) == []
    reports = rank_reports(out, WORLD)
    for rank, ranked in enumerate(reports):
        assert {tuple(shape) for shape in ranked["shapes"]} == {(2, 32)}, rank
        # what ran compiled came from the cache: Inductor's FX graphs, or the trace skip's artifacts where it
        # serves every backbone call (ZeRO-2: then the rest of the forward runs eagerly and no FX graph is met)
        served = (ranked["trace_skip"] or {}).get("hits", 0)
        assert served or ranked["counters"]["inductor"].get("fxgraph_cache_hit", 0) > 0, rank
    return reports


def warm_then_train(preset: str, model: Path, weights: Path, tmp_path: Path, **args: object) -> list[dict]:
    """Warm the job, train it with WORLD processes; every rank's report."""
    return train(*warmed_job(preset, model, tmp_path, **args), weights, tmp_path / "job.json")


def test_an_fsdp2_job_warmed_with_two_processes_trains_with_three_compiling_nothing(
    tiny_model_dir, user_weights_dir, tmp_path
):
    for rank, ranked in enumerate(warm_then_train("fsdp2", tiny_model_dir, user_weights_dir, tmp_path)):
        assert ranked["distributed_type"] == "FSDP", rank
        assert _fresh(ranked) == {}, rank
        # no trace kept, and the training process says the warm-up's reason (warmup/trace_skip/losses.py)
        off = ranked["trace_skip"]["off"]
        assert off.startswith("the cache was warmed without it: fsdp2 shards the parameters"), (rank, off)


def test_a_zero2_job_warmed_with_two_processes_trains_with_three_served_untraced_or_its_artifacts_refused_from_the_caches(
    tiny_model_dir, user_weights_dir, tmp_path
):
    job = warmed_job("zero2", tiny_model_dir, tmp_path)
    for rank, ranked in enumerate(train(*job, user_weights_dir, tmp_path / "served.json")):
        assert ranked["distributed_type"] == "DEEPSPEED", rank
        assert _fresh(ranked) == {}, rank
        # DeepSpeed's engine compiles the model in place (nn.Module.compile): its backbone is split off as
        # torch.compile's wrapper's is, and every rank runs the rehearsal's artifacts (warmup/trace_skip/)
        skip = ranked["trace_skip"]
        assert skip["off"] is None and skip["hits"] > 0 and skip["misses"] == 0, (rank, skip)

    artifacts = sorted((job[2] / TRACE_DIR).glob("*.aot"))
    assert artifacts
    for path in artifacts:  # damaged in transit: each is refused as it loads
        path.write_bytes(b"not a compiled function")
    for rank, ranked in enumerate(train(*job, user_weights_dir, tmp_path / "refused.json")):
        # every rank traces the split backbone, the graph the warm-up compiled, which the caches serve
        assert _fresh(ranked) == {}, rank
        skip = ranked["trace_skip"]
        assert skip["loaded"] == 0 and sum(skip["refused"].values()) == len(artifacts), (rank, skip)
        assert skip["hits"] == 0 and skip["misses"] > 0, (rank, skip)
        assert ranked["counters"]["inductor"].get("fxgraph_cache_hit", 0) > 0, (rank, ranked["counters"])


def test_a_zero3_job_warmed_with_two_processes_trains_with_three_compiling_no_kernel(
    tiny_model_dir, user_weights_dir, tmp_path
):
    # TRL 1.16's fused SFT loss fails in backward under ZeRO-3 on CPU (the plan warns); label smoothing takes the
    # loss from the whole logits, a job TRL runs.
    reports = warm_then_train("zero3", tiny_model_dir, user_weights_dir, tmp_path, label_smoothing_factor=0.1)
    saved = len(list((tmp_path / "cache" / "aotautograd").iterdir()))
    for rank, ranked in enumerate(reports):
        assert ranked["distributed_type"] == "DEEPSPEED", rank
        fresh = _fresh(ranked)
        # Inductor compiles nothing (no FX miss, no new file: checked above). AOTAutograd re-traces, in every process,
        # the graphs its cache cannot hold (the plan warns): those holding DeepSpeed's ZeRO-3 linear autograd.Function
        # (bypass) and those that compute nothing, for which Inductor makes no code to cache (miss, never saved).
        assert set(fresh) <= {"autograd_cache_bypass", "autograd_cache_miss"}, (rank, fresh)
        aot = ranked["counters"]["aot_autograd"]
        assert aot["autograd_cache_hit"] == saved, (
            rank,
            aot,
            saved,
        )  # every AOTAutograd entry warmed is used


def _fresh(report: dict) -> dict:
    """The fresh compiles a rank counted: what is not zero."""
    return {name: value for name, value in report["fresh_compiles"].items() if value}
