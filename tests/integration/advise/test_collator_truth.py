"""The advisor's padded tokens and padding waste against TRL's own padding, in the trainer's own order.

For each generated dataset (uniform, bimodal, long-tailed lengths) a real TRL trainer is built on the tiny
model (nothing trains, nothing compiles) and its training dataloader is iterated: the Trainer's sampler and
TRL's own collator (DataCollatorForLanguageModeling, DataCollatorForPreference) or, for GRPO, the prompts of
each generation batch in RepeatSampler's order padded with TRL's `pad` as `_generate_and_score_completions`
pads them. Several processes: the same DataLoader through accelerate's `prepare_data_loader` for each process
index, as `accelerator.prepare` builds it on each of them. The advisor must give the same token counts.
"""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from tests.support.length_data import DISTRIBUTIONS
from tests.support.preference_runs import pair
from tests.support.shape_recorder import CPU_ARGS
from tests.support.tiny_model import init_model, words
from warmup.advise.advice import DatasetLengths, SplitLengths, advise, lengths_from_facts, replay_epochs
from warmup.job.spec import load_spec


def spec_for(trainer: str, model_dir, args: dict, world_size: int = 1):
    return load_spec(
        {
            "trainer": trainer,
            "model": str(model_dir),
            "args": {**args, "bf16": False},
            "target": {"backend": "inductor", "device": "cpu", "world_size": world_size},
        }
    )


def loaders(trainer, world_size: int) -> list:
    """The training DataLoader of each process: the trainer's own in one process; with several, the same
    DataLoader prepared by accelerate for each process index (what `accelerator.prepare` does on each)."""
    if world_size == 1:
        return [trainer.get_train_dataloader()]
    from accelerate.data_loader import prepare_data_loader
    from torch.utils.data import DataLoader

    args = trainer.args
    dataset = trainer._remove_unused_columns(trainer.train_dataset, description="Training")
    base = DataLoader(
        dataset,
        batch_size=args.per_device_train_batch_size,
        sampler=trainer._get_train_sampler(dataset),
        collate_fn=trainer.data_collator,
        drop_last=args.dataloader_drop_last,
    )
    return [
        prepare_data_loader(
            base,
            num_processes=world_size,
            process_index=rank,
            put_on_device=False,
            use_seedable_sampler=True,
            data_seed=args.data_seed,
        )
        for rank in range(world_size)
    ]


def collated(loaders: list, epochs: int = 1) -> list[tuple[int, int]]:
    """(padded tokens, real tokens) of each epoch: every batch TRL's collator built, all processes."""
    counts = []
    for _ in range(epochs):
        padded = real = 0
        for loader in loaders:
            for batch in loader:
                mask = batch["attention_mask"]
                padded += mask.numel()
                real += int(mask.sum())
        counts.append((padded, real))
    return counts


def dataset_lengths(spec, examples: list[dict], tmp_path) -> DatasetLengths:
    """Per-example lengths as the facts API reads them from the dataset file: the model's tokenizer and the
    trainer's own preprocessing (and its drops under the job's max_length)."""
    from warmup.facts.reading import dataset_facts

    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(example) + "\n" for example in examples))
    return lengths_from_facts(spec.trainer, dataset_facts(spec, path))


def build_sft(model_dir, tmp_path, args: dict, dataset):
    from transformers import AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    config = SFTConfig(output_dir=str(tmp_path / "out"), **{**CPU_ARGS, **args})
    return SFTTrainer(
        model=init_model(model_dir),
        args=config,
        train_dataset=dataset,
        processing_class=AutoTokenizer.from_pretrained(model_dir),
    )


def build_preference(kind: str, model_dir, tmp_path, args: dict, examples: list[dict]):
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import DPOConfig, DPOTrainer, RewardConfig, RewardTrainer

    config_class, trainer_class = (DPOConfig, DPOTrainer) if kind == "dpo" else (RewardConfig, RewardTrainer)
    extra = {"ref_model": init_model(model_dir, seed=1)} if kind == "dpo" else {}
    return trainer_class(
        model=init_model(model_dir),
        args=config_class(output_dir=str(tmp_path / "out"), **{**CPU_ARGS, **args}),
        train_dataset=Dataset.from_list(examples),
        processing_class=AutoTokenizer.from_pretrained(model_dir),
        **extra,
    )


# --- SFT ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("world_size", [1, 3])
@pytest.mark.parametrize("distribution", sorted(DISTRIBUTIONS))
def test_sft_language_modelling(tiny_model_dir, tmp_path, distribution, world_size):
    """Pre-tokenized text, some rows longer than max_length (cut), a short last batch (one process) or
    batches filled from the start of the epoch (three)."""
    from datasets import Dataset

    lengths = DISTRIBUTIONS[distribution](random.Random(11), 61, 4, 180)
    args = {
        "per_device_train_batch_size": 4,
        "max_length": 150,
        "pad_to_multiple_of": 16,
        "seed": 5,
        "gradient_accumulation_steps": 3,
        "num_train_epochs": 2.5,
    }
    dataset = Dataset.from_dict({"input_ids": [[10 + i % 150] * n for i, n in enumerate(lengths)]})
    trainer = build_sft(tiny_model_dir, tmp_path, args, dataset)
    truth = collated(loaders(trainer, world_size), epochs=2)
    # Optimizer steps as the Trainer counts them (before anything else builds a config: that resets accelerate).
    steps = trainer.set_initial_training_values(trainer.args, loaders(trainer, world_size)[0])[-1]

    data = DatasetLengths(train=SplitLengths.of(completion=lengths))
    advice = advise(spec_for("sft", tiny_model_dir, args, world_size), data)
    current = advice.current
    assert (current.padded_tokens, current.real_tokens) == truth[0]
    assert current.padding_waste == pytest.approx(1 - truth[0][1] / truth[0][0])
    assert current.examples_truncated == sum(n > 150 for n in lengths) > 0
    assert current.steps == steps
    # Later epochs, in their own order, too (the projection sums every epoch of the job).
    assert truth[0] != truth[1]
    replay = _epochs("sft", tiny_model_dir, args, world_size, data, 2)
    assert replay == truth


@pytest.mark.parametrize("distribution", sorted(DISTRIBUTIONS))
def test_sft_prompt_completion_drops_prompts_that_fill_max_length(tiny_model_dir, tmp_path, distribution):
    """Completion-only loss: an example whose prompt alone fills max_length has no label left and TRL drops it.
    The lengths come from the dataset file through the facts API."""
    from datasets import Dataset

    rng = random.Random(3)
    prompts = DISTRIBUTIONS[distribution](rng, 50, 2, 120)
    examples = [{"prompt": words(p), "completion": " " + words(rng.randint(1, 60), 40)} for p in prompts]
    args = {"per_device_train_batch_size": 3, "pad_to_multiple_of": 8, "seed": 9, "max_length": 64}
    truth = collated(loaders(build_sft(tiny_model_dir, tmp_path, args, Dataset.from_list(examples)), 1))

    spec = spec_for("sft", tiny_model_dir, args)
    advice = advise(spec, dataset_lengths(spec, examples, tmp_path))
    assert (advice.current.padded_tokens, advice.current.real_tokens) == truth[0]
    assert advice.current.examples_dropped == sum(p >= 64 for p in prompts) > 0  # no EOS or BOS in a prompt


# --- DPO ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("world_size", [1, 2])
@pytest.mark.parametrize("distribution", sorted(DISTRIBUTIONS))
def test_dpo_chosen_and_rejected_rows(tiny_model_dir, tmp_path, distribution, world_size):
    """2B rows per batch (chosen over rejected), each cut at max_length; prompts that fill max_length dropped."""
    rng = random.Random(21)
    prompts = DISTRIBUTIONS[distribution](rng, 45, 2, 90)
    examples = [pair(p, p + rng.randint(1, 50), p + rng.randint(1, 50)) for p in prompts]
    args = {"per_device_train_batch_size": 3, "max_length": 80, "pad_to_multiple_of": 32, "seed": 2}
    truth = collated(loaders(build_preference("dpo", tiny_model_dir, tmp_path, args, examples), world_size))

    spec = spec_for("dpo", tiny_model_dir, args, world_size)
    advice = advise(spec, dataset_lengths(spec, examples, tmp_path))
    assert (advice.current.padded_tokens, advice.current.real_tokens) == truth[0]
    assert advice.current.examples_dropped == sum(p >= 80 for p in prompts)


@pytest.mark.parametrize("world_size", [1, 2])
@pytest.mark.parametrize("distribution", sorted(DISTRIBUTIONS))
def test_reward_drops_pairs_with_a_row_past_max_length(
    tiny_reward_model_dir, tmp_path, distribution, world_size
):
    rng = random.Random(31)
    prompts = DISTRIBUTIONS[distribution](rng, 41, 2, 70)
    examples = [pair(p, p + rng.randint(1, 40), p + rng.randint(1, 40)) for p in prompts]
    args = {"per_device_train_batch_size": 3, "max_length": 72, "pad_to_multiple_of": 16, "seed": 4}
    trainer = build_preference("reward", tiny_reward_model_dir, tmp_path, args, examples)
    truth = collated(loaders(trainer, world_size))

    spec = spec_for("reward", tiny_reward_model_dir, args, world_size)
    advice = advise(spec, dataset_lengths(spec, examples, tmp_path))
    assert (advice.current.padded_tokens, advice.current.real_tokens) == truth[0]
    longest = [
        max(len(e["prompt"].split()) + len(e[k].split()) for k in ("chosen", "rejected")) for e in examples
    ]
    assert advice.current.examples_dropped == sum(n > 72 for n in longest) > 0


# --- GRPO ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["grpo", "rloo"])
@pytest.mark.parametrize("distribution", sorted(DISTRIBUTIONS))
def test_grpo_prompt_and_completion_padding(tiny_model_dir, tmp_path, distribution, kind):
    """Each generation batch's prompts (left) and completions (right) padded over the whole batch with TRL's
    `pad`, at the steps where `_prepare_inputs` generates, every completion the assumed 37 tokens long."""
    import torch
    import trl
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl.trainer.utils import pad

    prompts = DISTRIBUTIONS[distribution](random.Random(8), 40, 3, 100)
    args = {
        "per_device_train_batch_size": 4,
        "num_generations": 2,
        "gradient_accumulation_steps": 3,
        "num_iterations": 2,
        "max_completion_length": 48,
        "pad_to_multiple_of": 16,
        "seed": 13,
        "beta": 0.0,  # no reference model to load (RLOO's default 0.05 loads one from the model directory)
    }
    config_class, trainer_class = (
        (trl.GRPOConfig, trl.GRPOTrainer) if kind == "grpo" else (trl.RLOOConfig, trl.RLOOTrainer)
    )
    config = config_class(output_dir=str(tmp_path / "out"), **{**CPU_ARGS, **args})
    trainer = trainer_class(
        model=init_model(tiny_model_dir),
        reward_funcs=lambda completions, **_: [0.0] * len(completions),
        args=config,
        train_dataset=Dataset.from_dict({"prompt": [words(p) for p in prompts]}),
        processing_class=AutoTokenizer.from_pretrained(tiny_model_dir),
    )
    generate_every = config.steps_per_generation * config.num_iterations
    completion = 37
    truth = []
    loader = trainer.get_train_dataloader()
    for _ in range(2):
        padded = real = 0
        for step, batch in enumerate(loader):
            if step % generate_every:
                continue  # the buffered generation batch is reused
            prompt_ids, _, _ = trainer._tokenize_prompts([x["prompt"] for x in batch])
            masks = [
                pad([torch.ones(len(ids), dtype=torch.long) for ids in prompt_ids], 0, "left", 16),
                pad([torch.ones(completion, dtype=torch.long) for _ in prompt_ids], 0, "right", 16),
            ]
            padded += sum(m.numel() for m in masks)
            real += sum(int(m.sum()) for m in masks)
        truth.append((padded, real))

    spec = spec_for(kind, tiny_model_dir, args)
    data = dataset_lengths(spec, [{"prompt": words(p)} for p in prompts], tmp_path)
    assert data.train.prompt.tolist() == prompts
    advice = advise(spec, data, completion_tokens=completion)
    assert (advice.current.padded_tokens, advice.current.real_tokens) == truth[0]
    assert _epochs(kind, tiny_model_dir, args, 1, data, 2, completion_tokens=completion) == truth


def _epochs(trainer, model_dir, args, world_size, data, count, **kwargs) -> list[tuple[int, int]]:
    """The advisor's replay of the first `count` epochs, as (padded, real) tokens."""
    spec = spec_for(trainer, model_dir, args, world_size)
    return [(epoch.padded, epoch.real) for epoch in replay_epochs(spec, data, count, **kwargs)]


def test_sampler_order_is_the_trainers(tiny_model_dir, tmp_path):
    """Not just the totals: the replayed first batch holds the very examples the Trainer's first batch holds."""
    from datasets import Dataset

    from warmup.advise.simulate import epoch_order

    lengths = list(range(1, 41))  # example i has i tokens: a batch's lengths name its examples
    dataset = Dataset.from_dict({"input_ids": [[7] * n for n in lengths]})
    args = {"per_device_train_batch_size": 5, "max_length": 64, "data_seed": 123}
    batch = next(iter(build_sft(tiny_model_dir, tmp_path, args, dataset).get_train_dataloader()))
    seen = sorted(int(row.sum()) for row in batch["attention_mask"])
    order = epoch_order(len(lengths), 123, 0, sequential=False)
    assert seen == sorted(np.asarray(lengths)[order[:5]].tolist())
