"""`warmup advise`: the padding that makes the whole job fastest, from the dataset's real lengths."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from warmup.cli.common import add_spec_arguments, target_overrides
from warmup.errors import SpecError
from warmup.formatting import format_duration, format_table
from warmup.trainers.registry import family

if TYPE_CHECKING:
    from warmup.advise.advice import Advice, AdviceOption, DatasetLengths
    from warmup.job.spec import Spec

BAR_WIDTH = 40


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    advise = sub.add_parser(
        "advise",
        help="compare pad_to_multiple_of (and max_length) settings: compiles against padding, whole-job time",
    )
    add_spec_arguments(advise)  # --dataset and --sample included
    advise.add_argument(
        "--lengths",
        metavar="FILE",
        help='per-example token lengths instead of a dataset, JSON: {"train": {"prompt": [...], '
        '"completion": [...], "rejected": [...]}}',
    )
    advise.add_argument(
        "--multiples",
        type=_multiples,
        help="candidate pad_to_multiple_of values, e.g. none,64,128,256 (default: none and powers of two up to "
        "the longest row)",
    )
    advise.add_argument(
        "--max-truncated",
        type=float,
        default=0.0,
        metavar="SHARE",
        help="also try a shorter max_length (GRPO/RLOO: a prompt filter) that cuts or drops at most this share of "
        "the examples, e.g. 0.01 (default 0: none)",
    )
    advise.add_argument(
        "--completion-tokens",
        type=int,
        help="GRPO/RLOO: the assumed length of every completion (default: the generation limit)",
    )
    advise.add_argument(
        "--step-seconds",
        type=float,
        help="measured seconds of one optimizer step of the job as configured (calibrates step time)",
    )
    advise.add_argument(
        "--format",
        choices=["table", "json"],
        default="table",
        help="a table (default), or the advice as JSON",
    )
    advise.set_defaults(func=cmd_advise)


def _multiples(text: str) -> list[int | None]:
    values: list[int | None] = []
    for part in text.split(","):
        part = part.strip().lower()
        if part in ("none", "null"):
            values.append(None)
        elif part.isdigit() and int(part) > 0:
            values.append(int(part))
        else:
            raise argparse.ArgumentTypeError(f"{part!r} is not a positive integer or 'none'")
    return values


def cmd_advise(ns: argparse.Namespace) -> int:
    from warmup.advise.advice import advise

    spec, lengths = _spec_and_lengths(ns)
    if ns.step_seconds is not None and ns.step_seconds <= 0:
        raise SpecError("must be a positive number of seconds", loc="--step-seconds")
    advice = advise(
        spec,
        lengths,
        multiples=ns.multiples,
        max_truncated=ns.max_truncated,
        completion_tokens=ns.completion_tokens,
        step_seconds=ns.step_seconds,
    )
    if ns.format == "json":
        print(json.dumps(advice.model_dump(mode="json"), indent=2))
    else:
        print(format_advice(advice))
    return 0


def _spec_and_lengths(ns: argparse.Namespace) -> tuple[Spec, DatasetLengths | None]:
    """The job, and its dataset's lengths: --lengths, else the dataset read with the facts API (--dataset, the
    config's `dataset:` or TRL's dataset selection), else the spec's length histogram."""
    from warmup.advise.advice import lengths_from_facts, load_lengths
    from warmup.job.spec import read_job

    if ns.lengths and ns.dataset is not None:
        raise SpecError("give --lengths or --dataset, not both", loc="lengths")
    job = read_job(
        ns.spec,
        trainer=ns.trainer,
        target=target_overrides(ns),
        side=ns.side,
        dataset=ns.dataset,
        sample=ns.sample,
    )
    spec = job.spec
    if ns.lengths:
        return spec, load_lengths(ns.lengths)
    if job.dataset in (None, False) and not job.selection:
        return spec, None  # the spec's length histogram
    from warmup.facts.reading import dataset_facts
    from warmup.facts.summary import progress_bar

    facts = dataset_facts(
        spec,
        job.dataset if isinstance(job.dataset, str) else None,  # True or unset: the config's own dataset
        selection=job.selection,
        sample=job.sample,
        progress=progress_bar(),
    )
    return spec, lengths_from_facts(spec.trainer, facts)


def option_label(option: AdviceOption) -> str:
    """`pad 128, max_length 1024` / `pad none, prompts <= 512`."""
    pad = "none" if option.pad_to_multiple_of is None else str(option.pad_to_multiple_of)
    if option.max_prompt_length is not None:
        return f"pad {pad}, prompts <= {option.max_prompt_length}"
    if option.max_length is not None:
        return f"pad {pad}, max_length {option.max_length}"
    return f"pad {pad}"


def format_advice(advice: Advice) -> str:
    """The table, the bars and the recommendation, as plain text."""
    options = sorted(advice.options, key=lambda o: o.projected_seconds)
    online = family(advice.trainer).generation_groups
    rows = []
    for option in options:
        marks = [
            m for m, on in (("current", option.current), ("recommended", option is advice.recommended)) if on
        ]
        rows.append(
            (
                "none" if option.pad_to_multiple_of is None else option.pad_to_multiple_of,
                option.max_prompt_length if online else option.max_length,
                len(option.signatures),
                format_duration(option.compile_seconds),
                f"{option.padded_tokens:,}",
                f"{option.padding_waste:.1%}",
                option.steps,
                format_duration(option.train_seconds),
                format_duration(option.projected_seconds),
                option.examples_truncated,
                option.examples_dropped,
                ", ".join(marks),
            )
        )
    headers = (
        "pad_to_multiple_of",
        "max_prompt" if online else "max_length",
        "signatures",
        "compile",
        "padded tokens/epoch",
        "waste",
        "steps",
        "training",
        "projected",
        "cut",
        "dropped",
        "",
    )
    processes = f"{advice.world_size} process{'es' if advice.world_size > 1 else ''}"
    lines = [
        f"{advice.trainer} on {advice.backend} ({advice.device}, {processes}), "
        f"{advice.current.real_tokens:,} tokens per epoch in {advice.dataset or 'the dataset'}",
        "",
        format_table(headers, rows, right={0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10}),
        "",
        "projected time (# compile, = training; > past the scale):",
        *bars(options),
        "",
        recommendation(advice),
    ]
    if advice.refused:
        lines += ["", "not compared (the planner refused them):"]
        lines += [f"  - pad {r.pad_to_multiple_of or 'none'}: {r.reason}" for r in advice.refused]
    lines += ["", f"compile time: {advice.compile_costs}", f"step time: {advice.step_costs}", "assumptions:"]
    lines += [f"  - {note}" for note in advice.assumptions]
    return "\n".join(lines)


def bars(options: list[AdviceOption], width: int = BAR_WIDTH) -> list[str]:
    """One bar per option, compile time as '#' and training as '='. The scale stops at four times the fastest
    option, so that a setting hours slower (no padding on Neuron) does not flatten the others: its bar ends
    in '>'."""
    fastest = min((o.projected_seconds for o in options), default=0.0)
    scale = min(max((o.projected_seconds for o in options), default=0.0), 4 * fastest) or 1.0
    labels = [option_label(o) for o in options]
    pad = max(len(label) for label in labels)
    lines = []
    for label, option in zip(labels, options, strict=True):
        compile_cells = round(width * option.compile_seconds / scale)
        total_cells = max(round(width * option.projected_seconds / scale), 1)
        bar = "#" * compile_cells + "=" * max(total_cells - compile_cells, 0)
        if len(bar) > width:
            bar = bar[: width - 1] + ">"
        lines.append(f"  {label.ljust(pad)}  {bar.ljust(width)}  {format_duration(option.projected_seconds)}")
    return lines


def recommendation(advice: Advice) -> str:
    best = advice.recommended
    if best.current:
        return (
            f"recommended: keep the current setting ({option_label(best)}): no option projects a shorter job"
        )
    settings = ", ".join(f"{key}: {'null' if value is None else value}" for key, value in best.args.items())
    filter_note = (
        f"; drop the {best.examples_dropped} prompts longer than {best.max_prompt_length} tokens from the dataset"
        if best.max_prompt_length is not None
        else ""
    )
    return (
        f"recommended: {settings}{filter_note}: {format_duration(best.projected_seconds)} projected, "
        f"{format_duration(advice.saving_seconds)} ({advice.saving_fraction:.0%}) less than the current setting "
        f"({format_duration(advice.current.projected_seconds)})"
    )
