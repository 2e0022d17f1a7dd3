"""A user's TRL training job, run in a fresh process by the proof tests and the benchmarks.

    python tests/support/train_job.py --spec job.yaml --weights DIR --cache-dir CACHE --out result.json

It does what a training script does: `warmup.activate(spec, cache_dir=...)` first, then the TRL
trainer of the spec with the spec's own config fields, real weights loaded from `--weights` (not
the warm-up's), and its own data: texts of varied lengths drawn with `--data-seed`, different from
anything the warm-up built. It writes what happened: the compiles it still had to do, the batch
shapes it met, and timings (process start, train() start, the end of each step).

Without --cache-dir nothing is activated: a plain cold TRL run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

PROCESS_START = time.time()
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.support.tiny_model import words  # noqa: E402


def length_ranges(low: int, splits: list[int], high: int, batches: int) -> list[tuple[int, int]]:
    """Row-length ranges per batch, cycling through the buckets `splits` separate: every bucket is met."""
    bounds = [low - 1, *splits, high]
    buckets = [(bounds[i] + 1, bounds[i + 1]) for i in range(len(bounds) - 1)]
    return [buckets[index % len(buckets)] for index in range(batches)]


def texts_for_sft(rng: random.Random, ranges: list[tuple[int, int]], rows: int) -> list[dict[str, str]]:
    # SFT appends EOS: a text of n words is n + 1 tokens
    return [
        {"text": words(rng.randint(low, high) - 1, offset=rng.randint(0, 299))}
        for low, high in ranges
        for _ in range(rows)
    ]


def prompts(rng: random.Random, ranges: list[tuple[int, int]], rows: int) -> list[dict[str, str]]:
    return [
        {"prompt": words(rng.randint(low, high), offset=rng.randint(0, 299))}
        for low, high in ranges
        for _ in range(rows)
    ]


def preferences(rng: random.Random, ranges: list[tuple[int, int]], rows: int) -> list[dict[str, str]]:
    data = []
    for low, high in ranges:
        for _ in range(rows):
            prompt = rng.randint(2, low - 3)
            # DPO appends EOS: a row is prompt + completion + 1 tokens
            chosen, rejected = (rng.randint(low, high) - prompt - 1 for _ in range(2))
            data.append(
                {
                    "prompt": words(prompt, offset=rng.randint(0, 299)),
                    "chosen": " " + words(chosen, offset=rng.randint(0, 299)),
                    "rejected": " " + words(rejected, offset=rng.randint(0, 299)),
                }
            )
    return data


def unpaired(rng: random.Random, ranges: list[tuple[int, int]], rows: int) -> list[dict[str, Any]]:
    """KTO examples: rows of prompt + completion + EOS, desirable and not in turn."""
    data = []
    for index, (low, high) in enumerate(r for r in ranges for _ in range(rows)):
        prompt = rng.randint(2, low - 3)
        completion = rng.randint(low, high) - prompt - 1
        data.append(
            {
                "prompt": words(prompt, offset=rng.randint(0, 299)),
                "completion": " " + words(completion, offset=rng.randint(0, 299)),
                "label": index % 2 == 0,
            }
        )
    return data


def length_reward(completions: list[Any], **_: Any) -> list[float]:
    return [float(len(str(c))) for c in completions]


def make_step_clock() -> Any:
    """A TrainerCallback recording when train() starts and when each step ends."""
    from transformers import TrainerCallback

    class StepClock(TrainerCallback):
        def __init__(self) -> None:
            self.step_ends: list[float] = []
            self.train_start: float | None = None

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.train_start = time.time()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.step_ends.append(time.time())

    return StepClock()


def preimport(names: list[str]) -> int:
    """Import `names` (what another run imported); returns how many could not be imported on their own."""
    import importlib

    failed = 0
    for name in names:
        try:
            importlib.import_module(name)
        except Exception:  # a module only its parent's import creates, or one that needs another's state
            failed += 1
    return failed


def imported_modules(cache_dir: str | None) -> list[str]:
    """This process's modules in the order they were imported, leaving out the compiled code loaded from
    `cache_dir` (a compiled graph and its kernels are modules too)."""
    cache = Path(cache_dir).resolve() if cache_dir else None
    return [
        name
        for name, module in list(sys.modules.items())
        if not (cache and getattr(module, "__file__", None) and Path(module.__file__).is_relative_to(cache))
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--spec", required=True)
    parser.add_argument(
        "--weights", required=True, help="model directory with weights (the user's checkpoint)"
    )
    parser.add_argument("--cache-dir", help="warmed cache to activate; none: a plain cold run")
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--data-seed", type=int, default=1)
    parser.add_argument("--plan-size", type=int, help="for trainers whose planner is not written yet")
    parser.add_argument("--min-tokens", type=int, required=True)
    parser.add_argument("--max-tokens", type=int, required=True)
    parser.add_argument("--examples", type=int, help="SFT: this many examples, lengths min..max tokens")
    parser.add_argument(
        "--teacher-weights", help="distillation: the teacher's checkpoint (default: --weights)"
    )
    parser.add_argument(
        "--split", required=True, help="bucket bounds: longest row (or prompt) per bucket, a,b,..."
    )
    parser.add_argument(
        "--preimport",
        help="a file listing modules (one a line) to import first: the bench's floor for a compiled run",
    )
    ns = parser.parse_args(argv)
    preimported = Path(ns.preimport).read_text().split() if ns.preimport else []
    failed_imports = preimport(preimported)

    import warmup
    from warmup.job.spec import load_spec

    spec = load_spec(ns.spec)
    if os.environ.get("ACCELERATE_USE_FSDP") == "true" and spec.target.device == "cpu":
        # accelerate sets up FSDP only on an accelerator; on CPU, as the warm-up does (warmup.rehearsal.cpu_sharding)
        from warmup.rehearsal.cpu_sharding import shard_on_cpu

        shard_on_cpu()
    activation = None
    if ns.cache_dir:
        activation = warmup.activate(spec, cache_dir=ns.cache_dir, plan_size=ns.plan_size)
    activated = time.time()

    import trl
    from datasets import Dataset
    from torch._dynamo.utils import calculate_time_spent, counters

    rng = random.Random(ns.data_seed)
    config_cls = {
        "sft": trl.SFTConfig,
        "dpo": trl.DPOConfig,
        "kto": trl.KTOConfig,
        "grpo": trl.GRPOConfig,
        "reward": trl.RewardConfig,
        "distillation": trl.DistillationConfig,
    }
    trainer_cls = {
        "sft": trl.SFTTrainer,
        "dpo": trl.DPOTrainer,
        "kto": trl.KTOTrainer,
        "grpo": trl.GRPOTrainer,
        "reward": trl.RewardTrainer,
        "distillation": trl.DistillationTrainer,
    }
    batch = spec.args.get("per_device_train_batch_size", 8)
    fields = {f.name for f in dataclasses.fields(config_cls[spec.trainer])}
    args = config_cls[spec.trainer](
        # the launcher's keys (accelerate_config, ...) went to `accelerate launch`, as `trl` hands them
        **{name: value for name, value in spec.args.items() if name in fields},
        output_dir=str(Path(ns.out).parent / "trainer-out"),
        max_steps=ns.steps,
        save_strategy="no",
        report_to="none",
        logging_steps=1,
        disable_tqdm=True,
        # batches in data order (short, long, short, ...): every planned bucket is met; changes no graph
        **(
            {"train_sampling_strategy": "sequential"}
            if spec.trainer in ("sft", "dpo", "kto", "reward")
            else {}
        ),
    )
    shapes: list[tuple[int, ...]] = []
    extra: dict[str, Any] = {}
    # under torchrun each step takes one batch per process, in data order
    world = int(os.environ.get("WORLD_SIZE", "1"))
    splits = [int(x) for x in str(ns.split).split(",")]
    ranges = [r for r in length_ranges(ns.min_tokens, splits, ns.max_tokens, ns.steps) for _ in range(world)]
    if spec.trainer == "sft" and ns.examples:
        # a dataset of this many examples (packed jobs: the packed row count follows from their lengths)
        data = texts_for_sft(rng, [(ns.min_tokens, ns.max_tokens)], ns.examples)
    elif spec.trainer == "sft":
        data = texts_for_sft(rng, ranges, batch)
    elif spec.trainer == "kto":
        data = unpaired(rng, ranges, batch)
    elif spec.trainer == "distillation":
        data = prompts(rng, ranges, batch * args.gradient_accumulation_steps)
        extra["teacher_model"] = ns.teacher_weights or ns.weights
    elif spec.trainer == "dpo":
        data = preferences(rng, ranges, batch)
    elif spec.trainer == "grpo":
        data = prompts(rng, ranges, args.generation_batch_size // args.num_generations)
        extra["reward_funcs"] = length_reward
    else:
        raise SystemExit(f"no job for {spec.trainer}")
    if spec.peft:
        from warmup.job.peft_args import lora_config

        extra["peft_config"] = lora_config(spec.peft)  # the job's LoraConfig, as TRL's scripts build it
    clock = make_step_clock()
    trainer = trainer_cls[spec.trainer](
        model=ns.weights, args=args, train_dataset=Dataset.from_list(data), callbacks=[clock], **extra
    )
    if spec.trainer == "grpo":
        forward = trainer._get_per_token_logps_and_entropies

        def recording(model: Any, input_ids: Any, *a: Any, **k: Any) -> Any:
            size = k.get("batch_size") or input_ids.size(0)
            shapes.append((min(size, input_ids.size(0)), input_ids.size(1), int(model is trainer.ref_model)))
            return forward(model, input_ids, *a, **k)

        trainer._get_per_token_logps_and_entropies = recording
    elif spec.trainer == "distillation":  # its collator hands prompts on; the backbones see the batches
        hidden = trainer._get_last_hidden_state

        def recording_hidden(model: Any, input_ids: Any, *a: Any, **k: Any) -> Any:
            shapes.append((*input_ids.shape, int(model is not trainer.model)))
            return hidden(model, input_ids, *a, **k)

        trainer._get_last_hidden_state = recording_hidden
    else:
        collator = trainer.data_collator

        def recording_collator(examples: list[Any]) -> Any:
            out = collator(examples)
            shapes.append(tuple(out["input_ids"].shape))
            if "KL_input_ids" in out:  # KTO's KL rows
                shapes.append(("KL", *out["KL_input_ids"].shape))
            return out

        trainer.data_collator = recording_collator
    trainer.train()
    end = time.time()
    fresh = activation.fresh_compiles() if activation else None
    result = {
        "process_start": PROCESS_START,
        "activated": activated,
        "train_start": clock.train_start,
        "step_ends": clock.step_ends,
        "end": end,
        "shapes": shapes,
        "distributed_type": str(trainer.accelerator.distributed_type.value),  # FSDP, DEEPSPEED, MULTI_CPU, NO
        "dynamo_compile_seconds": calculate_time_spent().get("total_wall_time", 0.0),
        "trace_skip": None
        if activation is None or activation.trace_skip is None
        else activation.trace_skip.summary(),
        "fresh_compiles": None
        if fresh is None
        else {**dict(fresh.counts), "new_files": list(fresh.new_files)},
        "modules": imported_modules(ns.cache_dir),
        "preimported": len(preimported),
        "failed_preimports": failed_imports,
        "counters": {
            group: dict(counters[group])
            for group in ("inductor", "aot_autograd", "stats", "frames")
            if group in counters
        },
    }
    rank = int(os.environ.get("RANK", "0"))
    out = Path(ns.out) if rank == 0 else Path(ns.out).with_suffix(f".rank{rank}.json")
    out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
