"""Commands that work on this machine: `warmup plan` and `warmup warm`."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from warmup.cli.common import (
    add_spec_arguments,
    describe_data,
    describe_target,
    load_job_from_args,
    load_spec_from_args,
)
from warmup.formatting import format_duration, format_size, format_table

# `warmup plan` shows this many rows of a longer plan (the first ones and the last ones); --all shows every row.
PLAN_ROWS_SHOWN = 20


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    plan = sub.add_parser(
        "plan", help="list every signature (shape and static-cache size) a job will compile"
    )
    add_spec_arguments(plan)
    plan.add_argument(
        "--format",
        choices=["table", "json"],
        default="table",
        help="a summary, the warnings and the table (default), or JSON: the plan with its target, data facts and "
        "compile-time estimate",
    )
    plan.add_argument(
        "--all",
        action="store_true",
        help=f"list every signature (the table shows {PLAN_ROWS_SHOWN} of a longer plan)",
    )
    plan.set_defaults(func=cmd_plan)

    warm = sub.add_parser("warm", help="compile every signature of a job into a local cache directory")
    add_spec_arguments(warm)
    warm.add_argument("--cache-dir", required=True, help="cache directory to fill (a pod uses it directly)")
    warm.add_argument("--timeout", type=float, default=1800.0, help="seconds one rehearsal run may take")
    warm.add_argument("--jobs", type=int, default=1, help="rehearsal runs at once (each uses every core)")
    warm.add_argument("--work-dir", help="scratch directory for the runs (default: next to the cache dir)")
    warm.add_argument("--keep-work", action="store_true", help="keep the per-run directories and logs")
    warm.set_defaults(func=cmd_warm)


# --- warmup plan --------------------------------------------------------------------------------


def cmd_plan(ns: argparse.Namespace) -> int:
    from warmup.planner.planning import estimate_seconds, plan_spec

    job = load_job_from_args(ns)
    plan = plan_spec(job.spec)
    estimate = {
        backend: round(sum(estimate_seconds(s, backend) for s in plan.signatures))
        for backend in ("neuron", "inductor")
    }
    if ns.format == "json":
        document = {
            **plan.model_dump(mode="json"),
            "target": job.spec.target.model_dump(mode="json"),
            "data": job.spec.data.model_dump(mode="json", exclude_none=True),
            "estimated_compile_seconds": estimate,
        }
        print(json.dumps(document, indent=2))
        return 0
    # What a person needs first: the size, the target it was planned for, the data it used, the warnings.
    backend = job.spec.target.backend
    other = "inductor" if backend == "neuron" else "neuron"
    print(
        f"{len(plan.signatures)} signature(s) for {describe_target(job.spec, ns)}; estimated compile time "
        f"~{format_duration(estimate[backend])} ({other} would take ~{format_duration(estimate[other])})"
    )
    print(describe_data(job))
    for title, lines in (("warnings", plan.warnings), ("notes", plan.notes)):
        if lines:
            print(f"\n{title}:")
            for line in lines:
                print(f"  - {line}")
    rows = [
        (i, s.phase, s.batch, s.seq_len, s.cache_len, s.model, s.dtype, s.compile)
        + ((s.sharding,) if s.sharding else ())
        for i, s in enumerate(plan.signatures, 1)
    ]
    headers: tuple[str, ...] = ("#", "phase", "batch", "seq_len", "cache_len", "model", "dtype", "compile")
    if any(s.sharding for s in plan.signatures):
        headers += ("sharding",)
    hidden = 0 if ns.all else max(len(rows) - PLAN_ROWS_SHOWN, 0)
    if hidden:  # the first rows and the last: the range a warning names is the table's
        head = PLAN_ROWS_SHOWN - PLAN_ROWS_SHOWN // 4
        rows = [*rows[:head], ("...",) + ("",) * (len(headers) - 1), *rows[head + hidden :]]
    print()
    print(format_table(headers, rows, right={0, 2, 3, 4}))
    if hidden:
        print(f"({hidden} more signature(s) not shown: --all lists every one)")
    return 0


# --- warmup warm --------------------------------------------------------------------------------


class WarmProgress:
    """Progress lines on stderr: signature i of n, elapsed time, and an estimate of the time left.

    The estimate is the average time per finished run so far; while several units share one run,
    the time between their starts.
    """

    def __init__(self, stream: Any = None) -> None:
        self.stream = stream or sys.stderr
        self.started: dict[int, float] = {}

    def __call__(self, progress: Any) -> None:
        elapsed = format_duration(progress.elapsed_s)
        if progress.event == "planned":
            line = f"warming {progress.signatures_total} signature(s): {progress.units_total} to compile"
            if progress.signatures_done:
                line += f", {progress.signatures_done} that compile nothing on this backend"
            self._print(line)
            return
        unit = progress.unit
        position = f"[{unit.index + 1}/{progress.units_total}]"
        if progress.event == "started":
            self.started[unit.index] = progress.elapsed_s
            self._print(f"{position} {unit.label}: compiling ... elapsed {elapsed}{self._left(progress)}")
            return
        first = progress.results[0]
        detail = f"compile {first.compile_seconds:.1f}s, {len(first.files)} files, {format_size(first.size)}"
        if first.status != "ok":
            detail = first.note
        left = self._left(progress)
        self._print(f"{position} {unit.label}: {first.status} ({detail}); elapsed {elapsed}{left}")

    def _left(self, progress: Any) -> str:
        begun = sorted(self.started.values())
        remaining = progress.units_total - len(begun) + (progress.event == "started")
        if remaining <= 0 or len(begun) < 2:
            return ""
        per_unit = (begun[-1] - begun[0]) / (len(begun) - 1)
        return f", about {format_duration(per_unit * remaining)} left"

    def _print(self, line: str) -> None:
        print(line, file=self.stream, flush=True)


def cmd_warm(ns: argparse.Namespace) -> int:
    from warmup.errors import RehearsalError
    from warmup.rehearsal.local import warm_directory

    spec = load_spec_from_args(ns)
    report = warm_directory(
        spec,
        ns.cache_dir,
        timeout_s=ns.timeout,
        jobs=ns.jobs,
        work_dir=ns.work_dir,
        keep_work=ns.keep_work,
        on_progress=WarmProgress(),
    )
    rows = []
    for result in report.results:
        status = "reused" if result.key in report.reused else result.status
        rows.append(
            (
                result.signature.shape_label,
                status,
                f"{result.compile_seconds:.1f}",
                len(result.files),
                format_size(result.size),
                result.note,
            )
        )
    print(format_table(("signature", "status", "compile s", "files", "size", "note"), rows, right={2, 3, 4}))
    for warning in report.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    if spec.target.world_size > 1 and report.processes != spec.target.world_size:
        print(
            f"note: the job's {spec.target.world_size} processes were rehearsed with {report.processes} "
            "(each rank compiles the same graphs at any world size above 1; `warmup plan` says why)",
            file=sys.stderr,
        )
    failed = [r for r in report.results if r.status != "ok"]
    if failed:
        for result in failed:
            print(f"\n--- {result.signature.shape_label}: {result.status}: {result.note}", file=sys.stderr)
            if result.log_tail:
                print(result.log_tail.rstrip()[-2000:], file=sys.stderr)
        raise RehearsalError(
            f"{len(failed)} of {len(report.results)} signature(s) did not warm; "
            f"the others are in {report.cache_dir}"
        )
    print(f"\nwarmed {len(report.results)} signature(s) into {report.cache_dir}")
    lost = [r for r in report.results if r.trace_lost]
    if lost:  # a job that silently loses its trace skip only shows it as a slower first step
        print(
            f"trace skip: lost for {len(lost)} of {len(report.results)} signature(s): {lost[0].trace_lost}; "
            "training traces those calls with Dynamo, and the warmed caches serve them"
        )
    return 0
