"""Benchmark: a training process's first step over a warm cache, with and without building a precompiled header.

The first time a process loads a C++ kernel, Inductor precompiles the kernels' common header into
`<temp dir>/torchinductor_<user>/precompiled_headers`, whether any kernel is built or not; a pod in a fresh
container (an empty temp dir) builds it at every start. Under `warmup exec` and `warmup.activate` a training
process includes the header as text instead, only when a kernel is built (warmup/layout.py,
`defer_precompiled_headers`). This measures what that saves: the probe of benchmarks/relocation_factors.py (a
small model compiled for training, its first forward and backward) is warmed once, then run over a copy of
the warm cache in fresh processes with an empty temp dir, alternately as a warm-up worker runs it (the header
built) and as a training process does (not built), each time in the same environment otherwise.

    python benchmarks/bench_pod_header.py [--rounds 3] [--work DIR]

Prints each round, the medians of the first step's seconds (compile, load and run; the process's imports
excluded), and their ratio. Every run must hit the cache: a run that compiled anything is an error.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from relocation_factors import base_env, gxx_kinds, probe


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "bench-pod-header")
    ns = parser.parse_args()
    work = ns.work.absolute()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    env = base_env(work, normalise=True)  # the reference: a warm-up worker, under the canonical layout
    warm = work / "warm" / "cache"
    probe(sys.executable, warm, env, work / "warm")
    seconds: dict[str, list[float]] = {"header built": [], "header deferred": []}
    for index in range(ns.rounds):
        for name, mode in (("header built", "worker"), ("header deferred", "pod")):
            run = work / f"{index}-{mode}"
            (run / "tmp").mkdir(parents=True)  # a fresh container's empty temp dir
            cache = run / "cache"
            shutil.copytree(warm, cache)
            result = probe(
                sys.executable, cache, {**env, "RELOCATION_LAYOUT": mode, "TMPDIR": str(run / "tmp")}, run
            )
            if result["new_files"] or result["counters"].get("fxgraph_cache_miss"):
                raise SystemExit(
                    f"round {index} ({name}) compiled: {result['counters']}, {result['new_files'][:5]}"
                )
            seconds[name].append(result["seconds"])
            print(
                f"round {index + 1} {name:<16} first step {result['seconds']:6.2f}s  g++: {gxx_kinds(result['gxx'])}"
            )
    built, deferred = (statistics.median(seconds[name]) for name in ("header built", "header deferred"))
    print(
        f"\nmedian first step: header built {built:.2f}s, header deferred {deferred:.2f}s; ratio {deferred / built:.2f}"
    )


if __name__ == "__main__":
    main()
