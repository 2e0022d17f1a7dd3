"""`warmup selftest`: warm and train two tiny TRL jobs on this machine; a verdict per phase."""

from __future__ import annotations

import argparse
import contextlib
import sys
import time

from warmup.formatting import format_duration


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from warmup.backends.registry import BACKEND_NAMES

    selftest = sub.add_parser(
        "selftest",
        help="prove zero compiles on this machine: warm tiny jobs, train them in fresh processes",
        description=(
            "Builds a tiny model from a config, plans, warms and trains a DPO job (phases train and ref) "
            "and a GRPO job (phase generation) in fresh processes over the warmed caches, and prints a "
            "verdict per phase with its fresh-compile count and times. Exit status 0 unless a phase failed."
        ),
    )
    selftest.add_argument(
        "--backend", choices=BACKEND_NAMES, default="inductor", help="compile backend (default: inductor)"
    )
    selftest.add_argument(
        "--device",
        choices=["neuron", "cuda", "cpu"],
        help="default: neuron for the neuron backend; else cuda when torch sees a GPU, cpu otherwise",
    )
    selftest.add_argument(
        "--phases",
        type=_phases,
        default="train,ref,generation",
        help="comma-separated: train, ref, generation (default: all three)",
    )
    selftest.add_argument("--work-dir", help="where the jobs and caches go (default: a temporary directory)")
    selftest.add_argument(
        "--keep", action="store_true", help="keep the work directory when every phase passed"
    )
    selftest.add_argument(
        "--timeout", type=float, default=900.0, help="seconds a warm-up or training run may take"
    )
    selftest.set_defaults(func=cmd_selftest)


def cmd_selftest(ns: argparse.Namespace) -> int:
    from warmup.selftest import format_report, run_selftest

    start = time.monotonic()

    def progress(line: str) -> None:
        print(f"[{format_duration(time.monotonic() - start)}] {line}", file=sys.stderr, flush=True)

    # stdout carries the report alone: what the libraries print while the jobs run (DeepSpeed, when
    # installed, logs to stdout on import) goes to stderr with the progress lines.
    with contextlib.redirect_stdout(sys.stderr):
        report = run_selftest(
            ns.backend,
            ns.device,
            phases=ns.phases,
            work_dir=ns.work_dir,
            keep=ns.keep,
            timeout_s=ns.timeout,
            on_line=progress,
        )
    print(format_report(report))
    return 0 if report.passed else 1


def _phases(text: str) -> tuple[str, ...]:
    from warmup.selftest import PHASES

    phases = tuple(part.strip() for part in text.split(",") if part.strip())
    unknown = [phase for phase in phases if phase not in PHASES]
    if unknown or not phases:
        raise argparse.ArgumentTypeError(
            f"unknown phase(s) {', '.join(unknown) or '(none given)'}: choose from {', '.join(PHASES)}"
        )
    return phases
