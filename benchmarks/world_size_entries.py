"""Experiment (not a speed target): which parts of a compiled entry depend on the job's world size.

Runs the rehearsal of one signature (a tiny SFT job, `train 2x32`, torch_compile on CPU) as each
configuration below would: N processes under `torchrun` (gloo, DDP), each rank with a cache directory
of its own, then compares what every rank left in its directory: the FX graph keys, the AOTAutograd
keys, the artifact files (paths; bytes too, but for the `.so` kernels, whose bytes embed the build
directory), the compile key tag and the thread count.

    python benchmarks/world_size_entries.py [--work DIR] [--configs 1x2,1x1,2x1,3x1] [--hidden 64]
                                            [--train-at 3]

A configuration `RxT` is R ranks of T threads each (OMP_NUM_THREADS=T). It prints one row per
configuration and rank, compared with the first rank of the reference configuration (`--reference`,
default 2x1: what `warmup warm` runs for a job of 2 or more processes), and writes every rank's
listing to WORK/results.json. `--hidden 256` makes the model larger than DDP's first gradient bucket,
so that Dynamo's DDP optimizer splits the graph at bucket boundaries. `--train-at 3` then warms a
job of 3 processes as `warmup warm` does (with 2) and trains it with 3 over that cache
(`tests/support/train_job.py`, other weights and data), printing each rank's fresh compiles.
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
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
TRAIN_JOB = ROOT / "tests" / "e2e" / "train_job.py"


def spec_for(model: Path, world_size: int) -> dict[str, Any]:  # one signature: train 2x32
    return {
        "trainer": "sft",
        "model": str(model),
        "args": {
            "per_device_train_batch_size": 2,
            "max_length": 32,
            "pad_to_multiple_of": 32,
            "torch_compile": True,
            "bf16": False,
            "gradient_checkpointing": False,
            "use_cpu": True,
        },
        "data": {"min_tokens": 10, "max_tokens": 32},
        "target": {"backend": "inductor", "device": "cpu", "world_size": world_size},
    }


def rank_main(job_path: Path) -> int:
    """One rank: rehearse the job's unit into WORK/rank<R>/cache, then list what is there."""
    import torch

    from warmup.rehearsal.drivers import RunJob, run

    rank = int(os.environ.get("RANK", "0"))
    template = RunJob.from_json(job_path.read_text())
    base = job_path.parent / f"rank{rank}"
    job = RunJob(template.spec, template.units, base / "cache", base / "work", template.plan_size)
    job.cache_dir.mkdir(parents=True, exist_ok=True)
    outcome = run(job)
    (base / "outcome.json").write_text(
        json.dumps(
            {
                "outcome": outcome,
                "threads": torch.get_num_threads(),
                "key_tag": os.environ.get("TORCH_COMPILE_CACHE_KEY_TAG"),
                "world_size": int(os.environ.get("WORLD_SIZE", "1")),
                "ddp": torch.distributed.is_initialized(),
            }
        )
    )
    return 0


def listing(cache: Path) -> dict[str, Any]:
    """Every artifact file by path, with a digest of its content where the content says something.

    An FX graph or AOTAutograd entry is a file `<key>/<sha256 of its content>`, and that content
    holds what differs from process to process whatever it compiles (the cache directory's path, a
    memory address in its debug lines, compile times): it is listed as `<key>/<entry>`, compared by
    its key. `.so` kernels embed their build directory: compared by path. The rest (generated C++ and
    Python) by content.
    """
    from warmup.artifacts import sha256_file
    from warmup.backends.registry import get_backend

    backend = get_backend("inductor", "cpu")
    files = {}
    for path in sorted(p for p in cache.rglob("*") if p.is_file()):
        relative = path.relative_to(cache).as_posix()
        if not backend.is_artifact(relative):
            continue
        if relative.startswith(("fxgraph/", "aotautograd/")):
            files[f"{path.parent.relative_to(cache).as_posix()}/<entry>"] = ""
        else:
            files[relative] = "" if relative.endswith(".so") else sha256_file(path)
    return {
        "fx": sorted(p.name for p in (cache / "fxgraph").glob("*/*") if p.is_dir()),
        "aot": sorted(p.name for p in (cache / "aotautograd").glob("*") if p.is_dir()),
        "files": files,
    }


def work_and_model(work: Path | None, prefix: str, hidden: int) -> tuple[Path, Path]:
    """The work directory (a new one under the temp dir when not given) and the tiny model written in it."""
    from tests.support.tiny_model import write_tiny_model

    work = (work or Path(tempfile.mkdtemp(prefix=prefix))).absolute()
    work.mkdir(parents=True, exist_ok=True)
    return work, write_tiny_model(work / "model", hidden=hidden)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_config(work: Path, model: Path, ranks: int, threads: int) -> list[dict[str, Any]]:
    from warmup.job.spec import Spec
    from warmup.planner.planning import plan_spec
    from warmup.rehearsal.drivers import RunJob
    from warmup.rehearsal.units import plan_units

    spec = Spec.model_validate(spec_for(model, ranks))
    signatures = plan_spec(spec).signatures
    units = plan_units("sft", signatures, backend="inductor", pad_to_multiple_of=32).units
    directory = work / f"{ranks}x{threads}"
    directory.mkdir(parents=True)
    job_path = directory / "run.json"
    job_path.write_text(RunJob(spec, units, directory, directory, len(signatures)).to_json())
    command = [sys.executable, __file__, "--rank-job", str(job_path)]
    if ranks > 1:
        command = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={ranks}"]
        command += ["--master-addr=127.0.0.1", f"--master-port={free_port()}", __file__]
        command += ["--rank-job", str(job_path)]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(ROOT)}
    start = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{ranks}x{threads} failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}")
    results = []
    for rank in range(ranks):
        outcome = json.loads((directory / f"rank{rank}" / "outcome.json").read_text())
        results.append(
            {
                "config": f"{ranks}x{threads}",
                "rank": rank,
                "seconds": round(seconds, 1),
                **outcome,
                **listing(directory / f"rank{rank}" / "cache"),
            }
        )
    return results


def warm_then_train(work: Path, model: Path, world_size: int) -> list[dict[str, Any]]:
    """`warm_directory` for a job of `world_size` processes (it rehearses 2), then the job's own
    training under `torchrun --nproc-per-node=world_size` over that cache: each rank's fresh compiles."""
    import yaml

    from tests.support.tiny_model import save_weights
    from warmup.artifacts import list_paths
    from warmup.job.spec import Spec
    from warmup.rehearsal.local import warm_directory

    root = work / f"train-at-{world_size}"
    root.mkdir(parents=True)
    spec = spec_for(model, world_size)
    spec_path = root / "job.yaml"
    spec_path.write_text(yaml.safe_dump(spec))
    start = time.perf_counter()
    report = warm_directory(Spec.model_validate(spec), root / "cache")
    warm_seconds = time.perf_counter() - start
    if not report.ok:
        raise SystemExit(f"warm-up failed: {[(r.note, r.log_tail[-2000:]) for r in report.results]}")
    before = list_paths(root / "cache")
    weights = save_weights(model, root / "weights", seed=5)
    command = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={world_size}"]
    command += ["--master-addr=127.0.0.1", f"--master-port={free_port()}", str(TRAIN_JOB)]
    command += ["--spec", str(spec_path), "--weights", str(weights), "--cache-dir", str(root / "cache")]
    command += ["--out", str(root / "job.json"), "--steps", "2", "--min-tokens", "10", "--split", "31"]
    command += ["--max-tokens", "32"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"training failed:\n{done.stderr[-6000:]}")
    appeared = sorted(p for p in list_paths(root / "cache") - before if not p.startswith("locks/"))
    rows = []
    for rank in range(world_size):
        out = root / ("job.json" if rank == 0 else f"job.rank{rank}.json")
        result = json.loads(out.read_text())
        fresh = result["fresh_compiles"]
        rows.append(
            {
                "rank": rank,
                "warmed_with": report.processes,
                "warm_seconds": round(warm_seconds, 1),
                "fx_hits": result["counters"].get("inductor", {}).get("fxgraph_cache_hit", 0),
                "aot_hits": result["counters"].get("aot_autograd", {}).get("autograd_cache_hit", 0),
                **{name: (len(value) if name == "new_files" else value) for name, value in fresh.items()},
                "new_files_but_locks": len(appeared),
            }
        )
    return rows


def same(ours: dict[str, str], theirs: dict[str, str], *, bytes_too: bool) -> str:
    if set(ours) != set(theirs):
        return f"no ({len(set(ours) ^ set(theirs))} differ)"
    if bytes_too:
        differ = [p for p in ours if ours[p] != theirs[p]]
        if differ:
            return f"paths yes, bytes: {len(differ)} differ"
    return "yes"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path)
    parser.add_argument("--configs", default="1x2,1x1,2x1,3x1")
    parser.add_argument("--reference", default="2x1")
    parser.add_argument(
        "--hidden",
        type=int,
        default=64,
        help="model width: 64 fits in DDP's first gradient bucket (1 MB), 256 does not",
    )
    parser.add_argument(
        "--train-at",
        type=int,
        help="then warm a job of this many processes (with 2) and train it at that many, over the cache",
    )
    parser.add_argument("--rank-job", type=Path, help=argparse.SUPPRESS)
    ns = parser.parse_args()
    if ns.rank_job:
        return rank_main(ns.rank_job)

    work, model = work_and_model(ns.work, "world-size-", ns.hidden)
    configs = [tuple(int(x) for x in item.split("x")) for item in ns.configs.split(",")]
    results = []
    for ranks, threads in configs:
        results += run_config(work, model, ranks, threads)
        print(f"ran {ranks}x{threads}", file=sys.stderr, flush=True)
    (work / "results.json").write_text(json.dumps(results, indent=1))
    reference = next(r for r in results if r["config"] == ns.reference and r["rank"] == 0)
    headers = ["ranks x threads", "rank", "DDP", "key tag threads", "FX keys", "AOT keys", "files"]
    headers += ["same FX keys", "same AOT keys", "same files (entries, kernels)"]
    print("| " + " | ".join(headers) + " |")
    print("|" + "---|" * len(headers))
    for result in results:
        row = [
            result["config"],
            result["rank"],
            "yes" if result["ddp"] else "no",
            result["key_tag"].rsplit("threads=", 1)[-1],
            len(result["fx"]),
            len(result["aot"]),
            len(result["files"]),
            "yes" if result["fx"] == reference["fx"] else "no",
            "yes" if result["aot"] == reference["aot"] else "no",
            same(result["files"], reference["files"], bytes_too=True),
        ]
        print("| " + " | ".join(str(cell) for cell in row) + " |")
    print(f"\nreference: {ns.reference} rank 0; listings in {work / 'results.json'}")
    if ns.train_at:
        rows = warm_then_train(work, model, ns.train_at)
        print(f"\nwarmed with {rows[0]['warmed_with']} processes, trained with {ns.train_at}:")
        print("| " + " | ".join(rows[0]) + " |")
        print("|" + "---|" * len(rows[0]))
        for row in rows:
            print("| " + " | ".join(str(value) for value in row.values()) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
