"""What the warm-up benchmarks share: the job, and timed runs of `warmup warm` and of a TRL training job.

The job is an SFT run of a tiny Qwen3-style model on CPU (Inductor) whose plan has three
signatures (padded widths 32, 64 and 96); its data cycles through the three buckets so that every
run meets each shape twice. A cold run activates an empty cache directory (the same all-static
compile policy, nothing to hit); a warmed run activates the directory `warmup warm` filled.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from tests.support.tiny_model import save_weights, write_tiny_model  # noqa: E402

TRAIN_JOB = ROOT / "tests" / "e2e" / "train_job.py"
LOW, SPLITS, HIGH = 10, "32,64", 96
STEPS = 6


@dataclass
class Job:
    root: Path
    spec: Path
    weights: Path


def make_job(root: Path | None = None) -> Job:
    root = root or Path(tempfile.mkdtemp(prefix="warm-bench-"))
    model = write_tiny_model(root / "model")
    weights = save_weights(model, root / "weights", seed=99)
    spec = {
        "trainer": "sft",
        "model": str(model),
        "args": {
            "per_device_train_batch_size": 4,
            "max_length": HIGH,
            "pad_to_multiple_of": 32,
            "torch_compile": True,
            "bf16": False,
            "gradient_checkpointing": False,
            "use_cpu": True,
        },
        "data": {"num_train_examples": 4 * STEPS, "min_tokens": LOW, "max_tokens": HIGH},
        "target": {"backend": "inductor", "device": "cpu"},
    }
    path = root / "job.yaml"
    path.write_text(yaml.safe_dump(spec))
    return Job(root, path, weights)


def _env() -> dict[str, str]:
    import os

    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (":" + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def warm(job: Job, cache: Path, *, jobs: int = 1) -> float:
    """Wall seconds of `warmup warm` into an empty `cache`, process start to exit."""
    start = time.time()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "warmup",
            "warm",
            str(job.spec),
            "--cache-dir",
            str(cache),
            "--jobs",
            str(jobs),
        ],
        capture_output=True,
        text=True,
        env=_env(),
    )
    seconds = time.time() - start
    if done.returncode != 0:
        raise SystemExit(f"warmup warm failed:\n{done.stdout}\n{done.stderr[-4000:]}")
    return seconds


def train(job: Job, cache: Path, out: Path) -> dict[str, Any]:
    """A training run over `cache` (empty: cold) in a fresh process: its report, with start/exit times."""
    cache.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, str(TRAIN_JOB), "--spec", str(job.spec), "--weights", str(job.weights)]
    command += ["--cache-dir", str(cache), "--out", str(out), "--steps", str(STEPS)]
    command += ["--min-tokens", str(LOW), "--split", SPLITS, "--max-tokens", str(HIGH)]
    start = time.time()
    done = subprocess.run(command, capture_output=True, text=True, env=_env())
    end = time.time()
    if done.returncode != 0:
        raise SystemExit(f"training job failed:\n{done.stderr[-20000:]}")
    report = json.loads(out.read_text())
    report.update(popen=start, exit=end)
    return report


def process_to_last_step(report: dict[str, Any]) -> float:
    return report["step_ends"][-1] - report["popen"]


def train_seconds(report: dict[str, Any]) -> float:
    return report["step_ends"][-1] - report["train_start"]


def first_steps_of_new_shapes(report: dict[str, Any]) -> dict[str, float]:
    """For each shape, seconds from train() start to the end of the first step that met it."""
    seen: dict[str, float] = {}
    for shape, end in zip(report["shapes"], report["step_ends"], strict=True):
        label = "x".join(str(x) for x in shape)
        seen.setdefault(label, end - report["train_start"])
    return seen


def first_step_durations(report: dict[str, Any]) -> dict[str, float]:
    """For each shape, the duration of the first step that met it (where its compile happens)."""
    durations: dict[str, float] = {}
    previous = report["train_start"]
    for shape, end in zip(report["shapes"], report["step_ends"], strict=True):
        durations.setdefault("x".join(str(x) for x in shape), end - previous)
        previous = end
    return durations


def median(values: list[float]) -> float:
    return statistics.median(values)
