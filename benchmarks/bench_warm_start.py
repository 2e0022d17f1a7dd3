"""Warm start against eager: SFT (plain, with non-reentrant gradient checkpointing, with LoRA, and under DDP with two
processes), DPO and GRPO jobs of the test model, each run five ways in fresh processes, on the stack of the
interpreter that runs it.

For each job: `eager` (the same spec with `torch_compile: false`, no cache), `cold` (compile into an empty
cache directory, activated), `warmed` (a cache `warmup warm` filled with the trace skip off,
WARMUP_TRACE_SKIP=0 in both the warm-up and the run: today's Inductor caches, Dynamo traces every graph)
and `skipped` (a cache `warmup warm` filled with the trace skip on: the backbone's graphs load traced,
warmup/trace_skip/). `floor` is the eager run that first imports every module the skipped run of the same
round imported beyond the eager run's (but warmup's own): Inductor's runtime, which loading any compiled graph
imports, and AOTAutograd's; no way that runs compiled code can start faster, so it bounds what a warm start can
reach. Every run is `tests/support/train_job.py` (`warmup.activate`, then TRL's trainer
with other weights and other data than the warm-up's), timed from process start to the end of the last
step. Prints each median, its ratio to eager, and what the warmed runs still did (FX / AOTAutograd misses,
new files in the cache, calls served without tracing). Targets: skipped / eager <= 1.15 for SFT and DPO, and
skipped / floor <= 1.10 on every job, with 0 misses and no new file; floor / eager says how much of the budget
the imports alone take. The DDP job (`ddp`) warms as a job of 2 processes and trains under
`torchrun --nproc-per-node=2`, one thread per rank as torchrun gives each; its wall is rank 0's, and its misses,
new files and calls served count every rank's. Run it with each stack's interpreter (docs/compatibility.md): the locked stack's
`.venv/bin/python`, the newest stack's `.venv-newest/bin/python`.

    python benchmarks/bench_warm_start.py [--repeat 1] [--jobs sft,sft-gc,lora,dpo,grpo,ddp]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from tests.support.jobs import GRPO_STATIC_CACHE_ARGS, GRPO_STATIC_CACHE_DATA  # noqa: E402
from tests.support.tiny_model import save_weights, write_tiny_model  # noqa: E402

TRAIN_JOB = ROOT / "tests" / "support" / "train_job.py"
BASE = {"torch_compile": True, "bf16": False, "gradient_checkpointing": False, "use_cpu": True}


@dataclass(frozen=True)
class Job:
    name: str
    args: dict[str, Any]
    data: dict[str, Any]
    low: int
    split: str
    high: int
    steps: int
    peft: dict[str, Any] | None = None
    processes: int = 1  # more than 1: a DDP job under torchrun


SFT_ARGS = {"per_device_train_batch_size": 4, "max_length": 96, "pad_to_multiple_of": 32}
SFT_DATA = {"num_train_examples": 24, "min_tokens": 10, "max_tokens": 96}
# The recipes' gradient checkpointing: non-reentrant (docs/compatibility.md)
NON_REENTRANT = {"gradient_checkpointing": True, "gradient_checkpointing_kwargs": {"use_reentrant": False}}
LORA = {"lora_r": 8, "lora_alpha": 16, "lora_target_modules": ["q_proj", "v_proj"]}
JOBS = {
    # the hidden SFT job of issue 26: three padded widths, each met twice
    "sft": Job("sft", SFT_ARGS, SFT_DATA, 10, "32,64", 96, 6),
    "sft-gc": Job("sft", {**SFT_ARGS, **NON_REENTRANT}, SFT_DATA, 10, "32,64", 96, 6),
    "lora": Job("sft", SFT_ARGS, SFT_DATA, 10, "32,64", 96, 6, peft=LORA),
    # the plain SFT job under DDP: two processes, each with its own batches of 4
    "ddp": Job("sft", SFT_ARGS, SFT_DATA, 10, "32,64", 96, 6, processes=2),
    "dpo": Job(
        "dpo",
        {"per_device_train_batch_size": 2, "max_length": 64, "pad_to_multiple_of": 32},
        {"min_tokens": 20, "max_tokens": 64},
        20,
        "32",
        64,
        4,
    ),
    "grpo": Job(
        "grpo",
        GRPO_STATIC_CACHE_ARGS,
        GRPO_STATIC_CACHE_DATA,
        5,
        "16",
        30,
        4,
    ),
}
WAYS = ("eager", "cold", "warmed", "skipped", "floor")
STACK = ("torch", "transformers", "accelerate", "trl", "peft")


def write_spec(path: Path, job: Job, model: Path, *, compile: bool = True) -> Path:
    spec: dict[str, Any] = {
        "trainer": job.name,
        "model": str(model),
        "args": {**BASE, **job.args, "torch_compile": compile},
        "data": job.data,
        "target": {"backend": "inductor", "device": "cpu"},
    }
    if job.processes > 1:
        spec["target"]["world_size"] = job.processes
    if job.peft:
        spec["peft"] = job.peft
    path.write_text(yaml.safe_dump(spec))
    return path


def env(trace_skip: bool = True, processes: int = 1) -> dict[str, str]:
    out = dict(os.environ)
    out["PYTHONPATH"] = str(ROOT) + (":" + out["PYTHONPATH"] if out.get("PYTHONPATH") else "")
    out["WARMUP_TRACE_SKIP"] = "1" if trace_skip else "0"
    if processes > 1:
        out["OMP_NUM_THREADS"] = "1"  # what torchrun gives each of several processes (in Inductor's key)
    return out


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def warm(spec: Path, cache: Path, *, trace_skip: bool, processes: int = 1) -> float:
    start = time.time()
    done = subprocess.run(
        [sys.executable, "-m", "warmup", "warm", str(spec), "--cache-dir", str(cache)],
        capture_output=True,
        text=True,
        env=env(trace_skip, processes),
    )
    if done.returncode != 0:
        raise SystemExit(f"warmup warm failed:\n{done.stdout}\n{done.stderr[-4000:]}")
    return time.time() - start


def train(
    job: Job,
    spec: Path,
    weights: Path,
    cache: Path | None,
    out: Path,
    *,
    trace_skip: bool = True,
    preimport: Path | None = None,
) -> dict[str, Any]:
    launcher = [sys.executable]
    if job.processes > 1:
        launcher += ["-m", "torch.distributed.run", f"--nproc-per-node={job.processes}"]
        launcher += ["--master-addr=127.0.0.1", f"--master-port={free_port()}"]
    command = [
        *launcher,
        str(TRAIN_JOB),
        "--spec",
        str(spec),
        "--weights",
        str(weights),
        "--out",
        str(out),
    ]
    command += ["--steps", str(job.steps), "--min-tokens", str(job.low), "--split", job.split]
    command += ["--max-tokens", str(job.high), "--data-seed", "7"]
    if cache is not None:
        cache.mkdir(parents=True, exist_ok=True)
        command += ["--cache-dir", str(cache)]
    if preimport is not None:
        command += ["--preimport", str(preimport)]
    before = _files(cache)
    start = time.time()
    done = subprocess.run(command, capture_output=True, text=True, env=env(trace_skip, job.processes))
    if done.returncode != 0:
        raise SystemExit(f"training job failed:\n{done.stderr[-6000:]}")
    report: dict[str, Any] = json.loads(out.read_text())
    report["wall"] = report["step_ends"][-1] - start
    report["ranks"] = [report] + [
        json.loads(out.with_suffix(f".rank{rank}.json").read_text()) for rank in range(1, job.processes)
    ]
    report["new_in_cache"] = sorted(f for f in _files(cache) - before if not f.endswith(".lock"))
    return report


def _files(cache: Path | None) -> set[str]:
    if cache is None or not cache.exists():
        return set()
    return {str(p.relative_to(cache)) for p in cache.rglob("*") if p.is_file()}


def floor_modules(skipped: dict[str, Any], eager: dict[str, Any], path: Path) -> Path:
    """The modules the skipped run imported beyond the eager run's, in its order; warmup's and the tests'
    own left out."""
    had = set(eager["modules"])
    extra = [m for m in skipped["modules"] if m not in had and m.split(".")[0] not in ("warmup", "tests")]
    path.write_text("\n".join(extra))
    return path


def misses(report: dict[str, Any]) -> int:
    """FX / AOTAutograd misses and bypasses, every rank's."""
    total = 0
    for ranked in report["ranks"]:
        fresh = ranked.get("fresh_compiles") or {}
        total += sum(v for k, v in fresh.items() if k != "new_files")
    return total


def served(report: dict[str, Any]) -> str:
    """Backbone calls served without tracing / all backbone calls, every rank's."""
    skips = [ranked.get("trace_skip") or {} for ranked in report["ranks"]]
    hits = sum(skip.get("hits", 0) for skip in skips)
    return f"{hits}/{hits + sum(skip.get('misses', 0) for skip in skips)}"


def median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--jobs", default=",".join(JOBS))
    ns = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="warm-start-"))
    model = write_tiny_model(root / "model")
    weights = save_weights(model, root / "weights", seed=99)
    print(f"work dir {root}; load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores", flush=True)
    print("stack: " + ", ".join(f"{name} {metadata.version(name)}" for name in STACK), flush=True)
    rows = []
    for name in ns.jobs.split(","):
        job = JOBS[name]
        spec = write_spec(root / f"{name}.yaml", job, model)
        eager_spec = write_spec(root / f"{name}-eager.yaml", job, model, compile=False)
        today, skip = root / f"{name}-today", root / f"{name}-skip"
        warm_today = warm(spec, today, trace_skip=False, processes=job.processes)
        warm_skip = warm(spec, skip, trace_skip=True, processes=job.processes)
        print(f"{name}: warmup warm {warm_today:.0f} s (trace skip off), {warm_skip:.0f} s (on)", flush=True)
        runs: dict[str, list[dict[str, Any]]] = {way: [] for way in WAYS}
        for index in range(ns.repeat):  # alternating, so that the machine's drift hits every way alike
            runs["eager"].append(train(job, eager_spec, weights, None, root / f"{name}-eager-{index}.json"))
            runs["cold"].append(
                train(job, spec, weights, root / f"{name}-cold-{index}", root / f"{name}-c{index}.json")
            )
            runs["warmed"].append(
                train(job, spec, weights, today, root / f"{name}-w{index}.json", trace_skip=False)
            )
            runs["skipped"].append(train(job, spec, weights, skip, root / f"{name}-s{index}.json"))
            modules = floor_modules(
                runs["skipped"][-1], runs["eager"][-1], root / f"{name}-floor-{index}.txt"
            )
            runs["floor"].append(
                train(job, eager_spec, weights, None, root / f"{name}-f{index}.json", preimport=modules)
            )
            print(
                f"{name} round {index + 1}: " + ", ".join(f"{w} {runs[w][-1]['wall']:.1f} s" for w in WAYS),
                flush=True,
            )
        rows.append((name, runs))

    print("\nwall seconds, process start to the end of the last step (median), and ratio to eager:")
    print(
        f"{'job':<7} "
        + " ".join(f"{w:>15}" for w in WAYS)
        + "   warmed runs: misses / new files / served untraced"
    )
    for name, runs in rows:
        eager = median([r["wall"] for r in runs["eager"]])
        cells = []
        for way in WAYS:
            value = median([r["wall"] for r in runs[way]])
            cells.append(f"{value:6.1f} ({value / eager:4.2f}x)")
        notes = []
        for way in ("warmed", "skipped"):
            last = runs[way][-1]
            notes.append(f"{way} {misses(last)} / {len(last['new_in_cache'])} / {served(last)}")
        print(f"{name:<7} " + " ".join(f"{c:>15}" for c in cells) + "   " + "; ".join(notes))
    for name, runs in rows:
        skipped, floor = (median([r["wall"] for r in runs[way]]) for way in ("skipped", "floor"))
        print(f"{name}: skipped / floor {skipped / floor:.2f}x (target <= 1.10x)")
    print(
        "\nwhere the time goes (median seconds): process start to the end of warmup.activate (eager: nothing to"
    )
    print("activate; floor: its imports), then to train() (imports, the trainer's build, artifacts loaded),")
    print("then the steps")
    print(f"{'job':<7} " + " ".join(f"{w:>24}" for w in WAYS))
    for name, runs in rows:
        cells = []
        for way in WAYS:
            activate = median([r["activated"] - r["process_start"] for r in runs[way]])
            build = median([r["train_start"] - r["activated"] for r in runs[way]])
            steps = median([r["step_ends"][-1] - r["train_start"] for r in runs[way]])
            cells.append(f"{activate:5.1f} + {build:5.1f} + {steps:5.1f}")
        print(f"{name:<7} " + " ".join(f"{c:>24}" for c in cells))
    for name, runs in rows:
        last = runs["floor"][-1]
        count, failed = last["preimported"], last["failed_preimports"]
        print(f"{name} floor: {count} modules imported first, {failed} not importable alone")
    print(
        "targets: skipped / eager <= 1.15 for sft and dpo, skipped / floor <= 1.10 on every job; 0 misses, 0 new files"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
