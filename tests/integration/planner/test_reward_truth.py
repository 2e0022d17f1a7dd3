"""Reward plans against TRL itself: a sequence-classification model over chosen + rejected rows.

Recall: random pairs within the data facts, the default random sampler, eval on, short last
batches, pairs longer than max_length (which RewardTrainer drops, not truncates); every recorded
shape must be in the plan. Tightness: designed data orders within the same facts whose runs
together produce every planned signature.
"""

from __future__ import annotations

import random

from tests.support.preference_runs import batches, full_plan, pair, phases, plan_for, record, run_trainer
from tests.support.shape_recorder import compiled_shapes, planned_shapes


def test_random_data_is_covered_and_long_pairs_are_dropped(tiny_reward_model_dir, tmp_path):
    rng = random.Random(0)
    args = {
        "per_device_train_batch_size": 3,
        "per_device_eval_batch_size": 2,
        "max_length": 40,
        "pad_to_multiple_of": 16,
        "eval_strategy": "epoch",
        "num_train_epochs": 2,
    }

    def pairs(count: int) -> list[dict]:
        return [pair(rng.randint(1, 5), rng.randint(6, 60), rng.randint(6, 60)) for _ in range(count)]

    def kept(examples: list[dict]) -> int:
        """Pairs whose rows both fit max_length (each word is one token)."""
        return sum(
            max(len((e["prompt"] + e[side]).split()) for side in ("chosen", "rejected")) <= 40
            for e in examples
        )

    train, evals = pairs(16), pairs(8)
    seen = run_trainer("reward", tiny_reward_model_dir, tmp_path, args, train, evals)
    # Counts after TRL's filter, as the planner's warning asks for them.
    facts = {
        "num_train_examples": kept(train),
        "num_eval_examples": kept(evals),
        "min_tokens": 6,
        "max_tokens": 60,
    }
    planned = plan_for("reward", tiny_reward_model_dir, args, facts)
    assert kept(train) < len(train), "the data must hold pairs that RewardTrainer drops"
    assert seen <= planned, f"shapes TRL produced that the plan missed: {sorted(seen - planned)}"
    assert phases(seen) == {"train", "eval"}
    assert max(length for _, _, length, _ in planned) == 48  # ceil_16(max_length): longer pairs are gone
    assert any(batch != 6 for batch in batches(seen, "train")), "no short last batch was exercised"


def test_plan_lists_only_reachable_shapes(tiny_reward_model_dir, tmp_path):
    """Two data orders within the facts (rows of 5..30 tokens) hit every planned signature."""
    args = {
        "per_device_train_batch_size": 2,
        "per_device_eval_batch_size": 2,
        "max_length": 30,
        "pad_to_multiple_of": 16,
        "train_sampling_strategy": "sequential",
        "eval_strategy": "epoch",
        "num_train_epochs": 1,
    }
    facts = {"num_train_examples": 5, "num_eval_examples": 3, "min_tokens": 5, "max_tokens": 30}
    planned = plan_for("reward", tiny_reward_model_dir, args, facts)
    short = [pair(2, 5, 16), pair(3, 16, 9), pair(1, 6, 6), pair(4, 10, 12), pair(2, 7, 5)]
    long = [pair(2, 30, 5), pair(3, 20, 17), pair(1, 5, 18), pair(9, 24, 25), pair(2, 30, 30)]
    seen = run_trainer("reward", tiny_reward_model_dir, tmp_path, args, short, short[:3])
    seen |= run_trainer("reward", tiny_reward_model_dir, tmp_path, args, long, long[:3])
    assert seen == planned
    assert batches(planned, "train") == {4, 2}  # chosen + rejected rows


def test_under_torch_compile_only_training_compiles(tiny_reward_model_dir, tmp_path):
    """evaluate() calls the bare model, which runs eagerly: an Inductor plan lists eval labelled eager."""
    args = {
        "per_device_train_batch_size": 2,
        "per_device_eval_batch_size": 3,
        "max_length": 64,
        "pad_to_multiple_of": 16,
        "eval_strategy": "epoch",
        "num_train_epochs": 1,
        "torch_compile": True,
    }
    rng = random.Random(5)
    train = [pair(rng.randint(1, 10), rng.randint(17, 32), rng.randint(17, 32)) for _ in range(5)]
    evals = [pair(rng.randint(1, 10), rng.randint(17, 32), rng.randint(17, 32)) for _ in range(4)]
    run = record("reward", tiny_reward_model_dir, tmp_path, args, train, evals, torch_compile=True)
    facts = {"num_train_examples": 5, "num_eval_examples": 4, "min_tokens": 17, "max_tokens": 32}
    plan = full_plan("reward", tiny_reward_model_dir, args, facts)
    assert run.seen == planned_shapes(plan)
    assert run.compiled == compiled_shapes(plan) == {("train", 4, 32, None), ("train", 2, 32, None)}
    assert run.seen - run.compiled == {("eval", 6, 32, None), ("eval", 2, 32, None)}
