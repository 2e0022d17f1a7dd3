"""SFT plans against TRL itself: every forward a real SFTTrainer makes is a planned signature.

Recall: random data within the spec's data facts, the default random sampler, eval on, a short last
batch; every recorded shape must be in the plan. Tightness: data orders designed (each consistent
with the same facts) whose runs together produce every planned signature, so the plan lists
nothing the run cannot produce.
"""

from __future__ import annotations

import contextlib
import random

import pytest

from tests.support.shape_recorder import (
    CPU_ARGS,
    DYNAMO_EAGER,
    ShapeRecorder,
    check_compiled,
    compiled_shapes,
    compiling,
    planned_shapes,
)
from tests.support.tiny_model import init_model
from warmup.job.spec import load_spec
from warmup.planner.planning import plan_spec
from warmup.signature import Plan


def run_sft(model_dir, tmp_path, args: dict, train_lengths: list[int], eval_lengths: list[int] | None = None):
    return record_sft(model_dir, tmp_path, args, train_lengths, eval_lengths).seen


def record_sft(
    model_dir,
    tmp_path,
    args: dict,
    train_lengths: list[int],
    eval_lengths: list[int] | None = None,
    *,
    torch_compile: bool = False,
) -> ShapeRecorder:
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    def dataset(lengths: list[int], offset: int) -> Dataset:
        return Dataset.from_dict(
            {"input_ids": [[10 + (offset + i) % 150] * n for i, n in enumerate(lengths)]}
        )

    compile_args = DYNAMO_EAGER if torch_compile else {}
    config = SFTConfig(output_dir=str(tmp_path / "out"), **{**CPU_ARGS, **args, **compile_args})
    recorder = ShapeRecorder()
    with compiling(recorder) if torch_compile else contextlib.nullcontext():
        trainer = SFTTrainer(
            model=init_model(model_dir),
            args=config,
            train_dataset=dataset(train_lengths, 0),
            eval_dataset=dataset(eval_lengths, 7) if eval_lengths else None,
            processing_class=AutoTokenizer.from_pretrained(model_dir),
        )
        recorder.attach(trainer.model)
        trainer.train()
    if torch_compile:
        check_compiled(trainer.model_wrapped)
    return recorder


def sft_plan(model_dir, args: dict, data: dict):
    return planned_shapes(full_sft_plan(model_dir, args, data))


def full_sft_plan(model_dir, args: dict, data: dict) -> Plan:
    spec = load_spec(
        {
            "trainer": "sft",
            "model": str(model_dir),
            "args": {**args, "bf16": False},
            "data": data,
            "target": {"backend": "inductor", "device": "cpu"},
        }
    )
    return plan_spec(spec)


def test_plain_sft_random_data_is_covered(tiny_model_dir, tmp_path):
    rng = random.Random(0)
    args = {
        "per_device_train_batch_size": 3,
        "per_device_eval_batch_size": 2,
        "max_length": 50,
        "pad_to_multiple_of": 16,
        "eval_strategy": "steps",
        "eval_steps": 2,
        "num_train_epochs": 2,
    }
    train = [rng.randint(5, 70) for _ in range(10)]  # some longer than max_length: truncated
    evals = [rng.randint(5, 70) for _ in range(5)]
    seen = run_sft(tiny_model_dir, tmp_path, args, train, evals)
    planned = sft_plan(
        tiny_model_dir,
        args,
        {"num_train_examples": 10, "num_eval_examples": 5, "min_tokens": 5, "max_tokens": 70},
    )
    assert seen, "the trainer made no forward"
    assert seen <= planned, f"shapes TRL produced that the plan missed: {sorted(seen - planned)}"
    assert {p for p, *_ in seen} == {"train", "eval"}
    assert ("train", 1, 48, None) in planned or (
        "train",
        1,
        64,
        None,
    ) in planned  # 10 % 3: a 1-row last batch


def test_plain_sft_plan_lists_only_reachable_shapes(tiny_model_dir, tmp_path):
    """Four data orders, each within the facts, together hit every planned signature."""
    args = {
        "per_device_train_batch_size": 2,
        "max_length": 64,
        "pad_to_multiple_of": 16,
        "train_sampling_strategy": "sequential",
    }
    facts = {"num_train_examples": 9, "min_tokens": 5, "max_tokens": 50}
    planned = sft_plan(tiny_model_dir, args, facts)
    seen: set = set()
    for last in (5, 20, 40, 50):
        seen |= run_sft(tiny_model_dir, tmp_path, args, [5, 5, 20, 20, 40, 40, 50, 50, last])
    assert seen == planned


def test_wrapped_packing_rows_are_max_length(tiny_model_dir, tmp_path):
    args = {
        "per_device_train_batch_size": 2,
        "max_length": 40,
        "pad_to_multiple_of": 16,
        "packing": True,
        "packing_strategy": "wrapped",
        "dataloader_drop_last": True,
    }
    rng = random.Random(1)
    seen = run_sft(tiny_model_dir, tmp_path, args, [rng.randint(5, 30) for _ in range(30)])
    planned = sft_plan(tiny_model_dir, args, {"num_train_examples": 30, "min_tokens": 5, "max_tokens": 30})
    assert seen == planned == {("train", 2, 48, None)}


@pytest.mark.parametrize("strategy", ["bfd", "bfd_split"])
def test_bfd_packing_is_padding_free_and_covered(tiny_model_dir, tmp_path, strategy):
    args = {
        "per_device_train_batch_size": 2,
        "max_length": 40,
        "pad_to_multiple_of": 16,
        "packing": True,
        "packing_strategy": strategy,
    }
    rng = random.Random(2)
    seen = run_sft(tiny_model_dir, tmp_path, args, [rng.randint(5, 30) for _ in range(20)])
    planned = sft_plan(tiny_model_dir, args, {"num_train_examples": 20, "min_tokens": 5, "max_tokens": 30})
    assert {batch for _, batch, _, _ in seen} == {1}
    assert seen <= planned


def test_under_torch_compile_training_compiles_and_eval_is_listed_eager(tiny_model_dir, tmp_path):
    """The Trainer compiles the policy it trains; evaluate() calls the bare policy, which runs eagerly.

    Every row pads to 32, so the run reaches every planned signature: train 2x32, eval 2x32 and 1x32.
    """
    args = {
        "per_device_train_batch_size": 2,
        "per_device_eval_batch_size": 2,
        "max_length": 64,
        "pad_to_multiple_of": 16,
        "eval_strategy": "epoch",
        "num_train_epochs": 1,
        "torch_compile": True,
    }
    run = record_sft(tiny_model_dir, tmp_path, args, [20, 30, 17, 25], [18, 32, 24], torch_compile=True)
    plan = full_sft_plan(
        tiny_model_dir,
        args,
        {"num_train_examples": 4, "num_eval_examples": 3, "min_tokens": 17, "max_tokens": 32},
    )
    assert (
        run.seen
        == planned_shapes(plan)
        == {("train", 2, 32, None), ("eval", 2, 32, None), ("eval", 1, 32, None)}
    )
    assert run.compiled == compiled_shapes(plan) == {("train", 2, 32, None)}
    assert run.graphs > 0  # Dynamo's graph count works (the distillation test relies on it reading 0)


def test_wrapped_packing_ends_on_a_partial_packed_batch_the_plan_lists(tiny_model_dir, tmp_path):
    """Five examples of 29 tokens pack into 145 / 32 = 5 rows (the last a remainder of 17): batches of 2, 2, 1.

    Without the packed row count the plan lists every last batch the packed dataset can have; with the facts
    `warmup facts` writes for a packed job (packed rows and their lengths) it lists exactly what TRL produced.
    """
    args = {
        "per_device_train_batch_size": 2,
        "max_length": 32,
        "pad_to_multiple_of": 16,
        "packing": True,
        "packing_strategy": "wrapped",
        "train_sampling_strategy": "sequential",
    }
    seen = run_sft(tiny_model_dir, tmp_path, args, [29] * 5)
    assert seen == {
        ("train", 2, 32, None),
        ("train", 1, 32, None),
    }  # the last batch: the remainder row, 17 -> 32
    unknown = sft_plan(tiny_model_dir, args, {"min_tokens": 29, "max_tokens": 29})
    assert (
        seen <= unknown and ("train", 1, 16, None) in unknown
    )  # a remainder of 1..16 tokens would be 16 wide
    packed_facts = {"num_train_examples": 5, "num_train_rows": 5, "length_histogram": {32: 4, 17: 1}}
    assert sft_plan(tiny_model_dir, args, packed_facts) == seen


def test_with_packing_the_example_count_is_not_taken_for_the_packed_row_count(tiny_model_dir, tmp_path):
    """Thirty examples of 37 tokens pack into 1110 / 128 = 9 rows (8 full, a remainder of 86): batches of 2, 2,
    2, 2 and a last one of 1 row. `num_train_examples: 30` is the dataset's count, as users and TRL's docs mean it;
    read as the packed row count (30, even) it planned train 2x128 alone and missed the 1x128 the run made. The
    row count unknown, every last-batch size is listed; with the packed row count `warmup facts` writes
    (num_train_rows), exactly the one the run has."""
    args = {
        "per_device_train_batch_size": 2,
        "max_length": 128,
        "pad_to_multiple_of": 128,
        "packing": True,
        "packing_strategy": "wrapped",
        "train_sampling_strategy": "sequential",
    }
    seen = run_sft(tiny_model_dir, tmp_path, args, [37] * 30)
    assert seen == {("train", 2, 128, None), ("train", 1, 128, None)}
    examples = {"num_train_examples": 30, "min_tokens": 37, "max_tokens": 37}
    assert sft_plan(tiny_model_dir, args, examples) == seen
    assert sft_plan(tiny_model_dir, args, {**examples, "num_train_rows": 9}) == seen
    # a batch size with no partial batch at that row count lists the full batch alone
    assert sft_plan(
        tiny_model_dir, {**args, "per_device_train_batch_size": 3}, {**examples, "num_train_rows": 9}
    ) == {("train", 3, 128, None)}


def test_padding_free_without_packing_is_covered(tiny_model_dir, tmp_path):
    args = {
        "per_device_train_batch_size": 2,
        "max_length": None,
        "padding_free": True,
        "pad_to_multiple_of": 16,
    }
    rng = random.Random(3)
    lengths = [rng.randint(5, 30) for _ in range(7)]
    seen = run_sft(tiny_model_dir, tmp_path, args, lengths)
    planned = sft_plan(tiny_model_dir, args, {"num_train_examples": 7, "min_tokens": 5, "max_tokens": 30})
    assert {batch for _, batch, _, _ in seen} == {1}
    assert seen <= planned, f"shapes TRL produced that the plan missed: {sorted(seen - planned)}"
