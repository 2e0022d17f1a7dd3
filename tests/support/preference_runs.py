"""Run TRL's preference trainers (DPO, KTO, Reward) on tiny models and record every model forward.

Examples are given by token counts: a row is prompt + completion, the completion ending with EOS
(as TRL would append it), so the row lengths TRL sees are exactly the numbers written in the test.
"""

from __future__ import annotations

import contextlib

from tests.support.shape_recorder import (
    CPU_ARGS,
    DYNAMO_EAGER,
    Shape,
    ShapeRecorder,
    check_compiled,
    compiling,
    planned_shapes,
)
from tests.support.tiny_model import init_model, words
from warmup.signature import Plan


def _completion(tokens: int, offset: int) -> str:
    """A completion of exactly `tokens` tokens, the last one EOS (so TRL appends nothing)."""
    assert tokens >= 1, "a completion has at least its EOS"
    return " " + words(tokens - 1, offset) + " <eos>"


def pair(prompt: int, chosen_row: int, rejected_row: int) -> dict:
    """A preference example whose rows (prompt + chosen, prompt + rejected) have these token counts."""
    return {
        "prompt": words(prompt),
        "chosen": _completion(chosen_row - prompt, 50),
        "rejected": _completion(rejected_row - prompt, 90),
    }


def unpaired(prompt: int, row: int, label: bool = True) -> dict:
    """A KTO example whose row (prompt + completion) has `row` tokens."""
    return {"prompt": words(prompt), "completion": _completion(row - prompt, 70), "label": label}


def run_trainer(
    kind: str, model_dir, tmp_path, args: dict, train: list[dict], evals: list[dict] | None = None
):
    """Every forward shape a run of TRL's real trainer makes (see `record`)."""
    return record(kind, model_dir, tmp_path, args, train, evals).seen


def record(
    kind: str,
    model_dir,
    tmp_path,
    args: dict,
    train: list[dict],
    evals: list[dict] | None = None,
    *,
    torch_compile: bool = False,
    peft: dict | None = None,
) -> ShapeRecorder:
    """Train (and evaluate, as args say) with TRL's real trainer, recording every model forward.

    Reference forwards are recorded as "ref": those of the separate reference model, and those made
    on the policy while the trainer is built (precompute_ref_log_probs runs there). With
    `torch_compile`, the run compiles with Dynamo's eager backend and the recorder also notes which
    forwards Dynamo traced.
    """
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import DPOConfig, DPOTrainer, KTOConfig, KTOTrainer, RewardConfig, RewardTrainer

    config_class, trainer_class = {
        "dpo": (DPOConfig, DPOTrainer),
        "kto": (KTOConfig, KTOTrainer),
        "reward": (RewardConfig, RewardTrainer),
    }[kind]
    compile_args = DYNAMO_EAGER if torch_compile else {}
    config = config_class(output_dir=str(tmp_path / "out"), **{**CPU_ARGS, **args, **compile_args})
    policy = init_model(model_dir)
    extra = {}
    if peft is not None:
        from warmup.job.peft_args import lora_config

        extra["peft_config"] = lora_config(peft)  # the reference is the policy with its adapter disabled
    elif kind != "reward" and not config.precompute_ref_log_probs:
        # TRL would load this copy from the policy's checkpoint; the test models have no weights on disk.
        extra["ref_model"] = init_model(model_dir, seed=1)
    recorder = ShapeRecorder()
    with compiling(recorder) if torch_compile else contextlib.nullcontext():
        while_building = recorder.attach(policy, "ref")
        trainer = trainer_class(
            model=policy,
            args=config,
            train_dataset=Dataset.from_list(train),
            eval_dataset=Dataset.from_list(evals) if evals else None,
            processing_class=AutoTokenizer.from_pretrained(model_dir),
            **extra,
        )
        while_building.remove()
        recorder.attach(trainer.model)
        reference = getattr(trainer, "ref_model", None)
        if reference is not None:
            # Under torch.compile accelerate hands back an OptimizedModule: hook the module Dynamo traces.
            recorder.attach(getattr(reference, "_orig_mod", reference), "ref")
        trainer.train()
    if torch_compile:
        check_compiled(trainer.model_wrapped, *([reference] if reference is not None else []))
    return recorder


def full_plan(kind: str, model_dir, args: dict, data: dict, **target) -> Plan:
    """The planner's plan for the same job, on an Inductor target on CPU."""
    from warmup.job.spec import load_spec
    from warmup.planner.planning import plan_spec

    spec = load_spec(
        {
            "trainer": kind,
            "model": str(model_dir),
            "args": {**args, "bf16": False},
            "data": data,
            "target": {"backend": "inductor", "device": "cpu", **target},
        }
    )
    return plan_spec(spec)


def plan_for(kind: str, model_dir, args: dict, data: dict, **target) -> set[Shape]:
    """The planner's shapes for the same job (every shape it lists, compiled or not)."""
    return planned_shapes(full_plan(kind, model_dir, args, data, **target))


def phases(shapes: set[Shape]) -> set[str]:
    return {phase for phase, *_ in shapes}


def batches(shapes: set[Shape], phase: str) -> set[int]:
    return {batch for p, batch, _, _ in shapes if p == phase}
