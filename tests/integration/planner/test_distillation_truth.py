"""Distillation plans against TRL itself: every student and teacher forward is a planned signature.

TRL 1.16's DistillationTrainer is on-policy only: the student generates for
per_device_train_batch_size x gradient_accumulation_steps prompts, then each micro-batch runs the student
backbone (with grad) and the teacher backbone (without) on (B, P + C). The teacher here has its own config
(3 layers), so its signatures carry a different model hash. Completion lengths are scripted as in the GRPO
tests.
"""

from __future__ import annotations

import random

import pytest

from tests.support.online_runs import (
    phases,
    plan_for,
    planned,
    record,
    run_trainer,
    write_tiny_model_with_weights,
)
from tests.support.shape_recorder import compiled_shapes, planned_shapes

M = 20
BASE = {
    "per_device_train_batch_size": 2,
    "gradient_accumulation_steps": 2,  # generation batch: 4 prompts
    "max_completion_length": M,
    "pad_to_multiple_of": 16,
    "cache_implementation": "static",
}
FACTS = {"min_prompt_tokens": 5, "max_prompt_tokens": 40}


@pytest.fixture(scope="module")
def student_dir(tmp_path_factory):
    return write_tiny_model_with_weights(tmp_path_factory.mktemp("student"))


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory):
    return write_tiny_model_with_weights(tmp_path_factory.mktemp("teacher"), layers=3, seed=1)


def random_prompts(seed: int, count: int) -> list:
    rng = random.Random(seed)
    return [(rng.randint(5, 40), rng.randint(1, M + 5)) for _ in range(count)]


def test_student_teacher_and_eval_are_covered(student_dir, teacher_dir, tmp_path):
    args = {
        **BASE,
        "eval_strategy": "steps",
        "eval_steps": 2,
        "per_device_eval_batch_size": 2,
        "max_steps": 4,
    }
    evals = random_prompts(2, 3)  # eval batches of 2 and 1 prompts
    seen = run_trainer(
        "distillation", student_dir, tmp_path, args, random_prompts(1, 16), evals, teacher_dir=teacher_dir
    )
    plan = planned(
        "distillation", student_dir, args, {**FACTS, "num_eval_examples": 3}, teacher_dir=teacher_dir
    )
    assert seen <= plan, f"shapes TRL produced that the plan missed: {sorted(seen - plan)}"
    assert phases(seen) == phases(plan) == {"train", "teacher", "eval", "generate_prefill", "generate_decode"}
    assert {batch for phase, batch, *_ in seen if phase == "teacher"} >= {2, 1}


def test_plan_lists_only_reachable_shapes(student_dir, teacher_dir, tmp_path):
    args = {**BASE, "shuffle_dataset": False, "max_steps": 3}  # a round of 4 prompts per step
    facts = {"min_prompt_tokens": 5, "max_prompt_tokens": 30}  # prompt buckets 16, 32; caches 35, 51
    rounds = [
        (5, 1), (12, 16), (7, 2), (16, 9),  # P 16, C 16: width 32, cache 35
        (30, 20), (20, 17), (5, 1), (6, 1),  # P 32, C 32: width 64, cache 51
        (16, 20), (9, 5), (10, 1), (11, 1),  # P 16, C 32: width 48, cache 51
    ]  # fmt: skip
    seen = run_trainer("distillation", student_dir, tmp_path, args, rounds, teacher_dir=teacher_dir)
    plan = planned("distillation", student_dir, args, facts, teacher_dir=teacher_dir)
    assert seen == plan, f"missed: {sorted(seen - plan)}; never produced: {sorted(plan - seen)}"


def test_teacher_signatures_name_the_teacher_model(student_dir, teacher_dir):
    plan = plan_for("distillation", student_dir, BASE, FACTS, teacher_dir=teacher_dir)
    models = {phase: {s.model for s in plan.signatures if s.phase == phase} for phase in ("train", "teacher")}
    assert len(models["train"]) == len(models["teacher"]) == 1
    assert models["train"] != models["teacher"]


def test_under_torch_compile_nothing_compiles(student_dir, teacher_dir, tmp_path):
    """DistillationTrainer calls both backbones through `_forward_redirection` on `accelerator.unwrap_model(...)`,
    which keeps the torch.compile wrapper and then patches that wrapper's own forward: Dynamo traces nothing,
    not the student's training forward, not the teacher (prepared and wrapped at init), not eval or generation.
    """
    args = {
        **BASE,
        "max_completion_length": 8,
        "eval_strategy": "steps",
        "eval_steps": 1,
        "per_device_eval_batch_size": 2,
        "max_steps": 1,
        "torch_compile": True,
    }
    facts = {"min_prompt_tokens": 5, "max_prompt_tokens": 16, "num_eval_examples": 2}
    prompts = [(5, 8), (16, 8), (9, 8), (12, 8)]  # one round of 4 prompts: P 16, C 16, cache 23
    run = record(
        "distillation",
        student_dir,
        tmp_path,
        args,
        prompts,
        prompts[:2],
        teacher_dir=teacher_dir,
        torch_compile=True,
    )
    plan = plan_for("distillation", student_dir, args, facts, teacher_dir=teacher_dir)
    assert run.seen == planned_shapes(plan), f"missed: {sorted(run.seen - planned_shapes(plan))}"
    assert phases(run.seen) == {"train", "teacher", "eval", "generate_prefill", "generate_decode"}
    assert run.compiled == compiled_shapes(plan) == set()
    assert run.graphs == 0  # nor did Dynamo compile any graph outside the hooked backbones
    assert any("no module through the torch.compile wrapper" in warning for warning in plan.warnings)
