"""SFT plans against TRL itself: every forward a real SFTTrainer makes is a planned signature.

Recall: random data within the spec's data facts, the default random sampler, eval on, a short last
batch; every recorded shape must be in the plan. Tightness: data orders designed (each consistent
with the same facts) whose runs together produce every planned signature, so the plan lists
nothing the run cannot produce.
"""

from __future__ import annotations

import random

import pytest

from tests.support.shape_recorder import ShapeRecorder, planned_shapes
from tests.support.tiny_model import init_model
from warmup.planner import plan_spec
from warmup.spec import load_spec

CPU_ARGS = {
    "use_cpu": True,
    "bf16": False,
    "report_to": "none",
    "save_strategy": "no",
    "logging_strategy": "no",
}


def run_sft(model_dir, tmp_path, args: dict, train_lengths: list[int], eval_lengths: list[int] | None = None):
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    def dataset(lengths: list[int], offset: int) -> Dataset:
        return Dataset.from_dict(
            {"input_ids": [[10 + (offset + i) % 150] * n for i, n in enumerate(lengths)]}
        )

    config = SFTConfig(output_dir=str(tmp_path / "out"), **CPU_ARGS, **args)
    trainer = SFTTrainer(
        model=init_model(model_dir),
        args=config,
        train_dataset=dataset(train_lengths, 0),
        eval_dataset=dataset(eval_lengths, 7) if eval_lengths else None,
        processing_class=AutoTokenizer.from_pretrained(model_dir),
    )
    recorder = ShapeRecorder()
    recorder.attach(trainer.model)
    trainer.train()
    return recorder.seen


def sft_plan(model_dir, args: dict, data: dict):
    spec = load_spec(
        {
            "trainer": "sft",
            "model": str(model_dir),
            "args": {**args, "bf16": False},
            "data": data,
            "target": {"backend": "inductor", "device": "cpu"},
        }
    )
    return planned_shapes(plan_spec(spec))


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
