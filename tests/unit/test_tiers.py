"""The test tree: every test file lives in a tier's folder (tests/conftest.py derives its marker from it),
no two test files share a basename, so a test is found by its file's name alone, a unit test that starts a
process fails, and every unit test that takes a database or a blob store runs again on the real servers."""

from __future__ import annotations

import importlib
import multiprocessing
import os
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from tests.conftest import TIERS
from tests.support.twins import twins
from tests.unit.conftest import ProcessStartedInUnitTier

TESTS = Path(__file__).resolve().parents[1]
TEST_FILES = sorted(TESTS.rglob("test_*.py"))


def test_every_test_file_lives_in_a_tier():
    outside = [str(p.relative_to(TESTS)) for p in TEST_FILES if p.relative_to(TESTS).parts[0] not in TIERS]
    assert outside == [], f"move them under tests/{{{','.join(TIERS)}}}"


def test_no_two_test_files_share_a_basename():
    repeated = sorted(name for name, n in Counter(p.name for p in TEST_FILES).items() if n > 1)
    assert repeated == [], "rename one of each: " + ", ".join(
        str(p.relative_to(TESTS)) for p in TEST_FILES if p.name in repeated
    )


@pytest.mark.parametrize(
    "start",
    [
        lambda: subprocess.run(["true"], check=False),
        lambda: os.fork(),
        lambda: os.system("true"),
        lambda: multiprocessing.get_context("spawn").Process(target=print).start(),
    ],
    ids=["subprocess", "fork", "system", "multiprocessing"],
)
def test_a_unit_test_that_starts_a_process_fails_naming_the_call(start):
    with pytest.raises(ProcessStartedInUnitTier, match="move the test to tests/integration"):
        start()


# The unit modules whose tests take a database, a blob store or the services built on them, and the integration
# module that runs those tests again on PostgreSQL / S3.
TWINS = {
    "tests.unit.test_queue": "tests.integration.test_queue_postgresql",
    "tests.unit.test_store": "tests.integration.test_store_s3",
    "tests.unit.test_api": "tests.integration.test_api_servers",
}
SERVICE_FIXTURES = {"db_url", "store", "services"}


def test_every_unit_test_that_takes_a_database_or_a_store_has_its_postgresql_or_s3_twin():
    untwinned = {}
    for path in sorted((TESTS / "unit").rglob("test_*.py")):
        name = ".".join(path.relative_to(TESTS.parent).with_suffix("").parts)
        taken = {t for t in twins(importlib.import_module(name), SERVICE_FIXTURES) if t.startswith("test_")}
        if not taken:
            continue
        twin = vars(importlib.import_module(TWINS[name])) if name in TWINS else {}
        if missing := sorted(t for t in taken if t not in twin):
            untwinned[name] = missing
    assert untwinned == {}, (
        "add the module to TWINS with a twin that takes them: globals().update(twins(...))"
    )


@pytest.mark.parametrize("folder", ["api", "worker", "migrations"])
def test_the_services_folders_are_imported_under_the_package_only(folder):
    """One import path: `api` would be a second copy of `warmup.api` (tests/conftest.py refuses it)."""
    with pytest.raises(ModuleNotFoundError, match=r"import warmup\."):
        importlib.import_module(folder)
