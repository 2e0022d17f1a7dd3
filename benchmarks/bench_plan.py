"""Planning speed: target: a spec planned in under 50 ms once its model config is read.

Plans a Neuron SFT spec with eval and a GRPO-style spec many times after one warm-up call (the
first call builds TRL's config class and reads config.json), and prints the median and p99 per
plan against the 50 ms budget, as a ratio.

    python benchmarks/bench_plan.py
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.tiny_model import write_tiny_model
from warmup.job.model_facts import read_model_facts
from warmup.job.spec import load_spec
from warmup.job.trl_args import resolve_trainer_args
from warmup.planner.planning import plan

BUDGET_S = 0.050
RUNS = 200


def bench(name: str, spec_dict: dict) -> None:
    spec = load_spec(spec_dict)
    args = resolve_trainer_args(spec)
    model = read_model_facts(spec.model)
    result = plan(spec, args, model)
    times = []
    for _ in range(RUNS):
        start = time.perf_counter()
        plan(spec, args, model)
        times.append(time.perf_counter() - start)
    times.sort()
    median, p99 = statistics.median(times), times[int(len(times) * 0.99) - 1]
    print(
        f"{name:<28} {len(result.signatures):>4} signatures  median {median * 1e3:7.3f} ms  "
        f"p99 {p99 * 1e3:7.3f} ms  budget/p99 = {BUDGET_S / p99:7.1f}x"
    )


def main() -> None:
    model_dir = write_tiny_model(Path(tempfile.mkdtemp()) / "tiny")
    neuron = {"backend": "neuron", "device": "neuron", "world_size": 1}
    bench(
        "sft neuron, eval, 4k tokens",
        {
            "trainer": "sft",
            "model": str(model_dir),
            "args": {"per_device_train_batch_size": 8, "max_length": 4096, "eval_strategy": "steps"},
            "data": {"num_train_examples": 10001, "num_eval_examples": 501, "max_tokens": 4000},
            "target": neuron,
        },
    )
    bench(
        "sft neuron, bfd packing",
        {
            "trainer": "sft",
            "model": str(model_dir),
            "args": {"per_device_train_batch_size": 8, "max_length": 1024, "packing": True},
            "target": neuron,
        },
    )


if __name__ == "__main__":
    main()
