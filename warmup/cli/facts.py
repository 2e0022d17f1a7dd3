"""`warmup facts`: the data facts of a job's dataset, tokenized as its trainer does, as a `data:` block."""

from __future__ import annotations

import argparse
import json
import sys


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    facts = sub.add_parser(
        "facts",
        help="read a job's dataset with the model's tokenizer and the trainer's preprocessing; print a `data:` block",
    )
    facts.add_argument(
        "spec", help="the trl config (or spec) whose model, tokenizer and trainer settings apply"
    )
    facts.add_argument(
        "--dataset",
        metavar="PATH",
        help="a local JSON/JSONL/Parquet/CSV file, a save_to_disk or data directory (default: the config's own "
        "dataset_name / datasets, when they are on this machine; nothing is downloaded)",
    )
    facts.add_argument("--trainer", help="trainer kind, for a TRL CLI config (it does not say it)")
    facts.add_argument("--side", metavar="FILE", help="side file of warm-up settings (trainer, dataset, ...)")
    facts.add_argument(
        "--sample", type=int, metavar="N", help="read only the first N examples of each split (an estimate)"
    )
    facts.add_argument(
        "--workers", type=int, metavar="N", help="tokenizing processes (default: one per core)"
    )
    facts.add_argument(
        "--format",
        choices=["yaml", "json"],
        default="yaml",
        help="YAML (default: paste it into the spec's or the side file's `data:`) or JSON",
    )
    facts.set_defaults(func=cmd_facts)


def cmd_facts(ns: argparse.Namespace) -> int:
    from warmup.facts.reading import dataset_facts
    from warmup.facts.summary import progress_bar
    from warmup.job.spec import read_job

    job = read_job(ns.spec, trainer=ns.trainer, side=ns.side)
    dataset = ns.dataset if ns.dataset is not None else job.dataset if isinstance(job.dataset, str) else None
    found = dataset_facts(
        job.spec,
        dataset,
        selection=job.selection,
        sample=ns.sample if ns.sample is not None else job.sample,
        workers=ns.workers,
        progress=progress_bar(sys.stderr),
    )
    print(
        f"{found.examples} examples of {found.source} tokenized in {found.read_seconds:.1f} s "
        f"({found.rate:,.0f} examples/s; {found.seconds:.1f} s in all)",
        file=sys.stderr,
    )
    if ns.format == "json":
        print(
            json.dumps({"data": found.data.model_dump(mode="json", exclude_none=True), "notes": found.notes})
        )
    else:
        print(found.data_block(), end="")
    return 0
