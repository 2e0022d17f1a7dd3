"""Cold vs warmed TRL training run of the same spec on CPU (Inductor), measured side by side.

Warms the job's plan once with `warmup warm`, then alternates cold runs (empty cache directory) and
warmed runs (the warmed directory), each a fresh process running SFTTrainer.train() for 6 steps
that meet each of the 3 planned shapes twice. Prints medians and two ratios:

- end to end: process start to the end of the last step (target: warmed >= 4x faster);
- per new shape: train() start to the end of the first step meeting that shape, and that first
  step's own duration (target: >= 10x).

    python benchmarks/bench_cold_vs_warm.py [--repeat 2]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from warm_runs import (
    first_step_durations,
    first_steps_of_new_shapes,
    make_job,
    median,
    process_to_last_step,
    train,
    warm,
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=2)
    ns = parser.parse_args()
    job = make_job()
    cache = job.root / "warmed"
    warm_s = warm(job, cache)
    print(f"warmup warm: {warm_s:.1f} s  ({job.root})")
    cold, warmed = [], []
    for index in range(ns.repeat):
        cold.append(train(job, job.root / f"cold-{index}", job.root / f"cold-{index}.json"))
        warmed.append(train(job, cache, job.root / f"warm-{index}.json"))
        print(
            f"round {index + 1}: cold {process_to_last_step(cold[-1]):.1f} s, "
            f"warmed {process_to_last_step(warmed[-1]):.1f} s (process start to last step)"
        )
    for report in warmed:
        fresh = report["fresh_compiles"]
        compiled = sum(v for k, v in fresh.items() if k != "new_files") + len(fresh["new_files"])
        assert compiled == 0, f"a warmed run compiled: {fresh}"

    e2e_cold = median([process_to_last_step(r) for r in cold])
    e2e_warm = median([process_to_last_step(r) for r in warmed])
    print(f"\nend to end (process start -> last step), median of {ns.repeat}:")
    print(
        f"  cold {e2e_cold:.1f} s   warmed {e2e_warm:.1f} s   "
        f"ratio {e2e_cold / e2e_warm:.1f}x  (target >= 4x)"
    )

    print("\ntrain() start -> end of the first step of each new shape, median:")
    shapes = list(first_steps_of_new_shapes(cold[0]))
    worst = float("inf")
    for shape in shapes:
        c = median([first_steps_of_new_shapes(r)[shape] for r in cold])
        w = median([first_steps_of_new_shapes(r)[shape] for r in warmed])
        worst = min(worst, c / w)
        print(f"  {shape:>6}: cold {c:6.1f} s   warmed {w:5.2f} s   ratio {c / w:5.1f}x")
    print(f"  smallest ratio {worst:.1f}x  (target >= 10x)")

    print("\nduration of the first step of each new shape (where it compiles), median:")
    total_cold = total_warm = 0.0
    for shape in shapes:
        c = median([first_step_durations(r)[shape] for r in cold])
        w = median([first_step_durations(r)[shape] for r in warmed])
        total_cold, total_warm = total_cold + c, total_warm + w
        print(f"  {shape:>6}: cold {c:6.1f} s   warmed {w:5.2f} s   ratio {c / w:5.1f}x")
    print(
        f"  all shapes: cold {total_cold:.1f} s   warmed {total_warm:.2f} s   "
        f"ratio {total_cold / total_warm:.1f}x"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
