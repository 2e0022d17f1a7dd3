"""RLOO plans against TRL itself: every forward a real RLOOTrainer makes is a planned signature.

RLOO differs from GRPO where shapes are concerned in two rules, both checked both ways here: it computes
the old log-probs on every generation round (whatever gradient_accumulation_steps and
steps_per_generation are), and its beta defaults to 0.05, so the reference model runs unless beta is 0.
Completion lengths are scripted as in the GRPO tests.
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
    "gradient_accumulation_steps": 2,
    "max_completion_length": M,
    "pad_to_multiple_of": 16,
    "cache_implementation": "static",
}
FACTS = {"min_prompt_tokens": 5, "max_prompt_tokens": 40}
GENERATION = {"generate_prefill", "generate_decode"}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_tiny_model_with_weights(tmp_path_factory.mktemp("rloo-policy"))


def random_prompts(seed: int, count: int) -> list:
    rng = random.Random(seed)
    return [(rng.randint(5, 40), rng.randint(1, M + 5)) for _ in range(count)]


def test_defaults_with_eval_are_covered(model_dir, tmp_path):
    args = {
        **BASE,
        "eval_strategy": "steps",
        "eval_steps": 2,
        "per_device_eval_batch_size": 4,
        "max_steps": 4,
    }
    seen = run_trainer("rloo", model_dir, tmp_path, args, random_prompts(1, 16), random_prompts(2, 3))
    plan = planned("rloo", model_dir, args, {**FACTS, "num_eval_examples": 3})
    assert seen <= plan, f"shapes TRL produced that the plan missed: {sorted(seen - plan)}"
    assert phases(seen) == phases(plan) == {"train", "old_logps", "ref", "eval"} | GENERATION
    assert {batch for phase, batch, *_ in seen if phase in ("eval", "generate_prefill")} >= {4, 2}


def test_beta_zero_drops_the_reference_but_not_the_old_logps(model_dir, tmp_path):
    args = {**BASE, "beta": 0.0, "max_steps": 2}
    seen = run_trainer("rloo", model_dir, tmp_path, args, random_prompts(3, 8))
    plan = planned("rloo", model_dir, args, FACTS)
    assert seen <= plan, f"missed: {sorted(seen - plan)}"
    assert phases(seen) == phases(plan) == {"train", "old_logps"} | GENERATION


def test_plan_lists_only_reachable_shapes(model_dir, tmp_path):
    args = {**BASE, "shuffle_dataset": False, "max_steps": 3}  # generation batch 4 rows, a round a step
    facts = {"min_prompt_tokens": 5, "max_prompt_tokens": 30}  # prompt buckets 16, 32; caches 35, 51
    rounds = [
        (5, 1), (12, 16),  # P 16, C 16: width 32, cache 35
        (30, 20), (20, 17),  # P 32, C 32: width 64, cache 51
        (16, 20), (9, 5),  # P 16, C 32: width 48, cache 51
    ]  # fmt: skip
    seen = run_trainer("rloo", model_dir, tmp_path, args, rounds)
    plan = planned("rloo", model_dir, args, facts)
    assert seen == plan, f"missed: {sorted(seen - plan)}; never produced: {sorted(plan - seen)}"


def test_under_torch_compile_the_compiled_signatures_are_what_compiles(model_dir, tmp_path):
    """As in GRPO: the training forward and the reference copy compile; generation, the old log-probs (on the
    bare policy, every round in RLOO) and evaluate()'s loss run eagerly, listed as eager."""
    args = {
        **BASE,
        "max_completion_length": 8,
        "eval_strategy": "steps",
        "eval_steps": 2,
        "per_device_eval_batch_size": 2,
        "max_steps": 2,
        "torch_compile": True,
    }
    facts = {"min_prompt_tokens": 5, "max_prompt_tokens": 16, "num_eval_examples": 1}
    run = record("rloo", model_dir, tmp_path, args, [(5, 8), (16, 8)], [(10, 8)], torch_compile=True)
    plan = plan_for("rloo", model_dir, args, facts)
    assert run.seen == planned_shapes(plan), f"missed: {sorted(run.seen - planned_shapes(plan))}"
    assert run.compiled == compiled_shapes(plan) == {("train", 2, 32, None), ("ref", 2, 32, None)}
    assert phases(run.seen - run.compiled) == {"old_logps", "eval"} | GENERATION
