"""Synthetic data that makes TRL's own collators produce exactly the planned shapes.

TRL pads a batch to `ceil_m(longest row)`, so a batch reaches a planned width `L` when its longest
row has a length `r` with `ceil_m(r) == L` (and `r <= max_length` where the trainer truncates).
The other rows are shorter, so the batch has padding like real data; their lengths change no graph.

Where a trainer accepts pre-tokenized rows (SFT `input_ids`, Reward `chosen_ids` / `rejected_ids`)
the builders give token ids directly. DPO and GRPO/RLOO tokenize text themselves, so their builders
write text whose token count under the job's own tokenizer is exact (checked by tokenizing it).
Either way the driver checks the shapes the trainer actually produced before it trusts a run.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from warmup.errors import RehearsalError
from warmup.rehearsal.units import ceil_to

# Strings that most tokenizers encode as one token each when repeated (BPE " a" -> "Ġa", ...).
TEXT_UNITS = (" a", " the", " x", " 1", "a ", " hello", ".")


def longest_row(seq_len: int, multiple: int | None, max_length: int | None) -> int:
    """The longest row length that pads to `seq_len` and survives truncation at `max_length`."""
    longest = seq_len if max_length is None else min(seq_len, max_length)
    if longest < 1 or ceil_to(longest, multiple) != seq_len:
        raise RehearsalError(
            f"no row pads to width {seq_len}: with pad_to_multiple_of={multiple} and max_length={max_length} "
            "the trainer never produces that width; the plan and the spec disagree"
        )
    return longest


def row_lengths(
    rows: int, seq_len: int, multiple: int | None, max_length: int | None, shortest: int = 1
) -> list[int]:
    """`rows` lengths whose longest pads to `seq_len`; the others vary below it."""
    longest = longest_row(seq_len, multiple, max_length)
    return [max(shortest, min(longest, longest - 3 * index)) for index in range(rows)]


def token_ids(vocab_size: int, special_ids: Sequence[int], length: int, offset: int = 0) -> list[int]:
    """`length` ordinary token ids (no special tokens), varied by `offset`."""
    special = set(special_ids)
    ordinary = [token for token in range(min(vocab_size, 4096)) if token not in special]
    if not ordinary:
        raise RehearsalError("the tokenizer has no ordinary tokens to build synthetic data from")
    return [ordinary[(offset * 7 + index * 13) % len(ordinary)] for index in range(length)]


class TextMaker:
    """Texts of an exact token count under a tokenizer, as the trainer will tokenize them.

    `count(text)` is how the trainer counts (default: `len(tokenizer(text=text)["input_ids"])`, which
    is what DPO and GRPO/RLOO do for plain-text examples). A repeated unit string is searched for
    that adds exactly one token per repetition; every text returned has been counted.
    """

    def __init__(self, tokenizer: Any, count: Callable[[str], int] | None = None) -> None:
        self.tokenizer = tokenizer
        self.count = count or (lambda text: len(tokenizer(text=text)["input_ids"]))
        self.base = self.count("")
        self._unit: str | None = None

    def unit(self) -> str:
        if self._unit is None:
            for candidate in self._candidates():
                if all(self.count(candidate * k) == self.base + k for k in (1, 2, 5, 33)):
                    self._unit = candidate
                    break
            else:
                raise RehearsalError(
                    "cannot build texts of an exact token count with this tokenizer (no repeated string adds "
                    "one token at a time); rehearsal of text-based trainers needs such a string"
                )
        return self._unit

    def _candidates(self) -> list[str]:
        found = list(TEXT_UNITS)
        vocab: dict[str, int] = getattr(self.tokenizer, "get_vocab", dict)()
        special = set(getattr(self.tokenizer, "all_special_tokens", []))
        for token in sorted(vocab, key=lambda token: vocab[token])[:200]:
            if token not in special and token.isalnum():
                found.extend([f" {token}", f"{token} "])
        return found

    def overhead(self, suffix: str = "") -> int:
        """Tokens a text has besides its repeated units: the tokenizer's own plus the suffix's."""
        return self.count(suffix) if suffix else self.base

    def text(self, tokens: int, suffix: str = "") -> str:
        """A text of exactly `tokens` tokens, counting `suffix` (e.g. an EOS the trainer appends)."""
        repeats = tokens - self.overhead(suffix)
        if repeats < 0:
            raise RehearsalError(
                f"a text of {tokens} tokens is impossible: the tokenizer adds {self.overhead(suffix)} itself"
            )
        body = self.unit() * repeats
        got = self.count(body + suffix)
        if got != tokens:
            raise RehearsalError(
                f"built a text of {got} tokens where {tokens} were needed; unsupported tokenizer"
            )
        return body


# --- per trainer family ------------------------------------------------------------------------


def sft_rows(
    tokenizer: Any, rows: int, seq_len: int, multiple: int | None, max_length: int | None, *, packing: bool
) -> list[dict[str, list[int]]]:
    """Pre-tokenized SFT rows (`input_ids`) whose collated batch is `(rows, seq_len)`.

    Wrapped packing chunks the token stream into rows of `max_length`: `rows` full rows do it.
    """
    vocab, special = len(tokenizer), tokenizer.all_special_ids
    if packing:
        if max_length is None or ceil_to(max_length, multiple) != seq_len:
            raise RehearsalError(f"packed SFT batches are {max_length} wide, not {seq_len}")
        lengths = [max_length] * rows
    else:
        lengths = row_lengths(rows, seq_len, multiple, max_length)
    return [{"input_ids": token_ids(vocab, special, length, offset=i)} for i, length in enumerate(lengths)]


def padding_free_rows(
    tokenizer: Any, seq_len: int, rows: int, multiple: int | None, max_length: int | None
) -> list[dict[str, list[int]]]:
    """Pre-tokenized SFT examples that make one padding-free batch `(1, seq_len)`: the whole dataset.

    The collator concatenates a batch's rows (BFD bins, or examples when padding_free has no packing) into one
    row padded to a multiple. `ceil(T / max_length)` examples of T tokens in all, each but the last max_length
    long, make as many BFD bins (no two fit together): at most `rows`, so they are one batch.
    """
    vocab, special = len(tokenizer), tokenizer.all_special_ids
    step = multiple or 1
    total = seq_len if max_length is None else min(seq_len, rows * max_length)
    if total < 1 or ceil_to(total, multiple) != seq_len or seq_len % step:
        raise RehearsalError(
            f"no padding-free batch of {rows} rows of at most {max_length} tokens pads to width {seq_len}; "
            "the plan and the spec disagree"
        )
    piece = max_length or total
    lengths = [piece] * ((total - 1) // piece) + [total - piece * ((total - 1) // piece)]
    return [{"input_ids": token_ids(vocab, special, length, offset=i)} for i, length in enumerate(lengths)]


def reward_rows(
    tokenizer: Any, pairs: int, seq_len: int, multiple: int | None, max_length: int | None
) -> list[dict[str, list[int]]]:
    """Pre-tokenized Reward pairs: the collated batch (chosen rows, then rejected) is `(2*pairs, seq_len)`.

    Reward drops pairs longer than max_length instead of truncating them, so every row fits.
    """
    vocab, special = len(tokenizer), tokenizer.all_special_ids
    lengths = row_lengths(2 * pairs, seq_len, multiple, max_length)
    return [
        {
            "chosen_ids": token_ids(vocab, special, lengths[2 * i], offset=2 * i),
            "rejected_ids": token_ids(vocab, special, lengths[2 * i + 1], offset=2 * i + 1),
        }
        for i in range(pairs)
    ]


def preference_rows(
    texts: TextMaker, pairs: int, seq_len: int, multiple: int | None, max_length: int | None, eos: str
) -> list[dict[str, str]]:
    """DPO pairs (prompt, chosen, rejected text): the collated batch is `(2*pairs, seq_len)`.

    DPO appends EOS to each completion and truncates prompt+completion at max_length, so a row is
    as long as the token count of prompt + completion + EOS. The prompt stays short (DPO drops
    examples whose prompt alone fills max_length).
    """
    overhead = texts.overhead(eos)
    lengths = row_lengths(2 * pairs, seq_len, multiple, max_length, shortest=overhead + 2)
    unit = texts.unit()
    examples = []
    for i in range(pairs):
        chosen_len, rejected_len = lengths[2 * i], lengths[2 * i + 1]
        prompt_units = max(1, (min(chosen_len, rejected_len) - overhead) // 2)
        prompt = unit * prompt_units
        chosen = unit * (chosen_len - overhead - prompt_units)
        rejected = unit * (rejected_len - overhead - prompt_units)
        for completion, want in ((chosen, chosen_len), (rejected, rejected_len)):
            if texts.count(prompt + completion + eos) != want:
                raise RehearsalError(
                    "preference texts came out at the wrong token count; unsupported tokenizer"
                )
        examples.append({"prompt": prompt, "chosen": chosen, "rejected": rejected})
    return examples


def prompt_rows(
    texts: TextMaker, prompts: int, prompt_len: int, multiple: int | None
) -> list[dict[str, str]]:
    """GRPO/RLOO prompts: the left-padded generation batch is `prompt_len` wide."""
    longest = longest_row(prompt_len, multiple, None)
    shortest = max(1, texts.base + 1, prompt_len - (multiple or prompt_len) + 1)
    lengths = [max(shortest, longest - 2 * index) for index in range(prompts)]
    return [{"prompt": texts.text(length)} for length in lengths]


def kto_rows(
    texts: TextMaker,
    rows: int,
    main_len: int,
    kl_len: int | None,
    multiple: int | None,
    max_length: int | None,
    eos: str,
) -> list[dict[str, Any]]:
    """KTO examples (prompt, completion, label) whose batch has main rows `main_len` wide and KL rows `kl_len`.

    KTO appends EOS to each completion and builds the KL rows by rotating completions by one within each group
    of per_device_train_batch_size examples: example i's KL row is its prompt with example i-1's completion.
    Example 0 carries the long prompt P0 and completion C0; the last example's completion C' is long only when
    the KL rows must be wider than the main ones; every other part is one token. Then the main rows peak at
    P0 + C0 (or P' + C'), the KL rows at P0 + C' or P1 + C0.
    """
    unit = texts.unit()
    prompt_min = texts.overhead() + 1  # one unit, plus what the tokenizer adds (a BOS)
    completion_min = 2  # one unit and the EOS
    main = longest_row(main_len, multiple, max_length)
    kl = main if kl_len is None or rows == 1 else longest_row(kl_len, multiple, max_length)
    tiny = (prompt_min, completion_min)
    parts = [tiny] * rows
    if kl == main:
        parts[0] = (main - completion_min, completion_min)
    elif kl < main:
        # KL_0 = P0 + C_min, KL_1 = P_min + C0
        prompt = kl - completion_min
        parts[0] = (prompt, main - prompt)
        if prompt_min + main - prompt > kl:
            raise RehearsalError(f"no KTO batch has main rows of {main} tokens and KL rows of at most {kl}")
    else:
        # KL_0 = P0 + C' (C' on the last example), main rows P0 + C_min and P_min + C'
        prompt = main - completion_min
        completion = kl - prompt
        if rows < 2 or completion > main - prompt_min:
            raise RehearsalError(f"no KTO batch has main rows of at most {main} tokens and KL rows of {kl}")
        parts[0] = (prompt, completion_min)
        parts[-1] = (prompt_min, completion)
    examples = []
    for index, (prompt_tokens, completion_tokens) in enumerate(parts):
        prompt_text = texts.text(prompt_tokens)
        completion_text = unit * (completion_tokens - 1)
        if texts.count(prompt_text + completion_text + eos) != prompt_tokens + completion_tokens:
            raise RehearsalError("KTO texts came out at the wrong token count; unsupported tokenizer")
        examples.append({"prompt": prompt_text, "completion": completion_text, "label": index % 2 == 0})
    return examples
