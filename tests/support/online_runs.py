"""Run the real GRPO / RLOO / Distillation trainers on tiny models and record every forward they make.

A prompt is given as (prompt tokens, completion length): the prompt text is exactly that many tokens
(plain text, no chat template) and a CompletionScript ends its completions at the given length (a tuple
gives one length per generate call the prompt is in, cycled). Recorded: the policy (student) forwards,
including those inside `generate`, the reference model's and the teacher's.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from tests.support.completion_script import CompletionScript
from tests.support.shape_recorder import (
    CPU_ARGS,
    DYNAMO_EAGER,
    Shape,
    ShapeRecorder,
    check_compiled,
    compiling,
    planned_shapes,
)
from tests.support.tiny_model import TEST_LAYERS, init_model, words, write_tiny_model

EVAL_FIRST_WORD = 150  # eval prompts start with w150, w151, ...: first tokens distinct from train prompts

Prompt = tuple[int, int | tuple[int, ...]]


def write_tiny_model_with_weights(directory: Path, *, layers: int = TEST_LAYERS, seed: int = 0) -> Path:
    """GRPO / RLOO load their reference model from the policy's directory, so weights must be on disk."""
    write_tiny_model(directory, layers=layers)
    init_model(directory, seed=seed).save_pretrained(directory)
    return directory


def zero_reward(completions, **kwargs) -> list[float]:
    return [0.0] * len(completions)


def run_trainer(
    kind: str,
    model_dir: Path,
    tmp_path: Path,
    args: dict[str, Any],
    train: list[Prompt],
    evals: list[Prompt] | None = None,
    *,
    teacher_dir: Path | None = None,
) -> set[Shape]:
    """Every forward shape a run of TRL's real trainer makes (see `record`)."""
    return record(kind, model_dir, tmp_path, args, train, evals, teacher_dir=teacher_dir).seen


def record(
    kind: str,
    model_dir: Path,
    tmp_path: Path,
    args: dict[str, Any],
    train: list[Prompt],
    evals: list[Prompt] | None = None,
    *,
    teacher_dir: Path | None = None,
    torch_compile: bool = False,
    peft: dict[str, Any] | None = None,
) -> ShapeRecorder:
    """Train (and evaluate, as args say) with TRL's real trainer, recording every forward.

    With `torch_compile`, the run compiles with Dynamo's eager backend and the recorder also notes which
    forwards Dynamo traced.
    """
    from datasets import Dataset
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    completion_lengths: dict[int, int | tuple[int, ...]] = {}

    def dataset(prompts: list[Prompt], first_word: int) -> Dataset:
        texts = []
        for i, (tokens, completion) in enumerate(prompts):
            texts.append(words(tokens, offset=first_word + i))
            completion_lengths[tokenizer.convert_tokens_to_ids(f"w{first_word + i}")] = completion
        return Dataset.from_dict({"prompt": texts})

    def length_of(token: int, calls_before: int) -> int:
        lengths = completion_lengths[token]
        return lengths[calls_before % len(lengths)] if isinstance(lengths, tuple) else lengths

    config_args = {
        **CPU_ARGS,
        "output_dir": str(tmp_path / "out"),
        **args,
        **(DYNAMO_EAGER if torch_compile else {}),
    }
    recorder = ShapeRecorder()
    with compiling(recorder) if torch_compile else contextlib.nullcontext():
        trainer = _build(
            kind,
            model_dir,
            teacher_dir,
            config_args,
            dataset(train, 0),
            dataset(evals, EVAL_FIRST_WORD) if evals else None,
            tokenizer,
            peft,
        )
        if kind == "distillation":
            # The student and the teacher run their backbones only (`_get_last_hidden_state`), and their top-level
            # modules are called with a redirected forward (`_forward_redirection`, no input_ids); the student's
            # backbone also sees every forward of `generate`.
            recorder.attach(trainer.model.base_model)
            recorder.attach(_traced(trainer.teacher_model).base_model, role="teacher")
        else:
            recorder.attach(trainer.model)
            if trainer.ref_model is not None:
                recorder.attach(_traced(trainer.ref_model), role="ref")
        CompletionScript(length_of, tokenizer.eos_token_id, tokenizer.pad_token_id).attach(trainer.model)
        trainer.train()
    if torch_compile:
        others = [trainer.teacher_model] if kind == "distillation" else [trainer.ref_model]
        check_compiled(trainer.model_wrapped, *[module for module in others if module is not None])
    return recorder


def _traced(model):
    """Under torch.compile accelerate hands back an OptimizedModule: the module inside is what Dynamo traces."""
    return getattr(model, "_orig_mod", model)


def _build(kind, model_dir, teacher_dir, config_args, train_dataset, eval_dataset, tokenizer, peft=None):
    import trl

    from warmup.job.peft_args import lora_config

    common = {"train_dataset": train_dataset, "eval_dataset": eval_dataset, "processing_class": tokenizer}
    if peft is not None:
        common["peft_config"] = lora_config(peft)
    if kind == "grpo":
        config = trl.GRPOConfig(**config_args)
        return trl.GRPOTrainer(model=init_model(model_dir), reward_funcs=zero_reward, args=config, **common)
    if kind == "rloo":
        config = trl.RLOOConfig(**config_args)
        return trl.RLOOTrainer(model=init_model(model_dir), reward_funcs=zero_reward, args=config, **common)
    config = trl.DistillationConfig(**config_args)
    return trl.DistillationTrainer(
        model=init_model(model_dir), teacher_model=init_model(teacher_dir, seed=1), args=config, **common
    )


def plan_for(
    kind: str,
    model_dir: Path,
    args: dict[str, Any],
    data: dict[str, Any],
    *,
    teacher_dir: Path | None = None,
    target: dict[str, Any] | None = None,
):
    """The planner's answer for the same job, as the truth tests run it (Inductor target on CPU)."""
    from warmup.job.spec import load_spec
    from warmup.planner.planning import plan_spec

    spec = {
        "trainer": kind,
        "model": str(model_dir),
        "args": {**args, "bf16": False},
        "data": data,
        "target": target or {"backend": "inductor", "device": "cpu"},
    }
    if teacher_dir is not None:
        spec["teacher_model"] = str(teacher_dir)
    return plan_spec(load_spec(spec))


def planned(kind: str, model_dir: Path, args: dict[str, Any], data: dict[str, Any], **kwargs) -> set[Shape]:
    return planned_shapes(plan_for(kind, model_dir, args, data, **kwargs))


def phases(shapes: set[Shape]) -> set[str]:
    return {phase for phase, *_ in shapes}
