"""Per-example token lengths of a dataset, and what TRL's preprocessing does to them under one setting.

The advisor works from the length of every example as TRL's preprocessing leaves it before truncation
(templated and tokenized with the model's tokenizer, EOS included): `prompt` and `completion` per example,
and `rejected` for preference data. What counts as a row, what max_length cuts and which examples TRL
drops depend on the trainer (TRL 1.16.0):

- SFT: one row of prompt + completion per example (language-modelling text: prompt 0), cut at max_length
  in preparation; with completion-only loss, an example whose prompt alone fills max_length is dropped
  (keep_start: every label would be -100).
- DPO: two rows per example, prompt + chosen and prompt + rejected, each cut at max_length by the collator;
  an example whose prompt alone fills max_length is dropped (keep_start).
- Reward: two rows per example like DPO, but a pair with a row longer than max_length is dropped, not cut.
- GRPO / RLOO: one prompt per example, never truncated by TRL; an advised `max_prompt_length` means
  dropping the longer prompts from the dataset before training (TRL 1.16 has no such setting).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from warmup.errors import FieldProblem, SpecError
from warmup.trainers.registry import family

if TYPE_CHECKING:
    from warmup.facts.summary import DatasetFacts, SplitFacts


@dataclasses.dataclass(frozen=True)
class SplitLengths:
    """Token lengths of one split, one entry per example, in dataset order."""

    prompt: np.ndarray  # prompt tokens (0 for plain language-modelling text)
    completion: np.ndarray  # completion tokens (SFT: the whole text when prompt is 0; DPO/Reward: chosen)
    rejected: np.ndarray | None = None  # DPO / Reward: rejected completion tokens

    def __post_init__(self) -> None:
        sizes = {len(self.prompt), len(self.completion)} | (
            {len(self.rejected)} if self.rejected is not None else set()
        )
        if len(sizes) != 1:
            raise SpecError("the dataset's length lists differ in size", loc="dataset")
        empty = np.flatnonzero(self.prompt + self.completion <= 0)
        if len(empty):
            raise SpecError(f"example {int(empty[0])} has no tokens", loc="dataset")

    @classmethod
    def of(
        cls,
        prompt: Sequence[int] | np.ndarray | None = None,
        completion: Sequence[int] | np.ndarray | None = None,
        rejected: Sequence[int] | np.ndarray | None = None,
    ) -> SplitLengths:
        size = len(prompt if prompt is not None else completion or [])

        def column(values: Sequence[int] | np.ndarray | None) -> np.ndarray:
            return np.asarray(values, dtype=np.int64) if values is not None else np.zeros(size, np.int64)

        return cls(
            prompt=column(prompt),
            completion=column(completion),
            rejected=None if rejected is None else column(rejected),
        )

    def __len__(self) -> int:
        return len(self.prompt)

    def select(self, keep: np.ndarray) -> SplitLengths:
        """The examples where `keep` is true, in order (what `datasets.Dataset.filter` leaves)."""
        return SplitLengths(
            prompt=self.prompt[keep],
            completion=self.completion[keep],
            rejected=None if self.rejected is None else self.rejected[keep],
        )


@dataclasses.dataclass(frozen=True)
class DatasetLengths:
    """A dataset's train split (and eval split, when known) as token lengths."""

    train: SplitLengths
    eval: SplitLengths | None = None
    source: str = ""  # where the lengths came from, for messages and reports
    # Training examples already gone from `train`: what TRL's preparation drops under the job's own settings
    # (the facts API reads the dataset that way). Every option drops them too: none lengthens max_length.
    dropped: int = 0


@dataclasses.dataclass(frozen=True)
class PreparedSplit:
    """One split as the trainer sees it under one setting: rows after TRL's cuts and drops."""

    rows: np.ndarray  # (examples, rows per example) row lengths after truncation; GRPO: the prompt lengths
    full_rows: np.ndarray  # the same rows before truncation (the planner's data facts)
    prompts: np.ndarray  # prompt tokens of the kept examples
    truncated: int  # kept examples with at least one row cut
    dropped: int  # examples TRL (or the advised prompt filter) removes

    @property
    def examples(self) -> int:
        return len(self.rows)


def prepare(
    split: SplitLengths,
    trainer: str,
    *,
    max_length: int | None,
    completion_only_loss: bool,
    keep_start: bool = True,
    max_prompt_length: int | None = None,
) -> PreparedSplit:
    """Apply TRL's truncation and filtering for `trainer` at this max_length (see the module docstring)."""
    prompt = split.prompt
    keep: np.ndarray
    if family(trainer).generation_groups:
        keep = np.ones(len(prompt), bool) if max_prompt_length is None else prompt <= max_prompt_length
        kept = prompt[keep]
        return PreparedSplit(
            rows=kept[:, None],
            full_rows=kept[:, None],
            prompts=kept,
            truncated=0,
            dropped=int((~keep).sum()),
        )
    if family(trainer).paired:
        if split.rejected is None:
            raise SpecError(
                f"the {trainer} trainer needs preference data: give each example's rejected length",
                loc="dataset",
            )
        full = np.stack([prompt + split.completion, prompt + split.rejected], axis=1)
    else:
        full = (prompt + split.completion)[:, None]
    if max_length is None:
        keep = np.ones(len(prompt), bool)
    elif family(trainer).drops_long_pairs:
        keep = np.asarray((full <= max_length).all(axis=1))  # RewardTrainer filters over-long pairs out
    elif family(trainer).paired:
        keep = prompt < max_length if keep_start else np.ones(len(prompt), bool)
    else:  # sft: dropped when truncation leaves every label at -100
        keep = prompt < max_length if (completion_only_loss and keep_start) else np.ones(len(prompt), bool)
    full = full[keep]
    rows = full if max_length is None else np.minimum(full, max_length)
    return PreparedSplit(
        rows=rows,
        full_rows=full,
        prompts=prompt[keep],
        truncated=int((rows < full).any(axis=1).sum()),
        dropped=int((~keep).sum()),
    )


def data_facts(trainer: str, train: PreparedSplit, eval_split: PreparedSplit | None) -> dict[str, Any]:
    """The spec's `data` facts for the kept examples, as the planner reads them.

    Rows before truncation: the planner applies max_length itself. GRPO / RLOO: prompt bounds only.
    """
    facts: dict[str, Any] = {"num_train_examples": train.examples}
    if eval_split is not None:
        facts["num_eval_examples"] = eval_split.examples
    splits = [s for s in (train, eval_split) if s is not None and s.examples]
    if not train.examples:
        raise SpecError("no training example is left under this setting", loc="dataset")
    prompts = np.concatenate([s.prompts for s in splits])
    if family(trainer).generation_groups:
        facts["max_prompt_tokens"] = int(prompts.max())
        facts["min_prompt_tokens"] = int(max(prompts.min(), 1))
        return facts
    rows = np.concatenate([s.full_rows.ravel() for s in splits])
    values, counts = np.unique(rows, return_counts=True)
    facts["length_histogram"] = {int(v): int(c) for v, c in zip(values, counts, strict=True)}
    facts["max_tokens"] = int(values[-1])
    facts["min_tokens"] = int(values[0])
    if prompts.max() > 0:
        facts["max_prompt_tokens"] = int(min(prompts.max(), values[-1]))
        facts["min_prompt_tokens"] = int(max(prompts.min(), 1))
    return facts


# --- reading lengths ---------------------------------------------------------------------------------

MAX_EXAMPLES = 10_000_000  # per split: far above any fine-tuning set, and still bounded work
MAX_TOKENS = 1 << 24  # per example: 16M tokens, far above any context length
Tokens = Annotated[int, Field(ge=0, le=MAX_TOKENS)]


class LengthColumns(BaseModel):
    """One split as parallel columns, one entry per example, in dataset order. SFT language-modelling text
    may be given as a plain list of lengths."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    prompt: list[Tokens] | None = Field(
        None,
        max_length=MAX_EXAMPLES,
        description="Prompt tokens per example (as the trainer templates them).",
    )
    completion: list[Tokens] | None = Field(
        None,
        max_length=MAX_EXAMPLES,
        description="Completion tokens per example, EOS included (SFT text: the whole text; DPO: chosen).",
    )
    rejected: list[Tokens] | None = Field(
        None, max_length=MAX_EXAMPLES, description="DPO / Reward: rejected completion tokens per example."
    )

    @model_validator(mode="before")
    @classmethod
    def _plain_list(cls, value: Any) -> Any:
        return {"completion": value} if isinstance(value, list) else value

    @model_validator(mode="after")
    def _columns(self) -> LengthColumns:
        given = {name: len(v) for name, v in self if v is not None}
        if "prompt" not in given and "completion" not in given:
            raise ValueError("give prompt and/or completion lengths")
        if len(set(given.values())) != 1:
            raise ValueError(f"the columns differ in length: {given}")
        if not next(iter(given.values())):
            raise ValueError("no example")
        return self

    def split(self) -> SplitLengths:
        return SplitLengths.of(self.prompt, self.completion, self.rejected)


class LengthsDocument(BaseModel):
    """A dataset's per-example token lengths: what `warmup advise --lengths` reads and `POST /v1/advice` takes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    train: LengthColumns
    eval: LengthColumns | None = None

    def lengths(self, source: str) -> DatasetLengths:
        return DatasetLengths(
            train=self.train.split(), eval=self.eval.split() if self.eval else None, source=source
        )


def load_lengths(path: str | Path) -> DatasetLengths:
    """Read a lengths file (JSON, a LengthsDocument)."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as error:
        raise SpecError(f"cannot read {path}: {error.strerror}", loc="dataset") from None
    try:
        document = LengthsDocument.model_validate_json(text)
    except ValidationError as error:
        problems = [
            FieldProblem(".".join(["dataset", *map(str, e["loc"])]), e["msg"].removeprefix("Value error, "))
            for e in error.errors(include_url=False)[:10]
        ]
        raise SpecError(problems) from None
    return document.lengths(str(path))


def lengths_from_facts(trainer: str, facts: DatasetFacts) -> DatasetLengths:
    """The lengths `warmup.facts.reading.dataset_facts` read from the dataset with the model's tokenizer and the
    trainer's preprocessing: rows in dataset order (DPO / Reward: chosen then rejected per pair), untruncated,
    and each kept example's prompt."""

    def split(facts_split: SplitFacts) -> SplitLengths:
        if facts_split.packed_lengths is not None:
            raise SpecError(
                "warmup advise compares padded batches; with packing there is no padding to trade: "
                "set packing: false",
                loc="args.packing",
            )
        rows = np.asarray(facts_split.lengths, dtype=np.int64)
        prompt = facts_split.prompt_lengths
        prompts = np.asarray(prompt, dtype=np.int64) if prompt is not None else None
        if family(trainer).generation_groups:
            return SplitLengths.of(prompt=prompts if prompts is not None else np.zeros(0, np.int64))
        if prompts is None:
            prompts = np.zeros(len(rows) // family(trainer).rows_per_example, np.int64)
        if family(trainer).paired:
            chosen, rejected = rows[0::2], rows[1::2]
            return SplitLengths(prompt=prompts, completion=chosen - prompts, rejected=rejected - prompts)
        return SplitLengths(prompt=prompts, completion=rows - prompts)

    return DatasetLengths(
        train=split(facts.train),
        eval=split(facts.eval) if facts.eval is not None and facts.eval.kept else None,
        source=facts.source,
        dropped=facts.train.dropped,
    )


def lengths_from_histogram(trainer: str, histogram: dict[int, int] | None) -> DatasetLengths:
    """Lengths from a spec's `data.length_histogram`: SFT rows only, and the dataset order is unknown (the
    examples are taken shortest first, then shuffled by the sampler like any dataset)."""
    if not family(trainer).advised_from_histogram or not histogram:
        raise SpecError(
            "give the dataset's per-example lengths (--lengths); without them only an SFT spec with "
            "data.length_histogram can be advised",
            loc="dataset",
        )
    lengths = [length for length, count in sorted(histogram.items()) for _ in range(count)]
    return DatasetLengths(train=SplitLengths.of(completion=lengths), source=HISTOGRAM_SOURCE)


HISTOGRAM_SOURCE = "histogram (the spec's data.length_histogram)"
