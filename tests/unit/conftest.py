"""The unit tier runs in this process only: a test that needs a database gets SQLite in a file of its own.

Tests written against `db_url` (tests/fixtures/services.py: SQLite and PostgreSQL) run here on SQLite alone;
their PostgreSQL runs are in tests/integration (test_queue_postgresql.py, test_api_servers.py).
"""

from __future__ import annotations

import pytest


@pytest.fixture(params=["sqlite"])
def db_url(sqlite_url: str) -> str:
    return sqlite_url
