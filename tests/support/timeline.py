"""Where the suite's time goes: `pytest -p tests.support.timeline --timeline=PATH [-n 2 ...]`.

Each test appends one JSON line to PATH: its xdist worker, start and end (epoch seconds), and the CPU
it used (its process's and its waited children's: the `warmup` and training processes it starts, g++).
At the end the run prints the modules that used the most CPU and how busy each worker was, which
`--durations` (wall time only) cannot tell: a test that sleeps on a lease and one that compiles look
alike there. Opt-in, for measuring; the suite's own runs do not load it.
"""

from __future__ import annotations

import json
import resource
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--timeline", metavar="PATH", help="append one JSON line per test to PATH")


def _cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _worker(config: pytest.Config) -> str:
    # xdist's own record of the worker, not PYTEST_XDIST_WORKER: a pytest run inside a test (this
    # plugin's own test) inherits that variable from the worker it runs under.
    workerinput: dict[str, str] = getattr(config, "workerinput", {})
    return workerinput.get("workerid", "main")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    path = item.config.getoption("timeline")
    start, cpu = time.time(), _cpu_seconds()
    yield
    if path:
        line = {
            "worker": _worker(item.config),
            "test": item.nodeid,
            "start": start,
            "end": time.time(),
            "cpu": _cpu_seconds() - cpu,
        }
        with Path(path).open("a") as out:
            out.write(json.dumps(line) + "\n")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    path = config.getoption("timeline")
    if not path or _worker(config) != "main" or not Path(path).is_file():
        return
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line]
    if not rows:
        return
    by_module: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    by_worker: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for row in rows:
        module = by_module[row["test"].split("::")[0]]
        module[0] += row["cpu"]
        module[1] += row["end"] - row["start"]
        module[2] += 1
        by_worker[row["worker"]][0] += row["end"] - row["start"]
        by_worker[row["worker"]][1] += row["cpu"]
    span = max(row["end"] for row in rows) - min(row["start"] for row in rows)
    write = terminalreporter.write_line
    terminalreporter.section(f"timeline ({path})")
    write(f"{'CPU s':>8} {'wall s':>8} {'tests':>6}  module (the 15 that used the most CPU)")
    for module, (cpu, wall, count) in sorted(by_module.items(), key=lambda item: -item[1][0])[:15]:
        write(f"{cpu:8.0f} {wall:8.0f} {int(count):6d}  {module}")
    total = sum(cpu for cpu, _, _ in by_module.values())
    write(
        f"{total:8.0f} s of CPU in tests over {span:.0f} s from the first test's start to the last one's end"
    )
    for worker, (busy, cpu) in sorted(by_worker.items()):
        write(f"worker {worker}: in a test {busy:.0f} s ({busy / span:.0%} of that span), {cpu:.0f} s of CPU")
