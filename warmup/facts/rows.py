"""The rows of each trainer family: what a row and a prompt are, after which of TRL's `_prepare_dataset`.

The calls are TRL's own (`is_conversational`, `extract_prompt`, `maybe_convert_to_chatml`,
`common_prefix_length`); the rules between them (EOS appended to plain text, the prompt / completion split,
which examples a trainer drops) follow each trainer's `_prepare_dataset`. A family's record says which
rows it has (`TrainerFamily.dataset_rows`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from warmup.errors import DatasetError
from warmup.facts.recipe import Recipe
from warmup.facts.tokenizing import Tokenize
from warmup.job.trl_args import truncation_slice


@dataclasses.dataclass
class BatchRows:
    """What one batch of examples came to: the kept rows' lengths, the prompts' lengths, examples dropped."""

    lengths: list[int]
    prompts: list[int] | None
    dropped: int
    examples: int


def _prompt_plus(key: str) -> Callable[[dict[str, Any]], Any]:
    """The prompt followed by the example's `key` (a completion): text or messages, joined as TRL joins them."""

    def part(example: dict[str, Any]) -> Any:
        return example["prompt"] + example[key]

    return part


def _example_kwargs(example: dict[str, Any]) -> dict[str, Any]:
    """The per-example chat-template arguments SFT / DPO / KTO / Reward pass (`tools`, `chat_template_kwargs`)."""
    import json

    tools = example.get("tools")
    tools = json.loads(tools) if isinstance(tools, str) else tools
    own = {"tools": tools} if tools is not None else {}
    own.update(example.get("chat_template_kwargs") or {})
    return own


class Rows:
    """Tokenizes batches of one split; dataset-level decisions come from the split's first example, as TRL's do."""

    def __init__(self, recipe: Recipe, *, packing: bool, first: dict[str, Any]) -> None:
        self.recipe = recipe
        self.tok = Tokenize(recipe)
        self.packing = packing  # whether this split is packed: packed rows are never truncated
        self.first = first  # the split's first example

    def __call__(self, batch: list[dict[str, Any]]) -> BatchRows:
        """The rows of one batch of the split (never empty: the reader hands out none)."""
        from trl.data_utils import is_conversational

        rows = self.recipe.family.dataset_rows
        if rows == "sft":
            return self._sft(batch)
        if rows == "preference":
            return self._preference(batch, is_conversational)
        if rows == "reward":
            return self._reward(batch, is_conversational)
        return self._prompts(batch, is_conversational)

    # SFTTrainer._prepare_dataset
    def _sft(self, batch: list[dict[str, Any]]) -> BatchRows:
        from trl.data_utils import (
            common_prefix_length,
            is_conversational,
            is_conversational_from_value,
            maybe_convert_to_chatml,
        )

        recipe = self.recipe
        first = self.first
        if "input_ids" in first:  # already tokenized: TRL takes it as it is
            return BatchRows([len(e["input_ids"]) for e in batch], None, 0, len(batch))
        if is_conversational_from_value(first):
            batch = [maybe_convert_to_chatml(dict(e)) for e in batch]
            first = maybe_convert_to_chatml(dict(first))
        if not is_conversational(first):
            eos = self.tok.tokenizer.eos_token or ""
            field = recipe.dataset_text_field
            fixed = []
            for example in batch:
                example = dict(example)
                if field in example and not example[field].endswith(eos):
                    example[field] = example[field] + eos
                elif "completion" in example and not example["completion"].endswith(eos):
                    example["completion"] = example["completion"] + eos
                fixed.append(example)
            batch = fixed
        completion_only = (
            recipe.completion_only_loss
            if recipe.completion_only_loss is not None
            else ("prompt" in first and "completion" in first)
        )
        lengths: list[int] = []
        prompts: list[int] = []
        masks: list[list[int] | None] = [None] * len(batch)
        has_prompt = ["prompt" in e for e in batch]
        conversational = [is_conversational(e) for e in batch]
        if any(has_prompt):
            prompt_ids = self._split_ids(
                batch,
                [i for i, p in enumerate(has_prompt) if p],
                conversational,
                lambda e: e["prompt"],
                prompt=True,
            )
            full_ids = self._split_ids(
                batch,
                [i for i, p in enumerate(has_prompt) if p],
                conversational,
                lambda e: e["prompt"] + e["completion"],
                prompt=False,
            )
        whole: dict[int, int] = {}
        lm = [i for i, p in enumerate(has_prompt) if not p]
        if lm:
            chat = [i for i in lm if conversational[i]]
            plain = [i for i in lm if not conversational[i]]
            if chat:
                ids = self.tok.chat(
                    [batch[i]["messages"] for i in chat],
                    generation_prompt=False,
                    kwargs=[_example_kwargs(batch[i]) for i in chat],
                )
                whole.update({i: len(x) for i, x in zip(chat, ids, strict=True)})
                if recipe.assistant_only_loss:
                    found = self.tok.assistant_masks(
                        [batch[i]["messages"] for i in chat], [_example_kwargs(batch[i]) for i in chat]
                    )
                    for i, mask in zip(chat, found, strict=True):
                        masks[i] = mask
            if plain:
                ids = self.tok.text([batch[i][recipe.dataset_text_field] for i in plain])
                whole.update({i: len(x) for i, x in zip(plain, ids, strict=True)})
        dropped = 0
        for i, example in enumerate(batch):
            if has_prompt[i]:
                p_ids, f_ids = prompt_ids[i], full_ids[i]
                length = len(f_ids)
                prompt_len = common_prefix_length(p_ids, f_ids)
                if recipe.assistant_only_loss and conversational[i]:
                    masks[i] = self.tok.assistant_masks(
                        [example["prompt"] + example["completion"]], [_example_kwargs(example)]
                    )[0]
            else:
                length, prompt_len = whole[i], 0
            if self._sft_drops(length, prompt_len if completion_only else 0, masks[i]):
                dropped += 1
                continue
            lengths.append(length)
            if has_prompt[i]:
                prompts.append(prompt_len)
        return BatchRows(lengths, prompts if any(has_prompt) else None, dropped, len(batch))

    def _split_ids(
        self,
        batch: list[dict[str, Any]],
        indices: list[int],
        conversational: list[bool],
        part: Callable[[dict[str, Any]], Any],
        *,
        prompt: bool,
    ) -> dict[int, list[int]]:
        """Token ids of `part(example)` for the examples at `indices`: chat-templated (the prompt alone with the
        generation prompt) or plain text, as TRL's tokenize functions do."""
        out: dict[int, list[int]] = {}
        chat = [i for i in indices if conversational[i]]
        plain = [i for i in indices if not conversational[i]]
        if chat:
            ids = self.tok.chat(
                [part(batch[i]) for i in chat],
                generation_prompt=prompt,
                kwargs=[_example_kwargs(batch[i]) for i in chat],
            )
            out.update(zip(chat, ids, strict=True))
        if plain:
            out.update(zip(plain, self.tok.text([part(batch[i]) for i in plain]), strict=True))
        return out

    def _sft_drops(self, length: int, masked_prefix: int, assistant: list[int] | None) -> bool:
        """SFT drops an example whose labels are all -100 after truncation (only when it truncates: no packing)."""
        recipe = self.recipe
        if recipe.max_length is None or self.packing:
            return False
        window = range(length)[truncation_slice(recipe.max_length, recipe.truncation_mode)]
        return not any(i >= masked_prefix and (assistant is None or assistant[i]) for i in window)

    # DPOTrainer / KTOTrainer._prepare_dataset
    def _preference(
        self, batch: list[dict[str, Any]], is_conversational: Callable[[dict[str, Any]], bool]
    ) -> BatchRows:
        from trl.data_utils import common_prefix_length, extract_prompt

        recipe = self.recipe
        first = self.first
        if "prompt" not in first:
            batch = [{**e, **extract_prompt(e)} for e in batch]
            first = {**first, **extract_prompt(first)}
        completions = list(recipe.family.completion_columns)
        if recipe.family.unpairs_preferences and "chosen" in first and "rejected" in first:
            # unpair_preference_dataset, per batch: every chosen row, then every rejected row
            batch = [{**e, "completion": e["chosen"], "label": True} for e in batch] + [
                {**e, "completion": e["rejected"], "label": False} for e in batch
            ]
        if not is_conversational(first):
            eos = self.tok.tokenizer.eos_token or ""
            batch = [
                {**e, **{key: e[key] if e[key].endswith(eos) else e[key] + eos for key in completions}}
                for e in batch
            ]
        conversational = [is_conversational(e) for e in batch]
        everyone = list(range(len(batch)))
        prompt_ids = self._split_ids(batch, everyone, conversational, lambda e: e["prompt"], prompt=True)
        full = {
            key: self._split_ids(batch, everyone, conversational, _prompt_plus(key), prompt=False)
            for key in completions
        }
        lengths: list[int] = []
        prompts: list[int] = []
        dropped = 0
        drops_long_prompts = recipe.max_length is not None and (
            recipe.family.drops_long_prompts or recipe.truncation_mode == "keep_start"
        )
        for i in everyone:
            prompt_len = min(common_prefix_length(prompt_ids[i], full[key][i]) for key in completions)
            if drops_long_prompts and prompt_len >= recipe.max_length:
                dropped += 1
                continue
            lengths += [len(full[key][i]) for key in completions]
            prompts.append(prompt_len)
        return BatchRows(lengths, prompts, dropped, len(batch))

    # RewardTrainer._prepare_dataset
    def _reward(
        self, batch: list[dict[str, Any]], is_conversational: Callable[[dict[str, Any]], bool]
    ) -> BatchRows:
        recipe = self.recipe
        first = self.first
        if "chosen_ids" in first and "rejected_ids" in first:
            pairs = [(len(e["chosen_ids"]), len(e["rejected_ids"])) for e in batch]
        else:
            if not is_conversational(first):
                eos = self.tok.tokenizer.eos_token or ""
                batch = [
                    {
                        **e,
                        **{
                            k: e[k] if e[k].endswith(eos) else e[k] + eos
                            for k in ("chosen", "rejected")
                            if k in e
                        },
                    }
                    for e in batch
                ]
            if "prompt" in first:
                batch = [
                    {**e, "chosen": e["prompt"] + e["chosen"], "rejected": e["prompt"] + e["rejected"]}
                    for e in batch
                ]
            conversational = [is_conversational(e) for e in batch]
            everyone = list(range(len(batch)))
            chosen = self._split_ids(batch, everyone, conversational, lambda e: e["chosen"], prompt=False)
            rejected = self._split_ids(batch, everyone, conversational, lambda e: e["rejected"], prompt=False)
            pairs = [(len(chosen[i]), len(rejected[i])) for i in everyone]
        lengths: list[int] = []
        dropped = 0
        for pair in pairs:
            if recipe.max_length is not None and max(pair) > recipe.max_length:
                dropped += 1  # RewardTrainer filters pairs with a row longer than max_length
                continue
            lengths += pair
        return BatchRows(lengths, None, dropped, len(batch))

    # GRPOTrainer / RLOOTrainer / DistillationTrainer._tokenize_prompts
    def _prompts(
        self, batch: list[dict[str, Any]], is_conversational: Callable[[dict[str, Any]], bool]
    ) -> BatchRows:
        if "prompt" not in batch[0]:
            raise DatasetError(
                f"the dataset has no 'prompt' column (columns: {', '.join(batch[0])}); TRL's {self.recipe.trainer} "
                "trainer generates from 'prompt'",
                loc="dataset",
            )
        prompts = [e["prompt"] for e in batch]
        if is_conversational({"prompt": prompts[0]}):
            ids = self.tok.chat(
                prompts,
                generation_prompt=True,
                kwargs=[dict(self.recipe.chat_template_kwargs)] * len(prompts),
            )
        else:
            ids = self.tok.text(prompts)
        lengths = [len(x) for x in ids]
        return BatchRows([], lengths, 0, len(batch))
