"""The `warmup` command.

Each subcommand imports what it needs when it runs, so `warmup pull` on a training pod starts fast
and needs only the base install. Errors a user can cause print as one line and exit non-zero
(2: invalid spec); they never print a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

from warmup.errors import WarmupError

Command = Callable[[argparse.Namespace], int]


def format_duration(seconds: float) -> str:
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m {seconds % 60:02d}s"
    return f"{seconds // 3600}h {seconds % 3600 // 60:02d}m"


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], right: set[int] | None = None) -> str:
    """A plain-text table: columns padded to their widest cell, numbers right-aligned."""
    right = right or set()
    cells = [[str(h) for h in headers]] + [["-" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = []
    for row in cells:
        parts = [cell.rjust(widths[i]) if i in right else cell.ljust(widths[i]) for i, cell in enumerate(row)]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


# --- spec arguments shared by every command that takes a SPEC ---------------------------------


def add_spec_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", help="spec file (YAML/JSON), or the YAML of `trl <trainer> --config`")
    parser.add_argument("--trainer", help="trainer kind, for a TRL CLI config that does not say it")
    parser.add_argument(
        "--backend", choices=["neuron", "inductor"], help="override the spec's target backend"
    )
    parser.add_argument(
        "--device", choices=["neuron", "cuda", "cpu"], help="override the spec's target device"
    )
    parser.add_argument("--world-size", type=int, help="override the spec's number of training processes")


def load_spec_from_args(ns: argparse.Namespace):
    from warmup.spec import load_spec

    target = {
        key: value
        for key, value in (("backend", ns.backend), ("device", ns.device), ("world_size", ns.world_size))
        if value is not None
    }
    return load_spec(ns.spec, trainer=ns.trainer, target=target or None)


# --- warmup plan --------------------------------------------------------------------------------


def cmd_plan(ns: argparse.Namespace) -> int:
    from warmup.planner import estimate_seconds, plan_spec

    plan = plan_spec(load_spec_from_args(ns))
    if ns.format == "json":
        print(json.dumps(plan.model_dump(mode="json"), indent=2))
        return 0
    rows = [
        (i, s.phase, s.batch, s.seq_len, s.cache_len, s.model, s.dtype, s.compile)
        for i, s in enumerate(plan.signatures, 1)
    ]
    headers = ("#", "phase", "batch", "seq_len", "cache_len", "model", "dtype", "compile")
    print(format_table(headers, rows, right={0, 2, 3, 4}))
    estimates = ", ".join(
        f"{backend} ~{format_duration(sum(estimate_seconds(s, backend) for s in plan.signatures))}"
        for backend in ("neuron", "inductor")
    )
    print(f"\n{len(plan.signatures)} signature(s); estimated compile time: {estimates}")
    if plan.warnings:
        print("\nwarnings:")
        for warning in plan.warnings:
            print(f"  - {warning}")
    return 0


# --- warmup warm --------------------------------------------------------------------------------


def format_size(size: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GB"


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
    return 0


# --- wiring -------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="warmup",
        description="Pre-warm compile caches for TRL training jobs (Trainium and torch.compile).",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    plan = sub.add_parser(
        "plan", help="list every signature (shape and static-cache size) a job will compile"
    )
    add_spec_arguments(plan)
    plan.add_argument("--format", choices=["table", "json"], default="table")
    plan.set_defaults(func=cmd_plan)

    warm = sub.add_parser("warm", help="compile every signature of a job into a local cache directory")
    add_spec_arguments(warm)
    warm.add_argument("--cache-dir", required=True, help="cache directory to fill (a pod uses it directly)")
    warm.add_argument("--timeout", type=float, default=1800.0, help="seconds one rehearsal run may take")
    warm.add_argument("--jobs", type=int, default=1, help="rehearsal runs at once (each uses every core)")
    warm.add_argument("--work-dir", help="scratch directory for the runs (default: next to the cache dir)")
    warm.add_argument("--keep-work", action="store_true", help="keep the per-run directories and logs")
    warm.set_defaults(func=cmd_warm)

    from warmup import cli_pod, cli_service

    cli_service.register(sub)
    cli_pod.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    try:
        return ns.func(ns)
    except WarmupError as error:
        print(f"error: {error}", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
