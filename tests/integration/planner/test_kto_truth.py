"""KTO plans against TRL itself: main rows, KL rows, their four passes, precompute and evaluation.

Recall: random examples within the data facts (KTO's sequential sampler, which the KL term
requires), eval on, short last batches; every recorded shape must be in the plan. Tightness: data
orders designed within the same facts whose runs together produce every planned signature,
including KL rows that join a long prompt to another example's long completion.
"""

from __future__ import annotations

import random

from tests.support.preference_runs import batches, full_plan, phases, plan_for, record, run_trainer, unpaired
from tests.support.shape_recorder import compiled_shapes, planned_shapes


def random_examples(
    rng: random.Random, count: int, shortest: int, longest: int, longest_prompt: int
) -> list[dict]:
    examples = []
    for i in range(count):
        row = rng.randint(shortest, longest)
        examples.append(unpaired(rng.randint(1, min(longest_prompt, row - 1)), row, label=i % 3 != 0))
    return examples


ARGS = {
    "per_device_train_batch_size": 3,
    "per_device_eval_batch_size": 2,
    "max_length": 40,
    "pad_to_multiple_of": 16,
    "eval_strategy": "epoch",
    "num_train_epochs": 2,
}
FACTS = {"num_train_examples": 10, "num_eval_examples": 5, "min_tokens": 6, "max_tokens": 60}


def test_random_data_with_kl_is_covered(tiny_model_dir, tmp_path):
    """Without prompt facts the KL rows are bounded by the widest prompt / completion split."""
    rng = random.Random(0)
    train = random_examples(rng, 10, 6, 60, 35)  # rows above max_length are truncated
    evals = random_examples(rng, 5, 6, 60, 35)
    seen = run_trainer("kto", tiny_model_dir, tmp_path, ARGS, train, evals)
    planned = plan_for("kto", tiny_model_dir, ARGS, FACTS)
    assert seen <= planned, f"shapes TRL produced that the plan missed: {sorted(seen - planned)}"
    # policy main (train), policy KL without grad (old_logps), reference main + KL, eval main + KL
    assert phases(seen) == {"train", "old_logps", "ref", "eval"}
    assert batches(seen, "train") == {3, 1}  # 10 % 3 leaves a one-example last batch
    assert batches(seen, "old_logps") == {3, 1}


def test_apo_zero_unpaired_has_no_kl_pass(tiny_model_dir, tmp_path):
    """Without the KL term there is no KL batch, and any sampler is allowed."""
    args = {**ARGS, "loss_type": "apo_zero_unpaired", "train_sampling_strategy": "random"}
    rng = random.Random(1)
    train = random_examples(rng, 10, 6, 60, 35)
    evals = random_examples(rng, 5, 6, 60, 35)
    seen = run_trainer("kto", tiny_model_dir, tmp_path, args, train, evals)
    planned = plan_for("kto", tiny_model_dir, args, FACTS)
    assert seen <= planned, f"shapes TRL produced that the plan missed: {sorted(seen - planned)}"
    assert phases(seen) == phases(planned) == {"train", "ref", "eval"}


def test_precompute_ref_log_probs_is_covered_exactly(tiny_model_dir, tmp_path):
    """Main and KL reference forwards run once, at init, with precompute_ref_batch_size."""
    args = {
        "per_device_train_batch_size": 2,
        "per_device_eval_batch_size": 3,
        "precompute_ref_log_probs": True,
        "precompute_ref_batch_size": 4,
        "max_length": 64,
        "pad_to_multiple_of": 16,
        "eval_strategy": "epoch",
    }
    # Prompts of 13..14 tokens and rows of 20..30: main rows and KL rows (19..31 tokens) all pad to 32.
    rng = random.Random(2)

    def examples(count: int) -> list[dict]:
        return [
            unpaired(rng.randint(13, 14), rng.randint(20, 30), label=rng.random() < 0.5) for _ in range(count)
        ]

    facts = {
        "num_train_examples": 7,
        "num_eval_examples": 5,
        "min_tokens": 20,
        "max_tokens": 30,
        "min_prompt_tokens": 13,
        "max_prompt_tokens": 14,
    }
    seen = run_trainer("kto", tiny_model_dir, tmp_path, args, examples(7), examples(5))
    planned = plan_for("kto", tiny_model_dir, args, facts)
    assert seen == planned
    # precompute: 4 + 3 (train), 4 + 1 (eval); train 2 + 2 + 2 + 1; eval 3 + 2
    assert batches(seen, "ref") == {4, 3, 1}
    assert batches(seen, "old_logps") == {2, 1}
    assert batches(seen, "eval") == {3, 2}


def test_plan_lists_only_reachable_shapes(tiny_model_dir, tmp_path):
    """Two data orders within the facts hit every planned signature, KL lengths up to 49 tokens included.

    Rows are 5..30 tokens with prompts of 1..20, so a KL row (a prompt of 20 joined to another example's
    completion of 29) reaches 49 tokens and pads to 64, while main rows pad to 16 or 32.
    """
    args = {
        "per_device_train_batch_size": 2,
        "per_device_eval_batch_size": 2,
        "max_length": 64,
        "pad_to_multiple_of": 16,
        "eval_strategy": "epoch",
        "num_train_epochs": 1,
    }
    facts = {
        "num_train_examples": 5,
        "num_eval_examples": 5,
        "min_tokens": 5,
        "max_tokens": 30,
        "min_prompt_tokens": 1,
        "max_prompt_tokens": 20,
    }
    planned = plan_for("kto", tiny_model_dir, args, facts)
    # Batches of two examples (a, b): KL rows are prompt_a + completion_b and prompt_b + completion_a.
    kl_64 = [unpaired(20, 25), unpaired(1, 30, False)]  # KL 49 -> 64, main 30 -> 32
    kl_48 = [unpaired(15, 20), unpaired(1, 30, False)]  # KL 44 -> 48, main 32
    kl_32 = [unpaired(2, 20), unpaired(2, 20, False)]  # KL 20 -> 32, main 32
    kl_16 = [unpaired(2, 10), unpaired(2, 10, False)]  # KL 10 -> 16, main 16
    short_single, long_single = [unpaired(3, 8)], [unpaired(3, 25)]  # alone in its group: KL row = main row
    seen = run_trainer(
        "kto", tiny_model_dir, tmp_path, args, kl_64 + kl_16 + short_single, kl_48 + kl_32 + short_single
    )
    seen |= run_trainer(
        "kto", tiny_model_dir, tmp_path, args, kl_48 + kl_32 + long_single, kl_64 + kl_16 + long_single
    )
    assert seen == planned


def test_under_torch_compile_the_compiled_signatures_are_what_compiles(tiny_model_dir, tmp_path):
    """The wrapped policy (main and KL forwards) and the reference copy compile, the reference in evaluate()
    too; evaluate() calls the bare policy, which runs eagerly: its signatures are listed eager."""
    args = {
        "per_device_train_batch_size": 2,
        "per_device_eval_batch_size": 3,
        "max_length": 64,
        "pad_to_multiple_of": 16,
        "eval_strategy": "epoch",
        "num_train_epochs": 1,
        "torch_compile": True,
    }
    rng = random.Random(4)

    def examples(count: int) -> list[dict]:  # main and KL rows of 19..31 tokens: all pad to 32
        return [
            unpaired(rng.randint(13, 14), rng.randint(20, 30), label=rng.random() < 0.5) for _ in range(count)
        ]

    facts = {
        "num_train_examples": 4,
        "num_eval_examples": 3,
        "min_tokens": 20,
        "max_tokens": 30,
        "min_prompt_tokens": 13,
        "max_prompt_tokens": 14,
    }
    run = record("kto", tiny_model_dir, tmp_path, args, examples(4), examples(3), torch_compile=True)
    plan = full_plan("kto", tiny_model_dir, args, facts)
    assert run.seen == planned_shapes(plan)
    assert run.compiled == compiled_shapes(plan)
    assert phases(run.compiled) == {"train", "old_logps", "ref"}
    assert batches(run.compiled, "ref") == {2, 3}  # 3: the eval loop's reference forwards compile
    assert phases(run.seen - run.compiled) == {"eval"}
