"""The test tree: every test file lives in a tier's folder (tests/conftest.py derives its marker from it),
and no two test files share a basename, so a test is found by its file's name alone."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from tests.conftest import TIERS

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
