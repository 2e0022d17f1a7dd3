"""Helpers of the end-to-end tests: specs on disk, hand-built signatures, a user's job in a fresh process."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from warmup.job.model_facts import read_model_facts
from warmup.signature import Signature

TRAIN_JOB = Path(__file__).with_name("train_job.py")

# GRPO with a static KV cache (tests/e2e/test_zero_compile.py, benchmarks/bench_warm_start.py): prompts of
# 5..30 tokens pad to 16 or 32; completions of at most 8 pad to 16; cache 32 + 8 - 1.
GRPO_STATIC_CACHE_ARGS: dict[str, Any] = {
    "per_device_train_batch_size": 4,
    "num_generations": 4,
    "max_completion_length": 8,
    "pad_to_multiple_of": 16,
    "cache_implementation": "static",
    "generation_kwargs": {"max_cache_len": 39},
    "beta": 0.04,
}
GRPO_STATIC_CACHE_DATA: dict[str, Any] = {"min_prompt_tokens": 5, "max_prompt_tokens": 30}


def write_spec(
    path: Path, trainer: str, model: Path, args: dict[str, Any], data: dict[str, Any], **extra: Any
) -> Path:
    """A spec file for an Inductor job on this CPU; `extra` adds top-level fields (peft, teacher_model)."""
    spec = {
        "trainer": trainer,
        "model": str(model),
        "args": {
            "torch_compile": True,
            "bf16": False,
            "gradient_checkpointing": False,
            "use_cpu": True,
            **args,
        },
        "data": data,
        "target": {"backend": "inductor", "device": "cpu"},
        **{key: str(value) if isinstance(value, Path) else value for key, value in extra.items()},
    }
    path.write_text(yaml.safe_dump(spec))
    return path


def warm_as_job_of(spec_path: Path, world: int, cache: Path) -> Any:
    """Warm the spec at `spec_path` as a job of `world` processes (it is rewritten so), as `warmup warm` does
    (`warm_directory`, which rehearses with fewer); the report, its one signature warmed for that world size."""
    from warmup.job.spec import load_spec
    from warmup.rehearsal.local import warm_directory

    spec_path.write_text(spec_path.read_text().replace("device: cpu", f"device: cpu\n  world_size: {world}"))
    report = warm_directory(load_spec(spec_path), cache)
    assert report.ok, [(r.signature.shape_label, r.note, r.log_tail[-3000:]) for r in report.results]
    (result,) = report.results
    assert result.signature.world_size == world and result.files
    return report


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def signature(trainer: str, model: Path, phase: str, batch: int, seq_len: int, **kw: Any) -> Signature:
    """A signature as the planner writes it, for tests that pick shapes the plan would not list."""
    return Signature(
        phase=phase,
        batch=batch,
        seq_len=seq_len,
        cache_len=kw.pop("cache_len", None),
        trainer=trainer,
        model=read_model_facts(str(model)).config_hash,
        dtype="float32",
        compile=kw.pop("compile", "inductor"),
        settings=kw,
    )


def run(command: list[str], timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(part) for part in command], capture_output=True, text=True, timeout=timeout)


def run_job(
    spec: Path,
    weights: Path,
    cache: Path | None,
    out: Path,
    *,
    low: int,
    split: int,
    high: int,
    **options: Any,
) -> dict[str, Any]:
    """Run train_job.py in a fresh process; its JSON report. Fails the test with the job's output."""
    command = [sys.executable, TRAIN_JOB, "--spec", spec, "--weights", weights, "--out", out]
    command += ["--min-tokens", low, "--split", split, "--max-tokens", high]
    if cache is not None:
        command += ["--cache-dir", cache]
    for name, value in options.items():
        command += [f"--{name.replace('_', '-')}", value]
    done = run(command)
    assert done.returncode == 0, f"training job failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    return json.loads(out.read_text())


def run_job_under_torchrun(
    spec: Path,
    weights: Path,
    cache: Path,
    out: Path,
    *,
    ranks: int,
    low: int,
    split: int,
    high: int,
    **options: Any,
) -> list[dict[str, Any]]:
    """Run train_job.py as `ranks` processes under torchrun in fresh processes; each rank's JSON report, rank 0's
    first. Fails the test with the job's output."""
    command = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={ranks}"]
    command += ["--master-addr=127.0.0.1", f"--master-port={free_port()}", TRAIN_JOB, "--spec", spec]
    command += ["--weights", weights, "--cache-dir", cache, "--out", out]
    command += ["--min-tokens", low, "--split", split, "--max-tokens", high]
    for name, value in options.items():
        command += [f"--{name.replace('_', '-')}", value]
    done = run(command)
    assert done.returncode == 0, done.stderr[-6000:]
    return rank_reports(out, ranks)


def rank_reports(out: Path, ranks: int) -> list[dict[str, Any]]:
    """The reports train_job.py's ranks wrote for `--out OUT`: OUT for rank 0, OUT.rank<k>.json for the others."""
    paths = [out if rank == 0 else out.with_suffix(f".rank{rank}.json") for rank in range(ranks)]
    return [json.loads(path.read_text()) for path in paths]


def known_trace_loss(*, checkpointed: bool = False) -> str | None:
    """Why the trace skip keeps no trace of the tiny Qwen3 model on this stack, where the reason is known and
    said, else None. Where `kernels` is installed (a dependency from transformers 5.25 on): a job under
    gradient checkpointing (non-reentrant there by default) sets kernels' context variable inside the
    checkpoint, which the split has torch trace once in the forward, unless that seam does not hold here; and
    where the seam to kernels' function classes does not hold, Qwen3 calls an object of a class defined in a
    local scope, which torch cannot save (warmup/_compat/kernels.py, docs/compile-caches.md)."""
    from warmup.trace_skip.losses import KNOWN_LOSSES, hub_kernels_checkpoint_loss, hub_kernels_loss

    if checkpointed and hub_kernels_checkpoint_loss() is not None:
        return dict(KNOWN_LOSSES)["torch.utils.checkpoint"]  # the reason `warmup warm` reports: torch's part
    return hub_kernels_loss()


def served_warm(report: dict[str, Any]) -> bool:
    """The warmed cache served the run: the trace skip's artifacts served every backbone call (warmup/trace_skip/),
    or, where it is off, Inductor's FX graph and AOTAutograd caches were hit (not a run that compiled nothing)."""
    skip = report.get("trace_skip") or {}
    if skip.get("hits"):
        return bool(skip.get("misses") == 0)
    counters = report["counters"]
    return (
        counters.get("inductor", {}).get("fxgraph_cache_hit", 0) > 0
        and counters.get("aot_autograd", {}).get("autograd_cache_hit", 0) > 0
    )


def no_fresh_compiles(report: dict[str, Any]) -> bool:
    fresh = report["fresh_compiles"]
    return (
        all(value == 0 for name, value in fresh.items() if name != "new_files") and fresh["new_files"] == []
    )


def only_empty_locks_appeared(cache: Path, before: set[str]) -> list[str]:
    """Files that appeared in `cache` since `before`, other than empty lock files; [] is the goal.

    Inductor takes a file lock (`locks/<kernel>.lock`, empty) each time it loads a kernel, even on a
    cache hit; a lock is coordination, not a compile. Anything else appearing means something compiled.
    """
    from warmup.artifacts import list_paths

    appeared = sorted(list_paths(cache) - before)
    return [
        path
        for path in appeared
        if not (path.startswith("locks/") and path.endswith(".lock") and (cache / path).stat().st_size == 0)
    ]
