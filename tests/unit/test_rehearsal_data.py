"""Synthetic data: TRL's own collators turn it into exactly the planned batch shapes."""

from __future__ import annotations

import pytest

from warmup.errors import RehearsalError
from warmup.rehearsal.data import (
    TextMaker,
    longest_row,
    preference_rows,
    prompt_rows,
    reward_rows,
    row_lengths,
    sft_rows,
)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def test_longest_row_pads_to_the_width_and_respects_truncation():
    assert longest_row(64, 32, None) == 64
    assert longest_row(128, 128, 100) == 100  # max_length 100 still pads to 128
    assert longest_row(37, None, None) == 37
    with pytest.raises(RehearsalError, match="never produces"):
        longest_row(256, 128, 64)  # rows stop at 64, which pads to 128
    with pytest.raises(RehearsalError):
        longest_row(48, 32, None)


def test_row_lengths_vary_below_the_longest():
    lengths = row_lengths(4, 64, 32, None)
    assert max(lengths) == 64 and len(set(lengths)) == 4 and min(lengths) >= 1


@pytest.mark.parametrize(
    ("rows", "width", "multiple", "max_length"), [(2, 32, 32, 64), (3, 64, 32, 64), (4, 37, None, 64)]
)
def test_sft_rows_collate_to_the_planned_shape(tokenizer, rows, width, multiple, max_length):
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    collator = DataCollatorForLanguageModeling(
        pad_token_id=tokenizer.pad_token_id, pad_to_multiple_of=multiple
    )
    batch = collator(sft_rows(tokenizer, rows, width, multiple, max_length, packing=False))
    assert tuple(batch["input_ids"].shape) == (rows, width)
    assert batch["attention_mask"].sum() < rows * width  # real padding, like real data
    special = set(tokenizer.all_special_ids)
    assert not special & set(batch["input_ids"][batch["attention_mask"] == 1].tolist())


def test_reward_rows_collate_to_twice_the_pairs(tokenizer):
    from trl.trainer.reward_trainer import DataCollatorForPreference

    collator = DataCollatorForPreference(pad_token_id=tokenizer.pad_token_id, pad_to_multiple_of=16)
    batch = collator(reward_rows(tokenizer, 3, 48, 16, 48))
    assert tuple(batch["input_ids"].shape) == (6, 48)


def test_text_maker_builds_exact_token_counts(tokenizer):
    texts = TextMaker(tokenizer)
    for tokens in (1, 7, 64):
        assert len(tokenizer(text=texts.text(tokens))["input_ids"]) == tokens
    eos = tokenizer.eos_token
    assert len(tokenizer(text=texts.text(10, suffix=eos) + eos)["input_ids"]) == 10


def test_preference_rows_tokenize_to_the_planned_rows(tokenizer):
    eos = tokenizer.eos_token
    examples = preference_rows(TextMaker(tokenizer), 2, 64, 32, 64, eos)
    lengths = []
    for example in examples:
        for completion in ("chosen", "rejected"):
            lengths.append(len(tokenizer(text=example["prompt"] + example[completion] + eos)["input_ids"]))
        assert len(tokenizer(text=example["prompt"])["input_ids"]) < 64
    assert max(lengths) == 64 and min(lengths) > 32 - 32  # the longest row reaches the width


def test_prompt_rows_pad_to_the_prompt_width(tokenizer):
    rows = prompt_rows(TextMaker(tokenizer), 3, 32, 16)
    lengths = [len(tokenizer(text=row["prompt"])["input_ids"]) for row in rows]
    assert max(lengths) == 32 and min(lengths) > 16


def test_text_maker_refuses_a_tokenizer_it_cannot_count_with():
    class Chars:
        """Every string is one token: no repetition adds a token at a time."""

        def __call__(self, text: str) -> dict:
            return {"input_ids": [0]}

        def get_vocab(self) -> dict:
            return {}

    with pytest.raises(RehearsalError, match="exact token count"):
        TextMaker(Chars()).text(5)
