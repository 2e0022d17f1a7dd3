"""GRPO plans against TRL itself: every forward a real GRPOTrainer makes is a planned signature.

Recall: random prompt lengths within the data facts, random completion lengths (some past
max_completion_length, so cut there), the default shuffled sampler, eval with a short last batch; every
recorded (phase, batch, seq_len, cache_len) must be planned, and the phases must be exactly the planned
ones (which shows the old-log-probs and reference rules both ways). Tightness: prompt orders and
completion lengths designed within the same facts whose runs hit every planned signature.

Completion lengths are scripted (tests/support/completion_script.py): the model's EOS is forced at a
length chosen per prompt, since a tiny random model almost never ends a completion on its own.
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

M = 20  # max_completion_length: completion buckets 16, 32
BASE = {
    "per_device_train_batch_size": 2,
    "gradient_accumulation_steps": 2,
    "num_generations": 2,
    "max_completion_length": M,
    "pad_to_multiple_of": 16,
    "cache_implementation": "static",
}
FACTS = {"min_prompt_tokens": 5, "max_prompt_tokens": 40}  # prompt buckets 16, 32, 48


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_tiny_model_with_weights(tmp_path_factory.mktemp("grpo-policy"))


def random_prompts(seed: int, count: int, low: int = 5, high: int = 40) -> list:
    rng = random.Random(seed)
    return [(rng.randint(low, high), rng.randint(1, M + 5)) for _ in range(count)]


def generation(shapes: set) -> set:
    return {s for s in shapes if s[0].startswith("generate_")}


def test_static_cache_ratchet_with_eval_and_reference_is_covered(model_dir, tmp_path):
    args = {
        **BASE,
        "beta": 0.1,
        "eval_strategy": "steps",
        "eval_steps": 2,
        "per_device_eval_batch_size": 4,
        "max_steps": 4,
    }
    evals = random_prompts(2, 3)  # 3 prompts x 2 generations = 6 rows: eval batches of 4 and 2
    seen = run_trainer("grpo", model_dir, tmp_path, args, random_prompts(1, 16), evals)
    plan = planned("grpo", model_dir, args, {**FACTS, "num_eval_examples": 3})
    assert seen <= plan, f"shapes TRL produced that the plan missed: {sorted(seen - plan)}"
    assert phases(seen) == phases(plan) == {"train", "ref", "eval", "generate_prefill", "generate_decode"}
    assert {batch for phase, batch, *_ in seen if phase == "eval"} == {4, 2}


@pytest.mark.parametrize(
    ("accumulation", "steps_per_generation", "iterations", "beta", "expected"),
    [
        (2, None, 1, 0.0, set()),  # the defaults: no extra forward
        (1, 2, 1, 0.0, {"old_logps"}),  # GA % steps_per_generation != 0
        (2, None, 2, 0.0, {"old_logps"}),  # num_iterations > 1
        (4, 2, 2, 0.0, set()),  # GA % (steps_per_generation x num_iterations) == 0: none, though spg != GA
        (2, None, 1, 0.1, {"ref"}),
    ],
)
def test_old_logps_and_reference_rules(
    model_dir, tmp_path, accumulation, steps_per_generation, iterations, beta, expected
):
    args = {
        **BASE,
        "gradient_accumulation_steps": accumulation,
        "num_iterations": iterations,
        "beta": beta,
        "max_steps": 2,
    }
    if steps_per_generation is not None:
        args["steps_per_generation"] = steps_per_generation
    seen = run_trainer("grpo", model_dir, tmp_path, args, random_prompts(3, 8))
    plan = planned("grpo", model_dir, args, FACTS)
    assert seen <= plan, f"missed: {sorted(seen - plan)}"
    assert phases(seen) == phases(plan) == {"train", "generate_prefill", "generate_decode"} | expected


def test_pinned_max_cache_len_gives_one_cache_size(model_dir, tmp_path):
    args = {**BASE, "generation_kwargs": {"max_cache_len": 80}, "max_steps": 3}  # 80 >= 48 + 20 - 1
    seen = run_trainer("grpo", model_dir, tmp_path, args, random_prompts(4, 12))
    plan = planned("grpo", model_dir, args, FACTS)
    assert seen <= plan, f"missed: {sorted(seen - plan)}"
    assert {cache for *_, cache in generation(seen)} == {cache for *_, cache in generation(plan)} == {80}


def test_max_cache_len_below_the_longest_prompt_still_ratchets(model_dir, tmp_path):
    """A pin of 60 covers prompt buckets 16 and 32 (35, 51 -> 60) but not 48 (67)."""
    args = {**BASE, "generation_kwargs": {"max_cache_len": 60}, "shuffle_dataset": False, "max_steps": 3}
    prompts = [(10, 20), (12, 20), (40, 20), (33, 20), (8, 20), (9, 20)]  # buckets 16, 48, 16
    seen = run_trainer("grpo", model_dir, tmp_path, args, prompts)
    plan = planned("grpo", model_dir, args, FACTS)
    assert seen <= plan, f"missed: {sorted(seen - plan)}"
    assert {cache for *_, cache in generation(plan)} == {60, 67}
    assert ("generate_prefill", 4, 16, 60) in seen and ("generate_prefill", 4, 16, 67) in seen


def test_dynamic_cache_prefill_is_listed_and_decode_is_not(model_dir, tmp_path):
    args = {**BASE, "cache_implementation": None, "max_steps": 2}
    seen = run_trainer("grpo", model_dir, tmp_path, args, random_prompts(5, 8))
    plan = planned("grpo", model_dir, args, FACTS)
    decodes = {s for s in seen if s[0] == "generate_decode"}
    assert decodes and all(cache is None for *_, cache in decodes)
    assert not any(s[0] == "generate_decode" for s in plan)
    assert seen - decodes <= plan, f"missed: {sorted(seen - decodes - plan)}"


def test_train_side_plan_lists_only_reachable_shapes(model_dir, tmp_path):
    """One run, three rounds of two prompts, hits every planned signature (old log-probs and ref on)."""
    args = {
        **BASE,
        "gradient_accumulation_steps": 1,
        "steps_per_generation": 2,  # 1 % 2 != 0: old log-probs; generation batch 4 rows
        "beta": 0.1,
        "shuffle_dataset": False,
        "max_steps": 6,  # a round every 2 steps
    }
    facts = {"min_prompt_tokens": 5, "max_prompt_tokens": 30}  # prompt buckets 16, 32; caches 35, 51
    rounds = [
        (5, 1), (12, 16),  # P 16, C 16: width 32, cache 35
        (30, 20), (20, 17),  # P 32, C 32: width 64, cache 51
        (16, 20), (9, 5),  # P 16, C 32: width 48, cache 51 (the ratchet keeps the larger cache)
    ]  # fmt: skip
    seen = run_trainer("grpo", model_dir, tmp_path, args, rounds)
    plan = planned("grpo", model_dir, args, facts)
    assert seen == plan, f"missed: {sorted(seen - plan)}; never produced: {sorted(plan - seen)}"


def test_eval_plan_lists_only_reachable_shapes(model_dir, tmp_path):
    """Eval batches of 4 and 2 rows; two evaluations, the first with one-token completions."""
    args = {
        **BASE,
        "eval_strategy": "steps",
        "eval_steps": 1,
        "per_device_eval_batch_size": 4,
        "shuffle_dataset": False,
        "max_steps": 2,
    }
    facts = {"min_prompt_tokens": 5, "max_prompt_tokens": 16, "num_eval_examples": 3}
    train = [(5, 1), (16, 3), (10, 20), (7, 20)]  # widths 32 then 48
    evals = [(6, (1, 20)), (11, (1, 20)), (16, (1, 20))]  # evaluation 1: C 16, evaluation 2: C 32
    seen = run_trainer("grpo", model_dir, tmp_path, args, train, evals)
    plan = planned("grpo", model_dir, args, facts)
    assert seen == plan, f"missed: {sorted(seen - plan)}; never produced: {sorted(plan - seen)}"


def test_under_torch_compile_the_compiled_signatures_are_what_compiles(model_dir, tmp_path):
    """With torch_compile on, Dynamo traces the training forward and the reference copy (accelerate prepared
    it at init, so in eval too) and nothing else: TRL generates with `disable_compile=True` on the unwrapped
    module, and computes the old log-probs (and evaluate() its loss) on the bare policy.

    One round of 4 rows (prompts pad to 16, completions of 8 to 16, cache 16 + 8 - 1), then one evaluation of
    one prompt x 2 generations: the run reaches every planned signature.
    """
    args = {
        **BASE,
        "max_completion_length": 8,
        "gradient_accumulation_steps": 1,
        "steps_per_generation": 2,  # 1 % 2 != 0: old log-probs
        "beta": 0.1,
        "eval_strategy": "steps",
        "eval_steps": 2,
        "per_device_eval_batch_size": 2,
        "max_steps": 2,
        "torch_compile": True,
    }
    facts = {"min_prompt_tokens": 5, "max_prompt_tokens": 16, "num_eval_examples": 1}
    run = record("grpo", model_dir, tmp_path, args, [(5, 8), (16, 8)], [(10, 8)], torch_compile=True)
    plan = plan_for("grpo", model_dir, args, facts)
    assert run.seen == planned_shapes(plan), f"missed: {sorted(run.seen - planned_shapes(plan))}"
    assert run.compiled == compiled_shapes(plan) == {("train", 2, 32, None), ("ref", 2, 32, None)}
    assert phases(run.seen - run.compiled) == {"old_logps", "eval", "generate_prefill", "generate_decode"}
