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

    from warmup import cli_service

    cli_service.register(sub)
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
