"""Warm-up cost: warming a plan against the compile time the same signatures cost in a cold training run.

Alternates, in one run: `warmup warm` of the job's 3-signature plan into an empty directory (wall
time of the whole command, process start to exit: planning, the supervisor's imports, one forked
run per signature, merging), a cold training run (empty cache) and a warmed training run. The
compile time a cold run spends is its train() time minus the warmed run's (same steps, same data,
nothing compiled); Dynamo's own compile-time total for the cold run is printed next to it.
Target: warm-up <= 1.25x the cold run's compile time.

    python benchmarks/bench_warm_cost.py [--repeat 2] [--jobs 1]
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from warm_runs import make_job, median, train, train_seconds, warm


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--jobs", type=int, default=1, help="warmup warm --jobs")
    ns = parser.parse_args()
    job = make_job()
    warm_s, compile_s, dynamo_s = [], [], []
    for index in range(ns.repeat):
        cache = job.root / f"warmed-{index}"
        warm_s.append(warm(job, cache, jobs=ns.jobs))
        cold = train(job, job.root / f"cold-{index}", job.root / f"cold-{index}.json")
        warmed = train(job, cache, job.root / f"warm-{index}.json")
        compile_s.append(train_seconds(cold) - train_seconds(warmed))
        dynamo_s.append(cold["dynamo_compile_seconds"])
        print(
            f"round {index + 1}: warmup warm {warm_s[-1]:.1f} s; cold run compiles {compile_s[-1]:.1f} s "
            f"(train {train_seconds(cold):.1f} s - warmed {train_seconds(warmed):.1f} s; "
            f"Dynamo says {dynamo_s[-1]:.1f} s)"
        )
        shutil.rmtree(cache)
    w, c, d = median(warm_s), median(compile_s), median(dynamo_s)
    print(
        f"\nmedian of {ns.repeat}: warmup warm (--jobs {ns.jobs}) {w:.1f} s; cold-run compile time {c:.1f} s"
    )
    print(
        f"ratio warm-up / cold compile: {w / c:.2f}x  (target <= 1.25x); against Dynamo's total: {w / d:.2f}x"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
