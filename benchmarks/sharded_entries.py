"""Experiment (not a speed target): what a sharding mode (FSDP, DeepSpeed ZeRO) changes in the compiled entries.

Runs the rehearsal of one signature of a tiny SFT job (`train 2x32`, torch_compile, fp32 on CPU) under each
configuration's own launcher, `accelerate launch --config_file <TRL's preset> --num_processes R`, each rank with a
cache directory of its own, and compares what every rank left there with the first rank of a reference
configuration: FX graph and AOTAutograd keys, generated code and kernels (as benchmarks/world_size_entries.py does).
It also records, per rank, the wrapper accelerate built, the local shape of the first parameters (a shard under
FSDP), the graphs Dynamo made, the AOTAutograd cache's bypasses, and any collective in the generated code.

    python benchmarks/sharded_entries.py [--work DIR] [--configs single:1,multi_gpu:2,fsdp2:1,fsdp2:2,fsdp2:3,...]
                                         [--reference fsdp2:2] [--hidden 64] [--args '{"label_smoothing_factor": 0.1}']

A configuration is `PRESET:RANKS` (PRESET: one of TRL's accelerate presets, `single` for one plain process, or a
preset with `+offload` for ZeRO's CPU offload). Each preset runs in fp32 (`mixed_precision: 'no'`). FSDP runs on CPU
through warmup.rehearsal.cpu_sharding, as the rehearsal does; `--no-shim` leaves accelerate as it is.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.world_size_entries import free_port, listing, work_and_model  # noqa: E402
from benchmarks.world_size_entries import spec_for as world_size_spec  # noqa: E402

COLLECTIVE = re.compile(r"torch\.ops\.(?:_c10d_functional|c10d|_dtensor)\.\w+")


def accelerate_config(work: Path, preset: str, ranks: int) -> Path:
    name, _, offload = preset.partition("+")
    if name == "single":
        config: dict[str, Any] = {"distributed_type": "NO", "num_processes": 1, "num_machines": 1}
    else:
        text = resources.files("trl.accelerate_configs").joinpath(f"{name}.yaml").read_text()
        config = yaml.safe_load(text)
    config.update(mixed_precision="no", num_processes=ranks)
    if offload:
        config["deepspeed_config"].update(offload_optimizer_device="cpu")
        if config["deepspeed_config"].get("zero_stage") == 3:
            config["deepspeed_config"].update(offload_param_device="cpu")
    path = work / f"{preset}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def spec_for(model: Path, ranks: int, config: Path, extra: dict[str, Any], shim: bool) -> dict[str, Any]:
    """world_size_entries' job (`train 2x32`), with more trainer fields, and its launch when FSDP needs the shim."""
    spec = world_size_spec(model, ranks)
    spec["args"].update(extra)
    if shim:  # the rehearsal reads the launch from the spec and takes FSDP's path on CPU
        spec["args"]["accelerate_config"] = str(config)
    return spec


def rank_main(job_path: Path) -> int:
    """One rank: rehearse the job's unit into DIR/rank<R>/cache, then record what it built and compiled."""
    from torch._dynamo.utils import counters

    from warmup.rehearsal import drivers

    rank = int(os.environ.get("RANK", "0"))
    template = drivers.RunJob.from_json(job_path.read_text())
    base = job_path.parent / f"rank{rank}"
    job = drivers.RunJob(template.spec, template.units, base / "cache", base / "work", template.plan_size)
    job.cache_dir.mkdir(parents=True, exist_ok=True)
    built: dict[str, Any] = {}
    build_trainer = drivers.build_trainer

    def keeping_the_trainer(job: Any) -> Any:
        built["trainer"], observed = build_trainer(job)
        return built["trainer"], observed

    drivers.build_trainer = keeping_the_trainer
    outcome = drivers.run(job)
    trainer = built["trainer"]
    wrapped = trainer.model_wrapped
    shapes = {}
    for name, parameter in list(trainer.model.named_parameters())[:3]:
        local = parameter.to_local() if hasattr(parameter, "to_local") else parameter
        shapes[name] = {"shape": list(parameter.shape), "local": list(local.shape)}
    code = [p.read_text(errors="replace") for p in job.cache_dir.rglob("*.py")]
    (base / "outcome.json").write_text(
        json.dumps(
            {
                "outcome": outcome,
                "distributed_type": str(trainer.accelerator.distributed_type.value),
                "wrapper": f"{type(wrapped).__name__}({type(getattr(wrapped, '_orig_mod', wrapped)).__name__})",
                "parameters": shapes,
                "graphs": counters["stats"]["unique_graphs"],
                "aot_bypass": counters["aot_autograd"]["autograd_cache_bypass"],
                "aot_unsaved": counters["aot_autograd"]["autograd_cache_miss"]
                - counters["aot_autograd"]["autograd_cache_saved"],
                "collectives": sorted({m for text in code for m in COLLECTIVE.findall(text)}),
            }
        )
    )
    return 0


def run_config(
    work: Path, model: Path, preset: str, ranks: int, extra: dict[str, Any], shim: bool
) -> list[dict]:
    from warmup.job.spec import Spec
    from warmup.planner.planning import plan_spec
    from warmup.rehearsal.drivers import RunJob
    from warmup.rehearsal.units import plan_units

    directory = work / f"{preset}-{ranks}"
    directory.mkdir(parents=True)
    config = accelerate_config(directory, preset, ranks)
    spec = Spec.model_validate(spec_for(model, ranks, config, extra, shim and preset.startswith("fsdp")))
    signatures = plan_spec(spec).signatures
    units = plan_units("sft", signatures, backend="inductor", pad_to_multiple_of=32).units
    job_path = directory / "run.json"
    job_path.write_text(RunJob(spec, units, directory, directory, len(signatures)).to_json())
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config)]
    command += [
        f"--num_processes={ranks}",
        f"--main_process_port={free_port()}",
        __file__,
        "--rank-job",
        str(job_path),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    start = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{preset}:{ranks} failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}")
    return [
        {
            "config": f"{preset}:{ranks}",
            "rank": rank,
            "seconds": round(seconds, 1),
            **json.loads((directory / f"rank{rank}" / "outcome.json").read_text()),
            **listing(directory / f"rank{rank}" / "cache"),
        }
        for rank in range(ranks)
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path)
    parser.add_argument("--configs", default="single:1,multi_gpu:2,fsdp2:1,fsdp2:2,fsdp2:3")
    parser.add_argument("--reference", default=None, help="PRESET:RANKS to compare with (default: the first)")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--args", default="{}", help="more trainer config fields, as JSON")
    parser.add_argument("--no-shim", action="store_true", help="FSDP on CPU as plain accelerate runs it")
    parser.add_argument("--rank-job", type=Path, help=argparse.SUPPRESS)
    ns = parser.parse_args()
    if ns.rank_job:
        return rank_main(ns.rank_job)

    work, model = work_and_model(ns.work, "sharded-", ns.hidden)
    results = []
    for item in ns.configs.split(","):
        preset, ranks = item.rsplit(":", 1)
        results += run_config(work, model, preset, int(ranks), json.loads(ns.args), not ns.no_shim)
        print(f"ran {item}", file=sys.stderr, flush=True)
    (work / "results.json").write_text(json.dumps(results, indent=1))
    reference_name = ns.reference or results[0]["config"]
    reference = next(r for r in results if r["config"] == reference_name and r["rank"] == 0)
    headers = [
        "config",
        "rank",
        "accelerate",
        "wrapper",
        "first local shape",
        "graphs",
        "FX keys",
        "AOT keys",
    ]
    headers += ["AOT bypass / unsaved", "collectives", "same FX keys", "same AOT keys", "same kernels"]
    print("| " + " | ".join(headers) + " |")
    print("|" + "---|" * len(headers))
    for result in results:
        first = next(iter(result["parameters"].values()))
        kernels = {p for p in result["files"] if p.endswith(".so")}
        row = [
            result["config"],
            result["rank"],
            result["distributed_type"],
            result["wrapper"],
            "x".join(map(str, first["local"])),
            result["graphs"],
            len(result["fx"]),
            len(result["aot"]),
            f"{result['aot_bypass']} / {result['aot_unsaved']}",
            ", ".join(result["collectives"]) or "none",
            "yes" if result["fx"] == reference["fx"] else "no",
            "yes" if result["aot"] == reference["aot"] else "no",
            "yes" if kernels == {p for p in reference["files"] if p.endswith(".so")} else "no",
        ]
        print("| " + " | ".join(str(cell) for cell in row) + " |")
    print(f"\nreference: {reference_name} rank 0; listings in {work / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
