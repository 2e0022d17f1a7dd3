"""`warmup worker`: run workers on this host.

With `--concurrency N` it starts N worker processes and supervises them; on Neuron each process gets
its own NeuronCore group (NEURON_RT_VISIBLE_CORES 0,1 / 2,3, or 0 / 1 / 2 / 3, or 0-3: groups
start at a multiple of their size). SIGTERM (or Ctrl-C) stops claiming; a task in progress may
finish within `--grace` seconds, else it is released for another worker.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys

from warmup.cli_service import add_worker_arguments
from warmup.logs import configure_logging
from worker.loop import Worker, WorkerOptions

# NeuronCore groups per number of worker processes on a 4-core host (trn2.3xlarge at LNC=2).
NEURON_CORE_GROUPS = {1: ["0-3"], 2: ["0,1", "2,3"], 4: ["0", "1", "2", "3"]}


def options_from(ns: argparse.Namespace) -> WorkerOptions:
    database_url, store_url = ns.database_url, ns.store_url
    if ns.data_dir is not None:
        database_url = database_url or f"sqlite:///{(ns.data_dir / 'warmup.db').resolve()}"
        store_url = store_url or str((ns.data_dir / "blobs").resolve())
    if not database_url or not store_url:
        raise SystemExit("error: give --database-url and --store (or --data-dir for the embedded setup)")
    device = ns.device or default_device(ns.backend)
    return WorkerOptions(
        database_url=database_url,
        store_url=store_url,
        backend=ns.backend,
        device=device,
        pool=ns.pool,
        lease_s=ns.lease,
        task_timeout_s=ns.task_timeout,
        grace_s=ns.grace,
        exit_when_idle=ns.exit_when_idle,
        world_sizes=parse_world_sizes(ns.world_sizes),
        max_attempts=ns.max_attempts,
        poll_s=ns.poll_interval,
        retry_delay_s=ns.retry_delay,
    )


def parse_world_sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(sorted({int(part) for part in text.split(",") if part.strip()}))
    except ValueError:
        sizes = ()
    if not sizes or sizes[0] < 1:
        raise SystemExit(f"error: --world-sizes takes positive numbers like 1,2,4, not {text!r}")
    return sizes


def default_device(backend: str) -> str:
    if backend == "neuron":
        return "neuron"
    try:
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    except ImportError:
        return "cpu"


def run(ns: argparse.Namespace) -> int:
    configure_logging()  # WARMUP_LOG_FORMAT / WARMUP_LOG_LEVEL
    if ns.concurrency > 1:
        return supervise(ns)
    worker = Worker(options_from(ns))

    def stop(signum: int, _frame: object) -> None:
        logging.getLogger("warmup.worker").info("signal %d: finishing or releasing the current task", signum)
        worker.stop.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    outcomes = worker.run()
    failed = [o for o in outcomes if o.status == "failed"]
    return 3 if failed else 0


def supervise(ns: argparse.Namespace) -> int:
    """Start `--concurrency` single worker processes; forward SIGTERM; exit with the worst status."""
    groups = NEURON_CORE_GROUPS.get(ns.concurrency) if ns.backend == "neuron" else None
    if ns.backend == "neuron" and groups is None:
        raise SystemExit(
            f"error: --concurrency on Neuron must be 1, 2 or 4 (core groups {NEURON_CORE_GROUPS})"
        )
    children = []
    for index in range(ns.concurrency):
        env = dict(os.environ)
        if groups:
            env["NEURON_RT_VISIBLE_CORES"] = groups[index]
        children.append(
            subprocess.Popen([sys.executable, "-m", "warmup", "worker", *child_arguments(ns)], env=env)
        )

    def forward(signum: int, _frame: object) -> None:
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    return max(child.wait() for child in children)


def child_arguments(ns: argparse.Namespace) -> list[str]:
    """The command line of one worker process of a supervised group: the same options, concurrency 1."""
    options = options_from(ns)
    args = [
        "--database-url",
        options.database_url,
        "--store",
        options.store_url,
        "--backend",
        options.backend,
        "--device",
        options.device,
        "--lease",
        str(ns.lease),
        "--task-timeout",
        str(ns.task_timeout),
        "--grace",
        str(ns.grace),
    ]
    if ns.pool:
        args += ["--pool", ns.pool]
    args += ["--max-attempts", str(ns.max_attempts), "--retry-delay", str(ns.retry_delay)]
    args += ["--poll-interval", str(ns.poll_interval)]
    if ns.world_sizes != "1":
        args += ["--world-sizes", ns.world_sizes]
    if ns.exit_when_idle:
        args.append("--exit-when-idle")
    return args


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="warmup worker", description=__doc__)
    add_worker_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
