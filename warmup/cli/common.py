"""What several commands share: the SPEC argument, its side file, its target overrides and its dataset."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from warmup.job.spec import Job, Spec

# `--target` in one word: where the training processes run, and so the compile backend.
TARGETS = {
    "neuron": {"backend": "neuron", "device": "neuron"},
    "cuda": {"backend": "inductor", "device": "cuda"},
    "cpu": {"backend": "inductor", "device": "cpu"},
}
# The spec options, by dest: `warmup exec` accepts them after SPEC too.
SPEC_OPTION_DESTS = ("trainer", "side", "target", "backend", "device", "world_size", "dataset", "sample")


def add_spec_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "spec", help="the YAML you pass to `trl <trainer> --config`, or a spec file (YAML/JSON)"
    )
    parser.add_argument("--trainer", help="trainer kind, for a TRL CLI config (it does not say it)")
    parser.add_argument(
        "--side",
        metavar="FILE",
        help="side file of warm-up settings kept beside the trl config (trainer, target, data, dataset, "
        "sample, pool): `trl` never reads it, so the config runs under `trl` unchanged",
    )
    parser.add_argument(
        "--target",
        choices=sorted(TARGETS),
        help="where training runs: neuron (TorchNeuron), cuda or cpu (Inductor). Default: the spec's or side file's "
        "`target`, else cpu when the config says `use_cpu: true`, else neuron",
    )
    parser.add_argument(
        "--backend", choices=["neuron", "inductor"], help="override the spec's target backend"
    )
    parser.add_argument(
        "--device", choices=["neuron", "cuda", "cpu"], help="override the spec's target device"
    )
    parser.add_argument("--world-size", type=int, help="override the spec's number of training processes")
    parser.add_argument(
        "--dataset",
        nargs="?",
        const=True,
        metavar="PATH",
        help="compute the data facts from this local dataset (JSON/JSONL/Parquet/CSV file, save_to_disk or data "
        "directory) with the model's tokenizer and the trainer's preprocessing; alone, from the config's own "
        "dataset_name / datasets when they are on this machine (nothing is downloaded)",
    )
    parser.add_argument(
        "--sample",
        type=int,
        metavar="N",
        help="read only the first N examples of each split: the facts are then an estimate, and say so",
    )


def target_overrides(ns: argparse.Namespace) -> dict[str, Any] | None:
    target = dict(TARGETS[ns.target]) if getattr(ns, "target", None) else {}
    for key, value in (("backend", ns.backend), ("device", ns.device), ("world_size", ns.world_size)):
        if value is not None:
            target[key] = value
    return target or None


def load_job_from_args(ns: argparse.Namespace) -> Job:
    """The spec file with its side file and flags; a dataset it names has its facts computed into `data`."""
    import dataclasses

    from warmup.job.spec import read_job

    job = read_job(
        ns.spec,
        trainer=ns.trainer,
        target=target_overrides(ns),
        side=getattr(ns, "side", None),
        dataset=getattr(ns, "dataset", None),
        sample=getattr(ns, "sample", None),
    )
    if job.dataset in (None, False):
        return job
    from warmup.facts.reading import dataset_facts
    from warmup.facts.summary import progress_bar

    found = dataset_facts(
        job.spec,
        None if job.dataset is True else str(job.dataset),  # `--dataset` alone: the config's own dataset_name
        selection=job.selection,
        sample=job.sample,
        progress=progress_bar(sys.stderr),
    )
    return dataclasses.replace(job, spec=job.spec.model_copy(update={"data": found.data}))


def load_spec_from_args(ns: argparse.Namespace) -> Spec:
    return load_job_from_args(ns).spec


def describe_target(spec: Spec, ns: argparse.Namespace) -> str:
    """The job's target and where it came from, for the lines a person reads (the default is never silent)."""
    target = spec.target
    where = f"{target.backend} on {target.device}" + (
        f", {target.world_size} processes" if target.world_size > 1 else ""
    )
    if any(getattr(ns, name, None) for name in ("target", "backend", "device")):
        return f"{where} (from the command line)"
    if not {"backend", "device"} & target.model_fields_set:
        return f"{where} (the default: --target cuda or --target cpu for a job that trains on GPUs or CPUs)"
    from warmup.job.spec import says_use_cpu

    if (target.backend, target.device) == ("inductor", "cpu") and says_use_cpu(spec.args):
        return f"{where} (the config says use_cpu: true)"
    return f"{where} (the spec's target)"


def describe_data(job: Job) -> str:
    """The data facts the plan used and where they came from, in one line."""
    facts = job.spec.data
    if not facts.model_dump(exclude_none=True):
        return (
            "data facts: none, so every length up to the config's limit is listed (--dataset PATH reads them from "
            "a local dataset; --dataset alone from the config's dataset_name)"
        )
    if job.dataset is True:
        origin = f"the config's dataset {job.selection.get('dataset_name') or 'selection'}"
    elif job.dataset not in (None, False):
        origin = str(job.dataset)
    else:
        origin = "the spec's data"
    shown = ", ".join(
        f"{name} {value}"
        for name, value in facts.model_dump(exclude_none=True).items()
        if name not in ("length_histogram", "estimated_from")
    )
    estimate = f", an estimate from the first {facts.estimated_from} examples" if facts.estimated_from else ""
    return f"data facts (from {origin}{estimate}): {shown}"
