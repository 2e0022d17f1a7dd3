"""The queue's tests of tests/unit/test_queue.py, every one that takes a database, on PostgreSQL (the unit
tier runs them on SQLite). A test added there that takes a database is imported here too."""

from __future__ import annotations

import pytest

from tests.support.twins import twins
from tests.unit import test_queue

# Every test of the unit module that takes `db_url`, with the fixtures it needs (tests/support/twins.py).
globals().update(twins(test_queue, {"db_url"}))


@pytest.fixture(params=["postgresql"])
def db_url(pg_url: str) -> str:
    return pg_url
