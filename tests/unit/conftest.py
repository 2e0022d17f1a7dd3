"""The unit tier runs in this process only: a test that needs a database gets SQLite in a file of its own, and a
test that starts a process fails (`_no_process_in_unit_tier`), naming the call.

The machine's facts a toolchain is made of (the C++ compiler's answers, Inductor's ISA probes) are read once
for the run, before the first test (`_machine_facts_read_once`): the product keeps them for the life of a
process, so the tests that compute this machine's toolchain then run in process.

Tests written against `db_url` (tests/fixtures/services.py: SQLite and PostgreSQL) run here on SQLite alone;
their PostgreSQL runs are in tests/integration (test_queue_postgresql.py, test_api_servers.py).
"""

from __future__ import annotations

import pytest


@pytest.fixture(params=["sqlite"])
def db_url(sqlite_url: str) -> str:
    return sqlite_url


class ProcessStartedInUnitTier(AssertionError):
    """A unit test started a process: the tier's rule (in this process only) is checked, not just written."""


def _refuse_process(name: str):  # type: ignore[no-untyped-def]
    def refuse(*args: object, **kwargs: object) -> object:
        raise ProcessStartedInUnitTier(
            f"{name} in a unit test: the unit tier runs in this process only; move the test to tests/integration"
        )

    return refuse


# Every way this interpreter starts a process ends in one of these: subprocess and multiprocessing's spawn go
# through _posixsubprocess.fork_exec (subprocess keeps its own reference), multiprocessing's fork and
# forkserver through os.fork, and os.system / posix_spawn / exec* directly.
_PROCESS_STARTERS = [
    ("subprocess", "_fork_exec"),
    ("_posixsubprocess", "fork_exec"),
    ("os", "fork"),
    ("os", "forkpty"),
    ("os", "system"),
    ("os", "posix_spawn"),
    ("os", "posix_spawnp"),
    ("os", "execv"),
    ("os", "execve"),
]


@pytest.fixture(scope="session", autouse=True)
def _machine_facts_read_once() -> None:
    from warmup import layout
    from warmup.toolchain.probes import current_toolchain

    current_toolchain("inductor", "cpu")
    layout.command_line_paths()


@pytest.fixture(autouse=True)
def _no_process_in_unit_tier(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    for module_name, attribute in _PROCESS_STARTERS:
        module = importlib.import_module(module_name)
        if hasattr(module, attribute):
            monkeypatch.setattr(module, attribute, _refuse_process(f"{module_name}.{attribute}"))
