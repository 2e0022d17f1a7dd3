"""SFTTrainer: plain, wrapped packing, and padding-free (bfd packing). docs/trl-shapes.md section 4.

Training runs through the module the Trainer wrapped; evaluation calls the bare policy (transformers 5.24's
evaluation_loop uses `self.model`), so under Inductor its signatures are listed as eager.
"""

from __future__ import annotations

from typing import Any

from warmup.errors import SpecError
from warmup.job.trl_args import truncated_length
from warmup.planner.common import (
    PlanBuilder,
    RunsOn,
    ceil_to,
    evaluates,
    full_batch_reachable,
    padded_lengths,
    partial_batch,
    smallest_batch_max,
)
from warmup.signature import Phase, SettingValue


def plan_sft(plan: PlanBuilder) -> None:
    args = plan.args
    settings = {
        "loss_type": args.loss_type,
        "padding_free": _padding_free(plan),
        "use_liger_kernel": bool(args.use_liger_kernel),
        "activation_offloading": bool(args.activation_offloading),
    }
    longest = _longest_row(plan)
    if longest is None:
        unbounded = "is None" if args.max_length is None else f"{args.max_length} only shortens each example"
        plan.need(
            "args.max_length",
            f"sequence lengths are unbounded: max_length {unbounded} and data.max_tokens is not given; "
            "set max_length, or give the data facts (--dataset PATH, or data.max_tokens)",
        )
        return
    _shapes(
        plan,
        "train",
        args.per_device_train_batch_size,
        plan.data.num_train_examples,
        bool(args.packing),
        longest,
        settings,
    )
    if evaluates(plan):
        eval_packing = args.packing if args.eval_packing is None else args.eval_packing
        _shapes(
            plan,
            "eval",
            args.per_device_eval_batch_size,
            plan.data.num_eval_examples,
            bool(eval_packing),
            longest,
            settings,
        )


def _padding_free(plan: PlanBuilder) -> bool:
    args = plan.args
    return bool(args.padding_free or (args.packing and args.packing_strategy in {"bfd", "bfd_split"}))


def _longest_row(plan: PlanBuilder) -> int | None:
    """The longest row the collator can see: truncated at max_length unless preparation is skipped."""
    args = plan.args
    data_longest = plan.data.longest
    skip_prepare = bool((args.dataset_kwargs or {}).get("skip_prepare_dataset", False))
    if args.max_length is None or skip_prepare:
        if skip_prepare and args.max_length is not None:
            plan.warn(
                "dataset_kwargs.skip_prepare_dataset is set, so max_length does not truncate: "
                "the lengths come from data.max_tokens alone"
            )
        return data_longest
    max_length: int | None = args.max_length
    if max_length is not None and max_length < 1:
        if args.packing:
            raise SpecError(
                f"packing cuts rows of max_length tokens, and TRL's pack_dataset makes none of {max_length} "
                "(wrapped: an empty dataset; bfd: an error): set max_length to the row length to pack to",
                loc="args.max_length",
            )
        # TRL's slice keeps each example but its last tokens: the rows are the data's, shortened
        return truncated_length(data_longest, max_length, args.truncation_mode) if data_longest else None
    if args.packing or data_longest is None or max_length is None:
        return max_length
    return min(max_length, data_longest)


def _shapes(
    plan: PlanBuilder,
    phase: Phase,
    batch: int,
    num_examples: int | None,
    packing: bool,
    longest: int,
    settings: dict[str, Any],
) -> None:
    args = plan.args
    m = plan.multiple
    split = "train" if phase == "train" else "eval"
    runs_on: RunsOn = "wrapped" if phase == "train" else "bare"
    if _padding_free(plan) and not packing and args.max_length is not None:
        raise SpecError(
            "padding_free without packing needs max_length: null (TRL refuses it otherwise): set max_length: null "
            "(and give data.max_tokens), or packing: true",
            loc="args.padding_free",
        )
    if _padding_free(plan):
        # All rows of a batch are concatenated into one row of their total length (docs/trl-shapes.md 4):
        # bfd packing's bins, or (padding_free without packing) the untruncated examples themselves.
        lengths = padded_lengths(min(smallest_batch_max(plan.data, 1), longest), batch * longest, m)
        plan.add_many(phase, [1], lengths, settings=settings, runs_on=runs_on)
        plan.warn(
            "padding-free batches (bfd packing, padding_free) pass data-dependent cu_seq_lens / max_length_q inputs; "
            "on Neuron prefer packing_strategy: wrapped or packing: false"
        )
        return
    if packing:
        rows = plan.data.num_train_rows if phase == "train" else plan.data.num_eval_rows
        _wrapped_packing(plan, phase, batch, rows, longest, settings, runs_on)
        return

    batches = []
    if full_batch_reachable(num_examples, batch, plan.world_size):
        batches.append(batch)
    remainder = partial_batch(
        num_examples, batch, drop_last=args.dataloader_drop_last, world_size=plan.world_size
    )
    if remainder:
        batches.append(remainder)
    elif num_examples is None and not args.dataloader_drop_last and plan.world_size == 1:
        plan.warn(
            f"the last {split} batch of each epoch is shorter than {batch} rows unless the example count divides "
            f"evenly: give data.num_{split}_examples (or set dataloader_drop_last: true) to list it"
        )
    for rows in batches:
        shortest = truncated_length(
            smallest_batch_max(plan.data, rows), args.max_length, args.truncation_mode
        )
        lengths = padded_lengths(max(1, min(shortest, longest)), longest, m)
        plan.add_many(phase, [rows], lengths, settings=settings, runs_on=runs_on)


def _wrapped_packing(
    plan: PlanBuilder,
    phase: Phase,
    batch: int,
    num_rows: int | None,
    max_length: int,
    settings: dict[str, SettingValue],
    runs_on: RunsOn,
) -> None:
    """Wrapped packing: each map batch of 1000 examples becomes one token stream cut into rows of max_length,
    its last row the shorter remainder (docs/trl-shapes.md section 4).

    The dataloader batches packed rows, not examples: `data.num_*_rows` counts them (`warmup facts` packs the
    dataset as TRL does and writes them, and `length_histogram` as the packed row lengths); `num_*_examples`
    stays the dataset's example count, which does not tell the rows. The last batch has `rows % B` rows; when
    the row count is not known, every batch size the packed dataset can end on (1 .. B-1) is listed. A batch made only of remainder rows is narrower: listed
    from the histogram's short rows, or, without one, for a one-row batch at every width a remainder can have.
    """
    args = plan.args
    m = plan.multiple
    split = "train" if phase == "train" else "eval"
    full = ceil_to(max_length, m)
    ends = not args.dataloader_drop_last and plan.world_size == 1
    sizes = []
    if full_batch_reachable(num_rows, batch, plan.world_size):
        sizes.append(batch)
    if num_rows is not None:
        remainder = partial_batch(
            num_rows, batch, drop_last=args.dataloader_drop_last, world_size=plan.world_size
        )
        sizes += [remainder] if remainder else []
    elif ends and batch > 1:
        sizes += list(range(1, batch))
        plan.note(
            f"wrapped packing: the packed {split} row count is not in the data facts, so every size its last batch "
            f"can have (1 to {batch - 1} rows) is listed; give data.num_{split}_rows (the packed rows: warmup "
            "facts counts them) to list only the one it has, or set dataloader_drop_last: true"
        )
    # the facts' histogram describes the train split
    histogram = plan.data.length_histogram if phase == "train" else None
    short = sorted(n for n, count in (histogram or {}).items() for _ in range(count) if n < max_length)
    for rows in sizes:
        plan.add(phase, rows, full, settings=settings, runs_on=runs_on)
        if histogram is not None:
            if len(short) >= rows:  # a batch of remainder rows only: as wide as its longest
                lengths = padded_lengths(short[rows - 1], short[-1], m)
                plan.add_many(phase, [rows], lengths, settings=settings, runs_on=runs_on)
        elif rows == 1:
            plan.add_many(phase, [1], padded_lengths(1, max_length, m), settings=settings, runs_on=runs_on)
    if histogram is None and any(rows > 1 for rows in sizes):
        plan.warn(
            f"wrapped packing: a {split} batch made only of remainder rows (one per map batch of 1000 examples) "
            "is narrower than max_length; without data.length_histogram (packed row lengths, from warmup facts) "
            "only one-row batches of them are listed"
        )
