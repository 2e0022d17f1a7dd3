"""`warmup worker` (or `python -m warmup.worker`): run workers on this host.

With `--concurrency N` it starts N worker processes and supervises them: each is this same command,
re-executed with its own arguments and a concurrency of 1. On Neuron each process gets its own
NeuronCore group (NEURON_RT_VISIBLE_CORES 0,1 / 2,3, or 0 / 1 / 2 / 3, or 0-3: groups start at a
multiple of their size). SIGTERM (or Ctrl-C) stops claiming; a task in progress may finish within
`--grace` seconds, else it is released for another worker.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Sequence

from warmup.db.migrate import require_migrated
from warmup.errors import WarmupError
from warmup.logs import configure_logging
from warmup.settings import Settings, add_options, settings_from
from warmup.worker.loop import Worker, WorkerOptions

# NeuronCore groups per number of worker processes on a 4-core host (trn2.3xlarge at LNC=2).
NEURON_CORE_GROUPS = {1: ["0-3"], 2: ["0,1", "2,3"], 4: ["0", "1", "2", "3"]}


def run(settings: Settings, argv: Sequence[str]) -> int:
    """Work with these settings; `argv` are the command's own arguments, which the processes of a
    supervised group are started with."""
    if not settings.locations_given:
        raise WarmupError("give --database-url and --store (or --data-dir for the embedded setup)")
    configure_logging(settings.log_format, settings.log_level)
    # Checked once here, before a group starts processes that would each fail on it.
    require_migrated(settings.resolved_database_url)
    if settings.concurrency > 1:
        return supervise(settings, argv)
    worker = Worker(WorkerOptions.from_settings(settings))

    def stop(signum: int, _frame: object) -> None:
        logging.getLogger("warmup.worker").info("signal %d: finishing or releasing the current task", signum)
        worker.stop.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    outcomes = worker.run()
    failed = [o for o in outcomes if o.status == "failed"]
    return 3 if failed else 0


def supervise(settings: Settings, argv: Sequence[str]) -> int:
    """Start `--concurrency` single worker processes; forward SIGTERM; exit with the worst status."""
    groups = NEURON_CORE_GROUPS.get(settings.concurrency) if settings.backend == "neuron" else None
    if settings.backend == "neuron" and groups is None:
        raise WarmupError(f"--concurrency on Neuron must be 1, 2 or 4 (core groups {NEURON_CORE_GROUPS})")
    children = []
    for index in range(settings.concurrency):
        env = dict(os.environ)
        if groups:
            env["NEURON_RT_VISIBLE_CORES"] = groups[index]
        # The last --concurrency wins: each child is one worker process.
        command = [sys.executable, "-m", "warmup.worker", *argv, "--concurrency", "1"]
        children.append(subprocess.Popen(command, env=env))

    def forward(signum: int, _frame: object) -> None:
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    return max(child.wait() for child in children)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="warmup worker", description=__doc__)
    add_options(parser, "worker")
    try:
        return run(settings_from(parser.parse_args(argv), "worker"), argv)
    except WarmupError as error:
        print(f"error: {error}", file=sys.stderr)
        return error.exit_code


if __name__ == "__main__":
    sys.exit(main())
