"""DPO plans against TRL itself: every forward a real DPOTrainer makes is a planned signature.

Recall: random pairs within the spec's data facts, the default random sampler, eval on, short last
batches; every recorded shape (policy, reference, precompute) must be in the plan. Tightness: data
orders designed within the same facts whose runs together produce every planned signature.
"""

from __future__ import annotations

import random

import pytest

from tests.support.preference_runs import batches, full_plan, pair, phases, plan_for, record, run_trainer
from tests.support.shape_recorder import compiled_shapes, planned_shapes


def random_pairs(rng: random.Random, count: int, shortest: int, longest: int) -> list[dict]:
    """Pairs whose two rows are each `shortest`..`longest` tokens, prompts 1..15 tokens."""
    examples = []
    for _ in range(count):
        prompt = rng.randint(1, min(15, shortest - 1))
        examples.append(pair(prompt, rng.randint(shortest, longest), rng.randint(shortest, longest)))
    return examples


def test_random_data_is_covered(tiny_model_dir, tmp_path):
    rng = random.Random(0)
    args = {
        "per_device_train_batch_size": 3,
        "per_device_eval_batch_size": 2,
        "max_length": 40,
        "pad_to_multiple_of": 16,
        "eval_strategy": "steps",
        "eval_steps": 2,
        "num_train_epochs": 2,
    }
    train = random_pairs(rng, 10, 18, 60)  # rows above max_length are truncated
    evals = random_pairs(rng, 5, 18, 60)
    seen = run_trainer("dpo", tiny_model_dir, tmp_path, args, train, evals)
    planned = plan_for(
        "dpo",
        tiny_model_dir,
        args,
        {"num_train_examples": 10, "num_eval_examples": 5, "min_tokens": 18, "max_tokens": 60},
    )
    assert seen <= planned, f"shapes TRL produced that the plan missed: {sorted(seen - planned)}"
    assert phases(seen) == {"train", "ref", "eval"}
    assert batches(seen, "train") == {6, 2}  # chosen + rejected rows; 10 % 3 leaves a one-pair last batch
    assert batches(seen, "eval") == {4, 2}
    assert max(length for _, _, length, _ in seen) == 48  # ceil_16(max_length 40): no cap at max_length


def test_precompute_ref_log_probs_is_covered_exactly(tiny_model_dir, tmp_path):
    """The reference runs once, at init, with its own batch size; no reference forward per step."""
    args = {
        "per_device_train_batch_size": 2,
        "per_device_eval_batch_size": 3,
        "precompute_ref_log_probs": True,
        "precompute_ref_batch_size": 4,
        "max_length": 64,
        "pad_to_multiple_of": 16,
        "eval_strategy": "epoch",
    }
    # One padded length (17..32 tokens pads to 32), so one run reaches every planned signature.
    rng = random.Random(1)
    train = random_pairs(rng, 7, 17, 32)
    evals = random_pairs(rng, 5, 17, 32)
    seen = run_trainer("dpo", tiny_model_dir, tmp_path, args, train, evals)
    planned = plan_for(
        "dpo",
        tiny_model_dir,
        args,
        {"num_train_examples": 7, "num_eval_examples": 5, "min_tokens": 17, "max_tokens": 32},
    )
    assert seen == planned
    # train 2+2+2+1 pairs, precompute 4+3 (train) and 4+1 (eval), eval 3+2 pairs; two rows per pair
    assert batches(seen, "train") == {4, 2}
    assert batches(seen, "ref") == {8, 6, 2}
    assert batches(seen, "eval") == {6, 4}


def test_plan_lists_only_reachable_shapes(tiny_model_dir, tmp_path):
    """Two data orders within the facts (rows of 5..30 tokens, max_length 24) hit every planned signature."""
    args = {
        "per_device_train_batch_size": 2,
        "per_device_eval_batch_size": 2,
        "max_length": 24,
        "pad_to_multiple_of": 16,
        "train_sampling_strategy": "sequential",
        "eval_strategy": "epoch",
    }
    facts = {"num_train_examples": 5, "num_eval_examples": 3, "min_tokens": 5, "max_tokens": 30}
    planned = plan_for("dpo", tiny_model_dir, args, facts)
    short = [pair(2, 5, 16), pair(3, 16, 9), pair(1, 6, 6), pair(4, 10, 12), pair(2, 7, 5)]
    long = [pair(2, 30, 5), pair(3, 20, 17), pair(1, 5, 18), pair(9, 24, 25), pair(2, 30, 30)]
    seen = run_trainer("dpo", tiny_model_dir, tmp_path, args, short, short[:3])
    seen |= run_trainer("dpo", tiny_model_dir, tmp_path, args, long, long[:3])
    assert seen == planned


@pytest.mark.parametrize("precompute", [True, False])
def test_under_torch_compile_the_compiled_signatures_are_what_compiles(tiny_model_dir, tmp_path, precompute):
    """The Trainer compiles the policy when training starts and the reference copy at init (so its eval
    forwards compile too); precompute runs earlier, on the bare policy, and evaluate() calls the bare
    policy: both run eagerly, so the plan lists them labelled eager.
    """
    args = {
        "per_device_train_batch_size": 2,
        "per_device_eval_batch_size": 3,
        "precompute_ref_log_probs": precompute,
        "max_length": 64,
        "pad_to_multiple_of": 16,
        "eval_strategy": "epoch",
        "num_train_epochs": 1,
        "torch_compile": True,
    }
    rng = random.Random(3)
    train, evals = random_pairs(rng, 5, 17, 32), random_pairs(rng, 4, 17, 32)  # every row pads to 32
    run = record("dpo", tiny_model_dir, tmp_path, args, train, evals, torch_compile=True)
    plan = full_plan(
        "dpo",
        tiny_model_dir,
        args,
        {"num_train_examples": 5, "num_eval_examples": 4, "min_tokens": 17, "max_tokens": 32},
    )
    assert run.seen == planned_shapes(plan)
    assert run.compiled == compiled_shapes(plan)
    assert phases(run.compiled) == ({"train"} if precompute else {"train", "ref"})
    assert phases(run.seen - run.compiled) == ({"ref", "eval"} if precompute else {"eval"})
