"""Reading a dataset's facts: `dataset_facts(job, dataset)`, the entry point.

It opens the dataset (`opening`), reads each split in Arrow batches (a few MB in memory at a time), turns each
batch into the trainer's rows (`rows`) in threads, one per core, packs them when SFT packs (`packing`), and
sums it all up (`summary`).
"""

from __future__ import annotations

import array
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from warmup.errors import DatasetError, SpecError
from warmup.facts.opening import open_splits
from warmup.facts.packing import packed_lengths
from warmup.facts.recipe import Recipe
from warmup.facts.rows import BatchRows, Rows
from warmup.facts.summary import DatasetFacts, Progress, SplitFacts, summarize
from warmup.job.spec import Spec

# Rows per batch: large enough for the tokenizer's batch path, small enough to bound memory.
BATCH_ROWS = 1000
# Below this many examples one thread does the work: a second tokenizer costs more than it saves.
PARALLEL_FROM = 20_000


def dataset_facts(
    job: Spec | str | Path | dict[str, Any],
    dataset: str | Path | None = None,
    *,
    selection: dict[str, Any] | None = None,
    sample: int | None = None,
    trainer: str | None = None,
    workers: int | None = None,
    progress: Progress | None = None,
) -> DatasetFacts:
    """Read `dataset` (or the job's own dataset selection) and compute its facts for the job's trainer.

    `job` is a Spec, or a spec / TRL config file or mapping (then its `dataset_name`, `datasets`,
    splits and `dataset:` are read too; for a Spec, `selection` gives them); `trainer` names the
    trainer of a TRL config that does not say.
    `sample` reads at most that many examples per split and marks the facts as an estimate.
    """
    from warmup.job.spec import read_job
    from warmup.job.trl_args import resolve_trainer_args

    started = time.monotonic()
    if sample is not None and sample < 1:
        raise SpecError(f"--sample must be at least 1, got {sample}", loc="sample")
    selection = dict(selection or {})
    if isinstance(job, Spec):
        spec = job
    else:
        loaded = read_job(job, trainer=trainer)
        spec, selection = loaded.spec, {**loaded.selection, **selection}
        dataset = (
            dataset if dataset is not None else loaded.dataset if isinstance(loaded.dataset, str) else None
        )
        sample = sample if sample is not None else loaded.sample
    if dataset is not None:
        selection = {**selection, "dataset": str(dataset)}
    args = resolve_trainer_args(spec)
    splits = open_splits(selection, evaluates=_evaluates(args))
    recipe = Recipe.for_job(spec, args)
    reading = time.monotonic()
    train = _read_split(recipe, splits.train, splits.train_split, sample, workers, progress)
    evaluation = None
    if splits.eval is not None:
        evaluation = _read_split(recipe, splits.eval, splits.eval_split or "test", sample, workers, progress)
    read_seconds = time.monotonic() - reading
    notes = list(splits.notes)
    data = summarize(recipe, train, evaluation, sample, notes)
    return DatasetFacts(
        data=data,
        train=train,
        eval=evaluation,
        source=splits.source,
        sample=sample,
        seconds=time.monotonic() - started,
        read_seconds=read_seconds,
        notes=notes,
    )


def _evaluates(args: Any) -> bool:
    strategy = str(getattr(args.eval_strategy, "value", args.eval_strategy))
    return strategy != "no" or bool(getattr(args, "eval_on_start", False))


def _batches(split: Any, sample: int | None) -> Iterator[Any]:
    """Batches of examples as Arrow tables (cheap to hand to a worker), at most `sample` examples in all."""
    left = sample
    for table in split.with_format("arrow").iter(batch_size=BATCH_ROWS):
        if left is not None:
            table = table.slice(0, left)
            left -= table.num_rows
        if table.num_rows:
            yield table
        if left is not None and left <= 0:
            return


def _split_size(split: Any) -> int | None:
    try:
        return len(split)
    except TypeError:  # an IterableDataset: its size is in the metadata when the builder recorded it
        info = getattr(split, "info", None)
        splits = getattr(info, "splits", None) or {}
        name = str(getattr(split, "split", "") or "train")
        found = splits.get(name) if hasattr(splits, "get") else None
        return getattr(found, "num_examples", None) or None


def _read_split(
    recipe: Recipe,
    split: Any,
    name: str,
    sample: int | None,
    workers: int | None,
    progress: Progress | None,
) -> SplitFacts:
    total = _split_size(split)
    if sample is not None and total is not None:
        total = min(total, sample)
    packing = recipe.family.packs and (
        recipe.packing if name == "train" or recipe.eval_packing is None else recipe.eval_packing
    )
    lengths = array.array("I")
    prompts = array.array("I")
    has_prompts = False
    dropped = examples = 0
    batches = _batches(split, sample)
    first_batch = next(batches, None)
    if first_batch is None:
        raise DatasetError(f"split {name!r} of the dataset is empty", loc="dataset")
    first = first_batch.slice(0, 1).to_pylist()[0]
    count = workers if workers is not None else (os.cpu_count() or 1)
    parallel = count > 1 and (total is None or total >= PARALLEL_FROM)

    def results() -> Iterator[BatchRows]:
        if not parallel:
            rows = Rows(recipe, packing=packing, first=first)
            yield rows(first_batch.to_pylist())
            for batch in batches:
                yield rows(batch.to_pylist())
            return
        yield from _threaded(recipe, packing, first, [first_batch], batches, count)

    for done in results():
        lengths.extend(done.lengths)
        if done.prompts is not None:
            has_prompts = True
            prompts.extend(done.prompts)
        dropped += done.dropped
        examples += done.examples
        if progress is not None:
            progress(examples, total)
    if progress is not None:
        progress(examples, examples)  # done: the line ends
    facts = SplitFacts(
        split=name,
        examples=examples,
        dropped=dropped,
        lengths=lengths,
        prompt_lengths=prompts if has_prompts else None,
    )
    if packing:
        if recipe.max_length is None:
            raise SpecError(
                "packing needs max_length (TRL refuses packing with max_length: null)", loc="args.max_length"
            )
        facts.packed_lengths = packed_lengths(recipe, lengths)
    return facts


def _threaded(
    recipe: Recipe, packing: bool, first: dict[str, Any], head: list[Any], batches: Iterator[Any], count: int
) -> Iterator[BatchRows]:
    """Batches tokenized in `count` threads, results in order, a bounded number in flight.

    Threads, not processes: the tokenizer's Rust encoder releases the GIL (and spreads a batch over the cores), so
    one thread renders chat templates while another encodes; worker processes measured slower here, the batches'
    trip through pipes costing more system time than the rendering they took off this process.
    """
    import threading
    from concurrent.futures import ThreadPoolExecutor

    local = threading.local()

    def run(batch: Any) -> BatchRows:
        rows = getattr(local, "rows", None)
        if rows is None:
            rows = local.rows = Rows(recipe, packing=packing, first=first)
        return rows(batch.to_pylist())

    pending: list[Any] = []
    with ThreadPoolExecutor(count) as pool:
        for batch in [*head, *batches]:
            pending.append(pool.submit(run, batch))
            if len(pending) >= 4 * count:
                yield pending.pop(0).result()
        for future in pending:
            yield future.result()
