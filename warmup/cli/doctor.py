"""`warmup doctor`: whether this environment's versions are in the ranges trl-warmup supports and on a stack its
CI tests (warmup/data/stacks.json, docs/compatibility.md), and which features are off here, and why."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from importlib import metadata, resources
from typing import Any

# What the extras declare a range for, in the order a person reads them.
PACKAGES = ("torch", "transformers", "accelerate", "trl", "peft", "datasets", "torch-neuronx", "deepspeed")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    doctor = sub.add_parser(
        "doctor",
        help="are this image's versions in the tested ranges, and which features are off here",
        description=(
            "Compares the installed torch, transformers, accelerate, TRL, peft (and torch-neuronx, DeepSpeed) with "
            "the ranges trl-warmup declares and the stacks its CI tests (docs/compatibility.md), and says which "
            "features are off in this environment and why. Run it in a training or worker image's build: it "
            "also remembers the installed TRL's config field lists there. Exit status 0 when every installed "
            "version is in its range, 1 otherwise."
        ),
    )
    doctor.add_argument("--json", action="store_true", help="print the findings as JSON")
    doctor.set_defaults(func=cmd_doctor)


@dataclass
class Finding:
    name: str
    installed: str | None
    declared: str  # the range the extras declare ('' where none does)
    in_range: bool | None  # None: not installed, or no range to hold it to
    tested_on: list[str]  # the stacks of stacks.json that ran this exact version


def declared_ranges() -> dict[str, str]:
    """The ranges the installed trl-warmup's extras declare, by package (its metadata: pyproject.toml's extras)."""
    from packaging.requirements import Requirement

    ranges: dict[str, str] = {}
    for text in metadata.requires("trl-warmup") or []:
        requirement = Requirement(text)
        if requirement.specifier and requirement.name not in ranges:
            # `>=` before `<`: the lower bound first, as a person writes a range
            ranges[requirement.name] = ",".join(sorted(map(str, requirement.specifier), reverse=True))
    return ranges


def tested_stacks() -> dict[str, Any]:
    return dict(json.loads(resources.files("warmup.data").joinpath("stacks.json").read_text()))


def _installed(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def findings(ranges: dict[str, str], stacks: dict[str, Any]) -> list[Finding]:
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    python = ".".join(map(str, sys.version_info[:3]))
    found = [
        Finding(
            "python",
            python,
            ">=3.11",
            sys.version_info >= (3, 11),
            [name for name, stack in stacks["stacks"].items() if stack["versions"].get("python") == python],
        )
    ]
    for name in PACKAGES:
        installed = _installed(name)
        declared = ranges.get(name, "")
        in_range = None
        tested: list[str] = []
        if installed is not None:
            public = Version(installed).public  # torch's local build label (+cpu, +cu130) is not a version
            in_range = SpecifierSet(declared).contains(public, prereleases=True) if declared else None
            tested = [n for n, stack in stacks["stacks"].items() if stack["versions"].get(name) == public]
        found.append(Finding(name, installed, declared, in_range, tested))
    return found


def features() -> dict[str, str | None]:
    """Each feature, and why it is off here (None: on)."""
    off: dict[str, str | None] = {}
    missing = [name for name in ("torch", "transformers", "trl") if _installed(name) is None]
    ml = f"{', '.join(missing)} not installed (the `trl` extra)" if missing else None
    off["plan"] = ml
    off["warm (inductor)"] = ml
    off["warm (neuron)"] = ml or (None if _installed("torch-neuronx") else "torch-neuronx not installed")
    if ml:
        off["trace skip"] = ml
    else:
        from warmup.trace_skip.split import unavailable_reason

        off["trace skip"] = unavailable_reason()
        if (
            _installed("kernels") is not None
        ):  # transformers' hub kernels, a dependency from transformers 5.25 on
            from warmup.trace_skip.losses import hub_kernels_checkpoint_loss, hub_kernels_loss

            off["trace skip of a model using hub kernels (Qwen3 and others)"] = hub_kernels_loss()
            off["... under gradient checkpointing"] = hub_kernels_checkpoint_loss()
    off["sharded jobs: FSDP"] = ml
    off["sharded jobs: DeepSpeed ZeRO"] = ml or (
        None if _installed("deepspeed") else "deepspeed not installed (the `deepspeed` extra)"
    )
    off["pull, exec, the manifest checks"] = None  # the base install
    return off


def field_lists() -> str:
    """Which lists a trl config is read with here (and, where they are the installed TRL's, remember them)."""
    from warmup.job.spec import installed_trl_versions, shipped_trl_cli_fields, trl_cli_fields

    shipped = shipped_trl_cli_fields()
    of = ", ".join(f"{name} {shipped[name]}" for name in ("trl", "accelerate", "transformers"))
    if installed_trl_versions() is None:
        return f"shipped with trl-warmup ({of}): TRL is not installed here"
    used = trl_cli_fields()
    own = ", ".join(f"{name} {used[name]}" for name in ("trl", "accelerate", "transformers"))
    return f"the installed packages' ({own})" + ("" if used is shipped or used == shipped else ", remembered")


def this_stacks_runs(found: list[Finding], stacks: dict[str, Any]) -> dict[str, str]:
    """For each tested stack whose torch, transformers, accelerate, TRL and peft are exactly those installed here,
    what its last recorded run showed, feature by feature."""
    exact = {"torch", "transformers", "accelerate", "trl", "peft"}
    same = [
        name
        for name in stacks["stacks"]
        if all(name in finding.tested_on for finding in found if finding.name in exact and finding.installed)
        and all(finding.installed for finding in found if finding.name in exact)
    ]
    runs = {}
    for name in same:
        stack = stacks["stacks"][name]
        if stack.get("whole_suite"):
            runs[name] = f"`{stack['command']}`, the whole suite, in every CI run"
            continue
        parts = [
            f"{feature} {counts['passed']}/{counts['passed'] + counts['failed']} passed"
            for feature, counts in stack["features"].items()
        ]
        runs[name] = f"`{stack['command']}` of {stack.get('recorded', '?')}: " + ", ".join(parts)
    return runs


def cmd_doctor(ns: argparse.Namespace) -> int:
    stacks = tested_stacks()
    try:
        ranges = declared_ranges()
    except ImportError:  # packaging: transformers brings it; a bare base install may lack it
        print(
            "warmup doctor needs `packaging` (pip install packaging) to read the declared ranges",
            file=sys.stderr,
        )
        return 1
    found = findings(ranges, stacks)
    off = features()
    lists = field_lists()
    runs = this_stacks_runs(found, stacks)
    if ns.json:
        document = {
            "versions": [vars(finding) for finding in found],
            "features": off,
            "tested_runs": runs,
            "trl_config_fields": lists,
            "cuda": stacks["cuda"],
        }
        print(json.dumps(document, indent=1))
    else:
        print("versions (docs/compatibility.md):")
        for finding in found:
            if finding.installed is None:
                print(
                    f"  {finding.name:<13} not installed"
                    + (f" (range {finding.declared})" if finding.declared else "")
                )
                continue
            where = f"in range {finding.declared}" if finding.in_range else f"OUT OF RANGE {finding.declared}"
            if finding.in_range is None:
                where = "no range declared"
            tested = (
                f"tested ({', '.join(finding.tested_on)} stack)"
                if finding.tested_on
                else "not a tested version"
            )
            print(f"  {finding.name:<13} {finding.installed:<12} {where}; {tested}")
        print("features:")
        for feature, reason in off.items():
            print(f"  {feature:<32} {'on' if reason is None else 'off: ' + reason}")
        for name, run in runs.items():
            print(f"this is the {name} stack: {run}")
        print(f"trl config fields: {lists}")
        print(f"CUDA: {stacks['cuda']}")
    out = [finding.name for finding in found if finding.in_range is False]
    if out:
        print(f"out of the supported ranges: {', '.join(out)} (docs/compatibility.md)", file=sys.stderr)
    return 1 if out else 0
