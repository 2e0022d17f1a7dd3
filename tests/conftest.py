"""Shared pytest configuration.

Test tiers: the folder a test lives in is its tier, and its marker is derived from it here:
`tests/unit` (in process: no server, no subprocess, no compile, no TRL training; `pytest tests/unit` is
the fast loop), `tests/integration` (PostgreSQL and S3, the service, workers and commands as processes, real
TRL runs without torch.compile), `tests/e2e` (real torch.compile: warm, then train) and `tests/reliability`
(load, fuzz, fault injection). `pytest -m unit` is the same as `pytest tests/unit`.

C++ builds go through a cache of this run's own (tests/support/compiler_cache.py): the proofs compile the same
tiny model's kernels many times, each into its own fresh Inductor cache, and g++ is most of a compile's time.

Service fixtures (PostgreSQL, SQLite, S3) live in tests/fixtures. Subprocesses started by tests
(`python -m warmup ...`, training jobs) import the project from this checkout: its root goes first
on PYTHONPATH.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest_plugins = ["tests.fixtures.services"]

REPO_ROOT = Path(__file__).resolve().parents[1]
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(REPO_ROOT), *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]]
)


class OneImportPath(importlib.abc.MetaPathFinder):
    """`api/`, `worker/` and `migrations/` are folders at this checkout's top, installed as `warmup.api`,
    `warmup.worker` and `warmup.db.migrations`: the checkout's root is on sys.path here (the tests import
    `tests.*`), and importing one by its folder's name would load a second copy of its modules."""

    FOLDERS = {"api": "warmup.api", "worker": "warmup.worker", "migrations": "warmup.db.migrations"}

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        top = fullname.partition(".")[0]
        if top in self.FOLDERS:
            raise ModuleNotFoundError(
                f"No module named {fullname!r}: import {self.FOLDERS[top]}", name=fullname
            )
        return None


sys.meta_path.insert(0, OneImportPath())

# OpenMP threads that wait sleep instead of spinning: the suite runs more processes than cores (its workers,
# the processes they start, each with an OpenMP pool), and a spinning thread burns a core another process
# needs. No cache key holds it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# The toolchains a test run computes are remembered in a memo of the run's own (not the venv's image
# memo, which would carry them into the next run): warmup.toolchain.memo.resolve_toolchain.
os.environ.setdefault(
    "WARMUP_TOOLCHAIN_MEMO", str(Path(tempfile.mkdtemp(prefix="warmup-test-memo-")) / "toolchain.json")
)


def _compiler_cache() -> Path | None:
    """Put tests/support/compiler_cache.py's `g++` first on PATH for this run and every process it starts
    (xdist workers inherit it); the directory it made, for the run's end to remove."""
    if os.environ.get("WARMUP_TEST_CXX_CACHE") or not (real := shutil.which("g++")):
        return None  # set up by the controller of this run already, or `off`, or no compiler here
    root = Path(tempfile.mkdtemp(prefix="warmup-test-cxx-"))
    wrapper = root / "bin" / "g++"
    wrapper.parent.mkdir()
    script = REPO_ROOT / "tests" / "support" / "compiler_cache.py"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S "{script}" "{real}" "{root}" "$@"\n')
    wrapper.chmod(0o755)
    os.environ["PATH"] = f"{wrapper.parent}{os.pathsep}{os.environ.get('PATH', '')}"
    os.environ["WARMUP_TEST_CXX_CACHE"] = str(root)
    return root


COMPILER_CACHE = _compiler_cache()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if COMPILER_CACHE is not None and (log := COMPILER_CACHE / "builds.log").is_file():
        outcomes = log.read_text().split()
        hits = outcomes.count("hit")
        terminalreporter.write_line(
            f"g++ (tests/support/compiler_cache.py): {len(outcomes) - hits} build(s) compiled, "
            f"{hits} reused from earlier identical builds of this run"
        )


def pytest_unconfigure(config: pytest.Config) -> None:
    if COMPILER_CACHE is not None:
        shutil.rmtree(COMPILER_CACHE, ignore_errors=True)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto`: one worker more than the cores. Every worker spends part of its time waiting (on a process
    it started, a server, a lease), and the extra worker fills those waits."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return cores + 1


TESTS = Path(__file__).resolve().parent
# The tiers, costliest first: in parallel runs the long proofs start at once and the cheap tests fill the
# workers around them.
TIERS = ("e2e", "reliability", "integration", "unit")


@functools.cache
def tier_of(path: Path) -> str:
    """The tier of a test file: the folder under tests/ it lives in."""
    parts = path.resolve().parts
    folder = parts[len(TESTS.parts)] if parts[: len(TESTS.parts)] == TESTS.parts else ""
    if folder not in TIERS:
        raise pytest.UsageError(
            f"{path}: a test lives in its tier's folder, one of tests/{{{','.join(TIERS)}}}"
        )
    return folder


# Before xdist's own hook, which reads each test's `xdist_group` to schedule it (registered after this conftest, it
# would otherwise run first and see none: a module's shared fixture would be built in every worker at once).
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(tier_of(item.path))
        if not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group(_worker_group(item)))
    # Costliest tier first, each module's tests kept together and in order.
    items.sort(key=lambda item: TIERS.index(tier_of(item.path)))


def pytest_collection_finish(session: pytest.Session) -> None:
    """Refuse a parallel run whose worker groups do not hold: xdist marks a grouped test by renaming it, and a
    pytest that no longer reads that name (9.2, with xdist 3.8) runs a module's tests in several workers, each
    building the module's fixtures (three two-node clusters at once)."""
    if (
        session.config.getoption("loadgroup", default=False)
        and session.items
        and not any("@" in i.nodeid for i in session.items)
    ):
        raise pytest.UsageError(
            f"pytest {pytest.__version__} with this pytest-xdist ignores --dist loadgroup's groups; "
            "install the locked versions (make install) or pytest<9.2"
        )


def _worker_group(item: pytest.Item) -> str:
    """Which tests share a worker under `-n N --dist loadgroup` (the README's test command): a test that uses
    a module- or class-scoped fixture runs in its module's worker, so the fixture is built once; any other
    test (each end-to-end proof warms its own job) may run in any worker. Session fixtures are per worker.
    Under pytest 9.2, xdist 3.8 does not honour the groups (it renames a test through an attribute pytest no
    longer reads), so a module fixture is built in each worker that runs one of its tests: correct, slower; the
    two-node cluster, which must be one at a time, runs on its own (Makefile `test`)."""
    info = getattr(item, "_fixtureinfo", None)  # pytest's own record of the test's fixture definitions
    definitions = info.name2fixturedefs.values() if info is not None else ()
    shared = any(d.scope in ("module", "class", "package") for defs in definitions for d in defs)
    return item.nodeid.split("::")[0] if shared else item.nodeid


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """config.json + tokenizer of a 1-layer, 64-wide Qwen3 causal LM (no weights)."""
    from tests.support.tiny_model import write_tiny_model

    return write_tiny_model(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(scope="session")
def user_weights_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpoint of the tiny model with its own random weights: what a user trains from."""
    from tests.support.tiny_model import save_weights

    return save_weights(tiny_model_dir, tmp_path_factory.mktemp("user-weights"), seed=1234)


@pytest.fixture(scope="session")
def tiny_reward_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model as a sequence classifier (one label), for Reward jobs."""
    from tests.support.tiny_model import write_tiny_model

    return write_tiny_model(tmp_path_factory.mktemp("tiny-seq-cls"), seq_classification=True)


@pytest.fixture(autouse=True)
def _restore_root_logger() -> Iterator[None]:
    """Commands run in process (`warmup gc`, `configure_logging`) configure the root logger: put it back."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        if handler not in handlers:
            root.removeHandler(handler)
    root.setLevel(level)
