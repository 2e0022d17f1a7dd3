"""Warm-up cost per signature: LoRA against full fine-tuning, side by side.

The same SFT job of a tiny Qwen3-style model on CPU (Inductor), once training every weight and once with a
LoRA adapter (rank 16 on the attention and MLP projections, as TRL's scripts build it from `--use_peft`), is
warmed with `warmup warm` into empty directories, alternating full and LoRA in each round. Per signature:
Dynamo's compile seconds of the step that produced it (from the cache manifest), the wall time of the whole
`warmup warm` command divided by the signatures it warmed, and the entry's size. Prints the LoRA / full ratio
of each, medians over the rounds.

    python benchmarks/bench_lora_warm_cost.py [--repeat 2] [--gradient-checkpointing]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import yaml  # noqa: E402
from warm_runs import _env  # noqa: E402

from tests.support.tiny_model import write_tiny_model  # noqa: E402

LORA = {
    "lora_r": 16,
    "lora_alpha": 32,
    "lora_target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
}


def write_job(root: Path, model: Path, *, lora: bool, checkpointing: bool) -> Path:
    spec: dict[str, Any] = {
        "trainer": "sft",
        "model": str(model),
        "args": {
            "per_device_train_batch_size": 4,
            "max_length": 64,
            "pad_to_multiple_of": 32,  # two signatures: widths 32 and 64
            "torch_compile": True,
            "bf16": False,
            "gradient_checkpointing": checkpointing,
            "use_cpu": True,
        },
        "data": {"num_train_examples": 8, "min_tokens": 10, "max_tokens": 64},
        "target": {"backend": "inductor", "device": "cpu"},
    }
    if lora:
        spec["peft"] = LORA
    path = root / ("lora.yaml" if lora else "full.yaml")
    path.write_text(yaml.safe_dump(spec))
    return path


def warm(spec: Path, cache: Path) -> dict[str, float]:
    import subprocess

    start = time.time()
    done = subprocess.run(
        [sys.executable, "-m", "warmup", "warm", str(spec), "--cache-dir", str(cache)],
        capture_output=True,
        text=True,
        env=_env(),
    )
    wall = time.time() - start
    if done.returncode != 0:
        raise SystemExit(f"warmup warm failed:\n{done.stdout}\n{done.stderr[-4000:]}")
    entries = list(json.loads((cache / "trl-warmup.json").read_text())["entries"].values())
    sizes = {f["path"]: f["size"] for e in entries for f in e["files"]}
    return {
        "compile_per_signature": statistics.mean(e["compile_seconds"] for e in entries),
        "wall_per_signature": wall / len(entries),
        "bytes_per_signature": sum(sizes.values()) / len(entries),
        "signatures": float(len(entries)),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--gradient-checkpointing", action="store_true")
    ns = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="lora-bench-"))
    model = write_tiny_model(root / "model")
    jobs = {
        kind: write_job(root, model, lora=kind == "lora", checkpointing=ns.gradient_checkpointing)
        for kind in ("full", "lora")
    }
    results: dict[str, list[dict[str, float]]] = {"full": [], "lora": []}
    for index in range(ns.repeat):
        for kind in ("full", "lora") if index % 2 == 0 else ("lora", "full"):
            cache = root / f"{kind}-{index}"
            results[kind].append(warm(jobs[kind], cache))
            r = results[kind][-1]
            print(
                f"round {index + 1} {kind:4}: {r['signatures']:.0f} signatures, compile "
                f"{r['compile_per_signature']:.1f} s/signature, warmup warm {r['wall_per_signature']:.1f} s/signature, "
                f"entry {r['bytes_per_signature'] / 1e6:.1f} MB/signature"
            )
            shutil.rmtree(cache)
    print(f"\nmedian of {ns.repeat} (gradient checkpointing {'on' if ns.gradient_checkpointing else 'off'}):")
    for metric, unit in (
        ("compile_per_signature", "s"),
        ("wall_per_signature", "s"),
        ("bytes_per_signature", "MB"),
    ):
        full = statistics.median(r[metric] for r in results["full"])
        lora = statistics.median(r[metric] for r in results["lora"])
        scale = 1e6 if unit == "MB" else 1.0
        print(
            f"  {metric:22} full {full / scale:7.1f} {unit}  LoRA {lora / scale:7.1f} {unit}  "
            f"ratio LoRA / full: {lora / full:.2f}x"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
