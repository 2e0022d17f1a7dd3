"""A training pod's job: a real TRL SFT run with `WarmupCallback`, and nothing else of trl-warmup.

    warmup exec SPEC --server URL --dest CACHE -- python tests/support/pod_train.py --weights DIR --out OUT ...

It calls neither `warmup.activate` nor anything that sets the cache up: under `warmup exec` the
environment and the recompile limits come from exec, and `WarmupCallback()` takes the spec and the
server from the environment exec sets (built before the trainer and passed in `callbacks=[...]`, or with
--attach add_callback built after it and added by `trainer.add_callback`, transformers' documented way;
--batch trains another batch size than the spec's). It writes what happened to --out: the batch shapes, the
callback's report and the service's answer, Dynamo's recompile limits as this process sees them, and
Inductor's cache counters. With --fail-at-step, train() raises at that step (the report must still go).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.support.train_job import length_ranges, texts_for_sft


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--weights", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--data-seed", type=int, default=1)
    parser.add_argument("--min-tokens", type=int, required=True)
    parser.add_argument("--split", required=True, help="bucket bounds, a,b,...")
    parser.add_argument("--max-tokens", type=int, required=True)
    parser.add_argument("--fail-at-step", type=int)
    parser.add_argument(
        "--no-callback", action="store_true", help="a script that does not add WarmupCallback itself"
    )
    parser.add_argument("--attach", choices=["constructor", "add_callback"], default="constructor")
    parser.add_argument("--batch", type=int, help="per_device_train_batch_size, other than the spec's")
    ns = parser.parse_args(argv)

    import trl
    from datasets import Dataset
    from transformers import TrainerCallback

    from warmup.job.spec import load_spec
    from warmup.pod.callback.observer import WarmupCallback

    # spec and server from what exec sets; with --attach add_callback it is built once the trainer is, below
    callback = None if ns.no_callback or ns.attach == "add_callback" else WarmupCallback()
    spec = callback.spec if callback is not None else load_spec(json.loads(os.environ["WARMUP_SPEC"]))
    rank = int(os.environ.get("RANK", "0"))  # under torchrun, rank k > 0 writes beside rank 0's file
    out = Path(ns.out) if rank == 0 else Path(ns.out).with_suffix(f".rank{rank}.json")
    run_args = {**spec.args, **({"per_device_train_batch_size": ns.batch} if ns.batch else {})}
    args = trl.SFTConfig(
        **run_args,
        output_dir=str(out.parent / "trainer-out"),
        max_steps=ns.steps,
        save_strategy="no",
        report_to="none",
        logging_steps=1,
        disable_tqdm=True,
        train_sampling_strategy="sequential",  # short, long, short, ...: every bucket is met
    )
    batch = run_args.get("per_device_train_batch_size", 8)
    splits = [int(x) for x in ns.split.split(",")]
    ranges = length_ranges(ns.min_tokens, splits, ns.max_tokens, ns.steps)
    world = int(os.environ.get("WORLD_SIZE", "1"))  # every rank gets full batches of its own
    data = texts_for_sft(random.Random(ns.data_seed), ranges, batch * world)
    shapes: list[list[int]] = []

    class Failing(TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if ns.fail_at_step is not None and state.global_step + 1 >= ns.fail_at_step:
                raise RuntimeError(f"the user's training failed at step {state.global_step + 1}")

    trainer = trl.SFTTrainer(
        model=ns.weights,
        args=args,
        train_dataset=Dataset.from_list(data),
        callbacks=[c for c in (callback, Failing()) if c is not None],
    )
    if ns.attach == "add_callback" and not ns.no_callback:
        callback = WarmupCallback()  # under a live trainer: its Accelerator is made, its state must stay
        trainer.add_callback(callback)
    collator = trainer.data_collator

    def recording_collator(examples: list[Any]) -> Any:
        batch_out = collator(examples)
        shapes.append(list(batch_out["input_ids"].shape))
        return batch_out

    trainer.data_collator = recording_collator
    trainer.train()

    import torch._dynamo.config
    from torch._dynamo.utils import counters

    result = {
        "shapes": shapes,
        "report": callback.last_report if callback is not None else None,
        "response": callback.last_response if callback is not None else None,
        "recompile_limit": torch._dynamo.config.recompile_limit,
        "accumulated_recompile_limit": torch._dynamo.config.accumulated_recompile_limit,
        "cache_dir": os.environ.get("TORCHINDUCTOR_CACHE_DIR"),
        "counters": {
            group: dict(counters[group]) for group in ("inductor", "aot_autograd") if group in counters
        },
        "trace_skip": _trace_skip(),
    }
    out.write_text(json.dumps(result, indent=1))
    return 0


def _trace_skip() -> dict[str, Any] | None:
    """What the trace skip served in this process (warmup/trace_skip/), if it was on."""
    from warmup.trace_skip.serve import active

    state = active()
    return None if state is None else state.summary()


if __name__ == "__main__":
    sys.exit(main())
