"""The summary: what the facts of a dataset came to (`SplitFacts`, `DatasetFacts`), the planner's `DataFacts`
made of them, the `data:` block and the progress line the CLI prints.

The lengths are kept in `array('I')`, not in lists of Python integers: a dataset's rows stay small in memory.
"""

from __future__ import annotations

import array
import dataclasses
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from warmup.facts.recipe import Recipe
from warmup.job.spec import DataFacts

# Past this many distinct lengths the histogram rounds lengths down (never up: the planner reads the
# shortest lengths as lower bounds, and rounding down only ever lists more shapes).
MAX_HISTOGRAM_KEYS = 512

Progress = Callable[[int, int | None], None]  # (examples done, examples in all or None)


@dataclasses.dataclass
class SplitFacts:
    """One split as the trainer sees it."""

    split: str  # the dataset's split name
    examples: int  # examples read from the dataset
    dropped: int  # examples the trainer's own preparation drops (prompt alone fills max_length, ...)
    # Token length of every row the trainer keeps, in dataset order: SFT one per example, DPO and Reward
    # two per example (chosen, then rejected), KTO one per unpaired example; GRPO / RLOO / distillation
    # have no rows before generation (see prompt_lengths). Untruncated: the planner applies max_length.
    lengths: array.array[int]
    # Tokens of each kept example's prompt as the trainer splits it (chat-templated, generation prompt
    # included), in dataset order; None for data without prompts.
    prompt_lengths: array.array[int] | None
    # SFT with packing: the length of every packed row TRL builds (these are the rows batches are made of).
    packed_lengths: array.array[int] | None = None

    @property
    def kept(self) -> int:
        return self.examples - self.dropped

    @property
    def rows(self) -> array.array[int]:
        """The rows batches are made of: packed rows when packing, else the kept rows."""
        return self.packed_lengths if self.packed_lengths is not None else self.lengths


@dataclasses.dataclass
class DatasetFacts:
    """What `dataset_facts` found: the planner's facts and the per-row lengths behind them."""

    data: DataFacts
    train: SplitFacts
    eval: SplitFacts | None
    source: str
    sample: int | None  # examples read per split when --sample limited it (the facts are then estimates)
    seconds: float  # the whole call: loading the tokenizer and TRL's config included
    read_seconds: float  # reading and tokenizing the examples
    notes: list[str] = dataclasses.field(default_factory=list)

    @property
    def examples(self) -> int:
        return self.train.examples + (self.eval.examples if self.eval else 0)

    @property
    def rate(self) -> float:
        """Examples read and tokenized per second."""
        return self.examples / max(self.read_seconds, 1e-9)

    def data_block(self) -> str:
        """The facts as a `data:` block to paste into a spec (YAML)."""
        import yaml

        header = [
            f"# data facts of {self.source}: {self.examples} examples read, tokenized as TRL's trainer does "
            f"({self.rate:,.0f} examples/s)",
        ]
        if self.sample is not None:
            header.append(
                f"# ESTIMATE from the first {self.sample} examples of each split (--sample): lengths outside "
                "them are not covered"
            )
        header += [f"# {note}" for note in self.notes]
        body = yaml.safe_dump({"data": self.data.model_dump(exclude_none=True)}, sort_keys=False)
        return "\n".join(header) + "\n" + str(body)


def summarize(
    recipe: Recipe, train: SplitFacts, evaluation: SplitFacts | None, sample: int | None, notes: list[str]
) -> DataFacts:
    """The planner's facts of the splits read; what it says of the data besides goes into `notes`."""
    splits = [s for s in (train, evaluation) if s is not None]
    rows = array.array("I")
    prompts = array.array("I")
    for split in splits:
        rows.extend(split.rows)
        if split.prompt_lengths is not None:
            prompts.extend(split.prompt_lengths)
    for split in splits:
        if split.dropped:
            notes.append(
                f"{split.dropped} of the {split.examples} examples of split {split.split!r} are dropped by the trainer's "
                "own preparation (see max_length): the counts are of the examples it keeps"
            )
    online = recipe.family.generates
    facts: dict[str, Any] = {
        "num_train_examples": _count(train, recipe) or None,
        "num_eval_examples": _count(evaluation, recipe) if evaluation is not None else None,
    }
    if train.packed_lengths is not None:
        facts["num_train_rows"] = len(train.packed_lengths) or None
    if evaluation is not None and evaluation.packed_lengths is not None:
        facts["num_eval_rows"] = len(evaluation.packed_lengths)
    if prompts:
        facts["max_prompt_tokens"] = max(prompts) or None
        facts["min_prompt_tokens"] = min(prompts) or None
    if rows and not online:
        facts["max_tokens"] = max(rows)
        facts["min_tokens"] = min(rows) or None
        histogram, step = length_histogram(rows)
        facts["length_histogram"] = histogram
        if step > 1:
            notes.append(
                f"length_histogram rounds lengths down to a multiple of {step} ({len(set(rows))} distinct lengths); "
                "max_tokens and min_tokens are exact"
            )
    if sample is not None:
        facts["estimated_from"] = sample
    return DataFacts.model_validate(facts)


def _count(split: SplitFacts, recipe: Recipe) -> int:
    """Examples as the planner counts them: pairs for DPO / Reward, unpaired examples for KTO, kept examples
    (packed rows are counted apart: num_*_rows)."""
    return len(split.lengths) if recipe.family.unpairs_preferences else split.kept


def length_histogram(lengths: Iterable[int]) -> tuple[dict[int, int], int]:
    """{length: rows}, rounded down to a power-of-two step when there are more than MAX_HISTOGRAM_KEYS lengths."""
    exact = Counter(n for n in lengths if n > 0)
    step = 1
    histogram = exact
    while len(histogram) > MAX_HISTOGRAM_KEYS:
        step *= 2
        histogram = Counter()
        for length, count in exact.items():
            histogram[max(1, length // step * step)] += count
    return dict(sorted(histogram.items())), step


def progress_bar(stream: Any = None) -> Progress:
    """A progress line on stderr: examples tokenized, rate, and the share done when the size is known.

    Drawn at most twice a second from the first half second on, and ended when a split is done."""
    stream = stream or sys.stderr
    state: dict[str, float] = {"started": 0.0, "shown": 0.0}

    def show(done: int, total: int | None) -> None:
        now = time.monotonic()
        if not state["started"]:
            state["started"] = now
        finished = total is not None and done >= total
        if now - (state["shown"] or state["started"]) < 0.5 and not (finished and state["shown"]):
            return
        rate = done / max(now - state["started"], 1e-9)
        share = f" / {total} ({100 * done / total:.0f}%)" if total else ""
        print(f"\rtokenized {done}{share} examples, {rate:,.0f}/s", end="", file=stream, flush=True)
        state["shown"] = now
        if finished:
            print(file=stream, flush=True)
            state["started"], state["shown"] = 0.0, 0.0

    return show
